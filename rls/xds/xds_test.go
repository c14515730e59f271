package xds_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls/xds"
	"github.com/poplimit/poplimit/rls/xds/xdstest"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// The resources convert to files that envoyconf loads to the same
// descriptors: values YAML would read as something else stay strings,
// nesting, unlimited, shadow_mode, replaces and names carry over.
func TestFilesLoadAsTheConfigSays(t *testing.T) {
	tricky := []string{"yes", "no", "on", "off", "y", "n", "1", "0x10", "1e3", "~", "null", "true", "a: b", "#x", "- x", "*", "a*", "", " lead", "multi\nline", "é"}
	var ds []*rlsconf.RateLimitDescriptor
	for i, v := range tricky {
		if v == "" {
			continue
		}
		ds = append(ds, &rlsconf.RateLimitDescriptor{Key: "k", Value: v,
			RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: uint32(i + 1), Unit: rlsconf.RateLimitUnit_MINUTE}})
	}
	ds = append(ds,
		&rlsconf.RateLimitDescriptor{Key: "outer", Value: "o", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "inner", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 7, Unit: rlsconf.RateLimitUnit_HOUR, Name: "inner-limit"}, ShadowMode: true},
		}},
		&rlsconf.RateLimitDescriptor{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		&rlsconf.RateLimitDescriptor{Key: "r", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1, Unit: rlsconf.RateLimitUnit_DAY,
			Replaces: []*rlsconf.RateLimitReplace{{Name: "inner-limit"}}}},
	)
	a, err := anypb.New(&rlsconf.RateLimitConfig{Name: "cfg", Domain: "dom", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	files, err := xds.Files([]*anypb.Any{a})
	if err != nil {
		t.Fatal(err)
	}
	c, err := envoyconf.Load(files)
	if err != nil {
		t.Fatalf("%v\n%s", err, files["cfg"])
	}
	for i, v := range tricky {
		if v == "" {
			continue
		}
		m := c.Lookup("dom", []rules.DescriptorEntry{{Key: "k", Value: v}})
		if !m.Found() || m.Limit.RequestsPerUnit != uint32(i+1) || m.Limit.Unit != envoyconf.Minute {
			t.Errorf("k=%q: found %v limit %+v, want %d per minute\n%s", v, m.Found(), m.Limit, i+1, files["cfg"])
		}
	}
	m := c.Lookup("dom", []rules.DescriptorEntry{{Key: "outer", Value: "o"}, {Key: "inner", Value: "any"}})
	if !m.Found() || m.Limit.RequestsPerUnit != 7 || !m.Limit.ShadowMode || m.Limit.Name != "inner-limit" {
		t.Errorf("outer=o, inner: %+v, want 7 per hour in shadow mode named inner-limit", m.Limit)
	}
	if m := c.Lookup("dom", []rules.DescriptorEntry{{Key: "free", Value: "x"}}); !m.Found() || !m.Limit.Unlimited {
		t.Errorf("free: %+v, want unlimited", m.Limit)
	}
	if m := c.Lookup("dom", []rules.DescriptorEntry{{Key: "r", Value: "x"}}); !m.Found() || len(m.Limit.Replaces) != 1 {
		t.Errorf("r: %+v, want it to replace inner-limit", m.Limit)
	}
}

// Resources that are not RateLimitConfigs, or two of one name, are refused
// naming the resource; an unnamed one is named by its index.
func TestFilesRefuses(t *testing.T) {
	one, _ := anypb.New(xdstest.Config("a", "d"))
	other, _ := anypb.New(&rlsconf.RateLimitPolicy{})
	unnamed, _ := anypb.New(xdstest.Config("", "d2", xdstest.Limit("k", "", 1, rlsconf.RateLimitUnit_SECOND)))
	for _, tc := range []struct {
		res  []*anypb.Any
		want string
	}{
		{[]*anypb.Any{one, other}, "resource[1]: type"},
		{[]*anypb.Any{one, one}, `resource[1]: name "a": two resources of one name`},
	} {
		if _, err := xds.Files(tc.res); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Files: %v, want an error containing %q", err, tc.want)
		}
	}
	files, err := xds.Files([]*anypb.Any{unnamed})
	if err != nil || files["resource[0]"] == nil {
		t.Errorf("unnamed resource: %v %v, want it named resource[0]", files, err)
	}
}

