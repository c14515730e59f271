package edge_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
)

func tlsClient(cert *x509.Certificate, maxVersion uint16) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: maxVersion}, DisableKeepAlives: true}}
}

// TestTLSListener serves the traffic listener over TLS, refuses TLS 1.1,
// swaps in a new certificate when the files change, and keeps the old one
// when the new files do not load.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, first := testenv.WriteCert(t, dir, "first")
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{TLSCert: certFile, TLSKey: keyFile}, reloadPoll: 20 * time.Millisecond})
	url := "https://" + e.addr + "/check/x"
	resp, err := tlsClient(first, 0).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "first" {
		t.Fatalf("over TLS: %d %v", resp.StatusCode, resp.TLS)
	}
	if _, err := tlsClient(first, tls.VersionTLS11).Get(url); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
	// A new pair is picked up by the watcher; the old connection's
	// clients keep working (no restart).
	_, _, second := testenv.WriteCert(t, dir, "second")
	testenv.WaitFor(t, 5*time.Second, "the new certificate served", func() bool {
		resp, err := tlsClient(second, 0).Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName == "second"
	})
	// A broken pair is refused and counted; the running one stays.
	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	testenv.WaitFor(t, 5*time.Second, "the bad reload counted", func() bool {
		return testenv.MetricSum(t, e.reg, "poplimit_edge_tls_reloads_total", "result", "rejected") >= 1
	})
	resp, err = tlsClient(second, 0).Get("https://" + e.addr + "/check/y")
	if err != nil {
		t.Fatalf("after a bad reload: %v", err)
	}
	resp.Body.Close()
	if resp.TLS.PeerCertificates[0].Subject.CommonName != "second" {
		t.Errorf("after a bad reload the certificate is %q, want the running one", resp.TLS.PeerCertificates[0].Subject.CommonName)
	}
	if err := e.srv.TLSPair().Reload(); err == nil {
		t.Error("Reload of a bad key: want an error")
	}
}

func TestTLSConfigRejected(t *testing.T) {
	dir := t.TempDir()
	certFile, _, _ := testenv.WriteCert(t, dir, "x")
	for _, cfg := range []httpedge.Config{{TLSCert: certFile}, {TLSCert: certFile, TLSKey: filepath.Join(dir, "missing.pem")}} {
		o := edge.Options{Server: cfg}
		if _, err := edge.Build(o); err == nil {
			t.Errorf("Build with %+v: want an error", cfg)
		}
	}
}

// rlsServed asks the rate limit service's health service once over conn
// and returns the name of the certificate its connection was handshaken
// with.
func rlsServed(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return "", nil
	}
	return info.State.PeerCertificates[0].Subject.CommonName, nil
}

func rlsDial(t *testing.T, addr string, trusted ...*x509.Certificate) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range trusted {
		pool.AddCert(c)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// The rate limit service's certificate (rls.Config.TLSCert, TLSKey) is
// reloaded when its files are written over, as the traffic listener's is:
// new connections get the new pair, a connection made before keeps
// working, a pair that does not load keeps the running one and is counted;
// once the edge is closed its watcher no longer reloads.
func TestRLSTLSReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, first := testenv.WriteCert(t, dir, "first")
	o := edge.Options{RLSListen: "127.0.0.1:0", RLS: rls.Config{TLSCert: certFile, TLSKey: keyFile}, ReloadPoll: 20 * time.Millisecond}
	o.Listen, o.Admin = "127.0.0.1:0", "127.0.0.1:0"
	e := edgetest.New(t, threePerMinute, o)
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(context.Background()) }()
	closed := false
	closeEdge := func() {
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Close(ctx)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return within 10 s of Close")
		}
	}
	defer func() {
		if !closed {
			closeEdge()
		}
	}()
	old := rlsDial(t, e.RLSAddr(), first)
	defer old.Close()
	if name, err := rlsServed(old); err != nil || name != "first" {
		t.Fatalf("at start: certificate %q, %v; want first", name, err)
	}
	_, _, second := testenv.WriteCert(t, dir, "second")
	testenv.WaitFor(t, 10*time.Second, "the new certificate served to a new connection", func() bool {
		conn := rlsDial(t, e.RLSAddr(), first, second)
		defer conn.Close()
		name, _ := rlsServed(conn)
		return name == "second"
	})
	if name, err := rlsServed(old); err != nil || name != "first" {
		t.Errorf("the connection made before: certificate %q, %v; want it answering, still first", name, err)
	}
	const metric = "poplimit_rls_tls_reloads_total"
	rejected := testenv.MetricSum(t, e.Registry, metric, "result", "rejected")
	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	testenv.WaitFor(t, 10*time.Second, "the bad pair counted", func() bool {
		return testenv.MetricSum(t, e.Registry, metric, "result", "rejected") > rejected
	})
	conn := rlsDial(t, e.RLSAddr(), second)
	if name, err := rlsServed(conn); err != nil || name != "second" {
		t.Errorf("after a pair that does not load: certificate %q, %v; want the running one, second", name, err)
	}
	conn.Close()
	// Closed, the edge reloads nothing more: its watcher stopped with it.
	closeEdge()
	applied := testenv.MetricSum(t, e.Registry, metric, "result", "applied")
	testenv.WriteCert(t, dir, "third")
	time.Sleep(200 * time.Millisecond) // ten polls
	if got := testenv.MetricSum(t, e.Registry, metric, "result", "applied"); got != applied {
		t.Errorf("after Close the pair was reloaded (%v applied, %v before): the watcher outlived the edge", got, applied)
	}
}
