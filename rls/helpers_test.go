package rls_test

import (
	"context"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// rlsBase is the time every RLS test starts at unless it moves its clock:
// 10 s past a whole hour (1,800,000,000 is a multiple of 3,600) and 28,810 s
// into its day, so resets are 1 s, 50 s, 3,590 s and 57,590 s.
var rlsBase = time.Unix(1_800_000_010, 0)

// placeholderRules is the poplimit rules file the edges start with before
// the RLS tests swap in envoyproxy/ratelimit's files.
const placeholderRules = "rules: [{name: placeholder, limit: 1, window: 1s}]"

type fakeClock struct{ ns atomic.Int64 }

func newClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// rlsHarness is one edge with an RLS over its core, served on a loopback
// port, and a client of it.
type rlsHarness struct {
	e      *edge.Edge
	rls    *rls.Service
	client rlspb.RateLimitServiceClient
	conn   *grpc.ClientConn
	clock  *fakeClock
}

// fixtures reads envoyconf's testdata files by path.
func fixtures(t testing.TB, paths ...string) map[string][]byte {
	t.Helper()
	files := make(map[string][]byte, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join("..", "rules", "envoyconf", "testdata", p))
		if err != nil {
			t.Fatal(err)
		}
		files[p] = b
	}
	return files
}

func inline(text string) map[string][]byte { return map[string][]byte{"inline.yaml": []byte(text)} }

// envoyRules loads envoyproxy/ratelimit files as the edge's loader will.
func envoyRules(t testing.TB, files map[string][]byte) *rules.Rules {
	t.Helper()
	rs, err := envoyconf.LoadRules(files)
	if err != nil {
		t.Fatalf("envoyconf.LoadRules: %v", err)
	}
	return rs
}

// startRLS starts an edge (options o), swaps in the envoyproxy/ratelimit
// files, and serves an RLS with cfg over its core (the edge's clock, and
// so the service's: a fake one at rlsBase unless o.Clock is set).
func startRLS(t testing.TB, files map[string][]byte, cfg rls.Config, o edge.Options) *rlsHarness {
	t.Helper()
	if o.Clock == nil {
		o.Clock = newClock(rlsBase)
	}
	e := edgetest.Start(t, placeholderRules, o)
	if err := e.Core.SetRules(envoyRules(t, files)); err != nil {
		t.Fatalf("SetRules: %v", err)
	}
	return serveRLS(t, e, cfg)
}

func serveRLS(t testing.TB, e *edge.Edge, cfg rls.Config) *rlsHarness {
	t.Helper()
	h := &rlsHarness{e: e}
	h.clock, _ = e.Options.Clock.(*fakeClock) // nil: the system clock
	var err error
	if h.rls, err = rls.New(e.Core, cfg, edgetest.Discard, e.Registry); err != nil {
		t.Fatalf("NewRLS: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.rls.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.rls.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return within 5 s of Stop")
		}
	})
	if h.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	h.client = rlspb.NewRateLimitServiceClient(h.conn)
	return h
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// withLimit sets a descriptor's own limit.
func withLimit(d *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func (h *rlsHarness) ask(t testing.TB, domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := h.try(domain, hits, ds...)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s, %v): %v", domain, ds, err)
	}
	return resp
}

func (h *rlsHarness) try(domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) (*rlspb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.client.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
}

// st is an expected descriptor status. rpu < 0: no current_limit.
type st struct {
	code      rlspb.RateLimitResponse_Code
	rpu       int64
	unit      rlspb.RateLimitResponse_RateLimit_Unit
	remaining uint32
	reset     int64 // seconds; checked when rpu >= 0
	name      string
}

var (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

// noLimit is the status of a descriptor without a limit; unlimited that of
// an unlimited one.
var (
	noLimit   = st{code: rlspb.RateLimitResponse_OK, rpu: -1}
	unlimited = st{code: rlspb.RateLimitResponse_OK, rpu: -1, remaining: math.MaxUint32}
)

func checkResp(t testing.TB, what string, resp *rlspb.RateLimitResponse, overall rlspb.RateLimitResponse_Code, want ...st) {
	t.Helper()
	if resp.OverallCode != overall {
		t.Errorf("%s: overall_code = %v, want %v", what, resp.OverallCode, overall)
	}
	if len(resp.Statuses) != len(want) {
		t.Fatalf("%s: %d statuses, want %d", what, len(resp.Statuses), len(want))
	}
	for i, w := range want {
		s := resp.Statuses[i]
		if s.Code != w.code || s.LimitRemaining != w.remaining {
			t.Errorf("%s: status %d = %v remaining %d, want %v remaining %d", what, i, s.Code, s.LimitRemaining, w.code, w.remaining)
		}
		if w.rpu < 0 {
			if s.CurrentLimit != nil || s.DurationUntilReset != nil {
				t.Errorf("%s: status %d: current_limit %v, duration_until_reset %v; want neither", what, i, s.CurrentLimit, s.DurationUntilReset)
			}
			continue
		}
		l := s.CurrentLimit
		if l == nil {
			t.Errorf("%s: status %d: no current_limit, want %d per %v", what, i, w.rpu, w.unit)
			continue
		}
		if int64(l.RequestsPerUnit) != w.rpu || l.Unit != w.unit || l.Name != w.name {
			t.Errorf("%s: status %d: current_limit %d per %v named %q, want %d per %v named %q", what, i, l.RequestsPerUnit, l.Unit, l.Name, w.rpu, w.unit, w.name)
		}
		if got := s.DurationUntilReset.AsDuration(); got != time.Duration(w.reset)*time.Second {
			t.Errorf("%s: status %d: duration_until_reset %v, want %ds", what, i, got, w.reset)
		}
	}
}

func header(resp *rlspb.RateLimitResponse, name string) (string, bool) {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value, true
		}
	}
	return "", false
}

const (
	second = rlspb.RateLimitResponse_RateLimit_SECOND
	minute = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour   = rlspb.RateLimitResponse_RateLimit_HOUR
	day    = rlspb.RateLimitResponse_RateLimit_DAY
)