func TestParseMetadata(t *testing.T) {
	m, err := xds.ParseMetadata("zone=eu-1, role=rls,expr=a=b")
	if err != nil || len(m) != 3 || m["zone"] != "eu-1" || m["role"] != "rls" || m["expr"] != "a=b" {
		t.Errorf("ParseMetadata: %v %v", m, err)
	}
	if got := xds.FormatMetadata(m); got != "expr=a=b,role=rls,zone=eu-1" {
		t.Errorf("FormatMetadata: %q", got)
	}
	if m, err := xds.ParseMetadata(""); err != nil || len(m) != 0 {
		t.Errorf("empty: %v %v", m, err)
	}
	if _, err := xds.ParseMetadata("zone=a,oops"); err == nil || !strings.Contains(err.Error(), `entry 2 "oops": want key=value`) {
		t.Errorf("entry without '=': %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  xds.Config
		want string
	}{
		{xds.Config{Server: "127.0.0.1:18000"}, ""},
		{xds.Config{Server: "localhost"}, `Server: "localhost": want host:port`},
		{xds.Config{Server: "h:1", BackoffInitial: time.Second, BackoffMax: time.Millisecond}, "BackoffMax: 1ms: less than BackoffInitial"},
		{xds.Config{Server: "h:1", CertFile: "c.pem"}, "CertFile and KeyFile"},
		{xds.Config{Server: "h:1", CAFile: "/nonexistent/ca.pem"}, "CAFile: open /nonexistent/ca.pem"},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// recorder is an ApplyFunc that keeps what it applied and refuses what
// refuse says.
type recorder struct {
	mu       sync.Mutex
	versions []string
	refuse   func(files map[string][]byte) error
}

func (r *recorder) apply(version string, files map[string][]byte) error {
	if r.refuse != nil {
		if err := r.refuse(files); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.versions = append(r.versions, version)
	return nil
}

func (r *recorder) applied() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.versions...)
}

func run(t *testing.T, cfg xds.Config, r *recorder, reg prometheus.Registerer) *xds.Subscriber {
	t.Helper()
	s, err := xds.New(cfg, r.apply, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// Over TLS: the server's certificate is verified with the CA file, the
// client presents its certificate; without the CA, nothing is applied.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := testenv.WriteCert(t, filepath.Join(mkdir(t, dir, "server")), "xds-server")
	clientCert, clientKey, _ := testenv.WriteCert(t, filepath.Join(mkdir(t, dir, "client")), "poplimit-edge")
	sc, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var presented []string
	tc := &tls.Config{Certificates: []tls.Certificate{sc}, ClientAuth: tls.RequestClientCert}
	srv := xdstest.Start(t, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(tc)),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if p, ok := peer.FromContext(ss.Context()); ok {
				if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
					mu.Lock()
					presented = append(presented, ti.State.PeerCertificates[0].Subject.CommonName)
					mu.Unlock()
				}
			}
			return h(srv, ss)
		}))
	srv.Push(t, "n", "1", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 1, rlsconf.RateLimitUnit_HOUR)))

	untrusted := &recorder{}
	run(t, xds.Config{Server: srv.Addr, NodeID: "n", TLS: true, BackoffInitial: 20 * time.Millisecond}, untrusted, nil)
	r := &recorder{}
	s := run(t, xds.Config{Server: srv.Addr, NodeID: "n", CAFile: certFile, CertFile: clientCert, KeyFile: clientKey,
		ServerName: "127.0.0.1", BackoffInitial: 20 * time.Millisecond}, r, nil)
	select {
	case <-s.Applied():
	case <-time.After(10 * time.Second):
		t.Fatal("nothing applied over TLS within 10 s")
	}
	mu.Lock()
	if len(presented) == 0 || presented[0] != "poplimit-edge" {
		t.Errorf("client certificates the server saw: %v, want poplimit-edge", presented)
	}
	mu.Unlock()
	if got := untrusted.applied(); len(got) != 0 {
		t.Errorf("a subscriber without the CA applied %v", got)
	}
}

func mkdir(t *testing.T, dir, name string) string {
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// A response the ApplyFunc refuses is NACKed once, counted once, and the
// one in force stays, although the snapshot cache sends it back after each
// NACK; the pause between repeated NACKs keeps the exchange slow.
func TestRepeatedNACKIsPaced(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Push(t, "n", "good", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 1, rlsconf.RateLimitUnit_HOUR)))
	r := &recorder{refuse: func(files map[string][]byte) error {
		if strings.Contains(string(files["rl"]), "bad") {
			return errors.New("descriptor bad: refused")
		}
		return nil
	}}
	reg := prometheus.NewRegistry()
	s := run(t, xds.Config{Server: srv.Addr, NodeID: "n", BackoffInitial: 20 * time.Millisecond}, r, reg)
	<-s.Applied()
	srv.Push(t, "n", "broken", xdstest.Config("rl", "d", xdstest.Limit("k", "bad", 1, rlsconf.RateLimitUnit_HOUR)))
	testenv.WaitFor(t, 10*time.Second, "a NACK", func() bool { return len(srv.NACKs()) > 0 })
	time.Sleep(time.Second) // let the server send it back a few times
	nacks := srv.NACKs()
	if n := len(nacks); n > 1+int(time.Second/xds.RepeatNACKDelay)+2 {
		t.Errorf("%d NACKs within about a second: the repeats are not paced", n)
	}
	for _, n := range nacks {
		if n.GetVersionInfo() != "good" || n.GetErrorDetail().GetMessage() != "descriptor bad: refused" {
			t.Errorf("NACK version %q detail %q, want good and the ApplyFunc's error", n.GetVersionInfo(), n.GetErrorDetail().GetMessage())
		}
	}
	if got := r.applied(); len(got) != 1 || got[0] != "good" || s.Version() != "good" {
		t.Errorf("applied %v, version %q; want only good", got, s.Version())
	}
	if n := testenv.MetricSum(t, reg, "poplimit_xds_configs_total", "result", "rejected"); n != 1 {
		t.Errorf("rejected counted %v times, want once", n)
	}
	t.Logf("%d NACKs of one bad response in about a second", len(nacks))
}
