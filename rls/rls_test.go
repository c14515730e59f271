package rls_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
	"github.com/poplimit/poplimit/shardproxy"
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
// files, and serves an RLS with cfg over its core (clock: a fake one at
// rlsBase unless cfg.Now is set).
func startRLS(t testing.TB, files map[string][]byte, cfg rls.Config, o edge.Options) *rlsHarness {
	t.Helper()
	e := edgetest.Start(t, placeholderRules, o)
	if err := e.Core.SetRules(envoyRules(t, files)); err != nil {
		t.Fatalf("SetRules: %v", err)
	}
	return serveRLS(t, e, cfg)
}

func serveRLS(t testing.TB, e *edge.Edge, cfg rls.Config) *rlsHarness {
	t.Helper()
	h := &rlsHarness{e: e}
	if cfg.Now == nil {
		h.clock = newClock(rlsBase)
		cfg.Now = h.clock.Now
	}
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

// TestRLSReadmeExamples runs the cases envoyproxy/ratelimit's README
// describes for its example configurations ("Examples" 1 to 11) against a
// served RLS.
func TestRLSReadmeExamples(t *testing.T) {
	h := startRLS(t, fixtures(t, "readme/ex1.yaml", "readme/ex2.yaml", "readme/ex3.yaml", "readme/ex4b.yaml", "readme/ex5.yaml",
		"readme/ex6.yaml", "readme/ex7.yaml", "readme/ex8.yaml", "readme/ex9b.yaml", "readme/ex10a.yaml", "readme/ex11a.yaml"), rls.Config{}, edge.Options{})

	t.Run("1: 500 per second per database", func(t *testing.T) {
		resp := h.ask(t, "mongo_cps", 500, desc("database", "users"))
		checkResp(t, "500 hits", resp, ok, st{code: ok, rpu: 500, unit: second, remaining: 0, reset: 1})
		checkResp(t, "one more", h.ask(t, "mongo_cps", 0, desc("database", "users")), over, st{code: over, rpu: 500, unit: second, reset: 1})
		checkResp(t, "another database", h.ask(t, "mongo_cps", 0, desc("database", "default")), ok, st{code: ok, rpu: 500, unit: second, remaining: 499, reset: 1})
		checkResp(t, "unconfigured database", h.ask(t, "mongo_cps", 0, desc("database", "orders")), ok, noLimit)
	})
	t.Run("2: nested descriptors, 5 marketing messages a day per number", func(t *testing.T) {
		for i := 1; i <= 5; i++ {
			resp := h.ask(t, "messaging", 0, desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
			checkResp(t, fmt.Sprintf("message %d", i), resp, ok,
				st{code: ok, rpu: 5, unit: day, remaining: uint32(5 - i), reset: 57590},
				st{code: ok, rpu: 100, unit: day, remaining: uint32(100 - i), reset: 57590})
		}
		resp := h.ask(t, "messaging", 0, desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
		checkResp(t, "message 6", resp, over, st{code: over, rpu: 5, unit: day, reset: 57590}, st{code: ok, rpu: 100, unit: day, remaining: 94, reset: 57590})
		resp = h.ask(t, "messaging", 0, desc("message_type", "marketing", "to_number", "2062222222"))
		checkResp(t, "another number", resp, ok, st{code: ok, rpu: 5, unit: day, remaining: 4, reset: 57590})
		checkResp(t, "the placeholder level", h.ask(t, "messaging", 0, desc("message_type", "marketing")), ok, noLimit)
	})
	t.Run("3: 10 per second per IP, one IP blocked", func(t *testing.T) {
		for i := 1; i <= 10; i++ {
			checkResp(t, "a request", h.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "10.0.0.1")), ok,
				st{code: ok, rpu: 10, unit: second, remaining: uint32(10 - i), reset: 1})
		}
		checkResp(t, "the 11th", h.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "10.0.0.1")), over, st{code: over, rpu: 10, unit: second, reset: 1})
		checkResp(t, "another IP", h.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "10.0.0.2")), ok, st{code: ok, rpu: 10, unit: second, remaining: 9, reset: 1})
		checkResp(t, "the blocked IP", h.ask(t, "edge_proxy_per_ip", 0, desc("remote_address", "50.0.0.5")), over, st{code: over, rpu: 0, unit: second, reset: 1})
	})
	t.Run("4: the limit applies to the whole descriptor only", func(t *testing.T) {
		checkResp(t, "both entries", h.ask(t, "example4", 0, desc("key", "value", "subkey", "subvalue")), ok, st{code: ok, rpu: 300, unit: second, remaining: 299, reset: 1})
		checkResp(t, "the first entry", h.ask(t, "example4", 0, desc("key", "value")), ok, noLimit)
	})
	t.Run("5: unlimited", func(t *testing.T) {
		checkResp(t, "ldap", h.ask(t, "internal", 0, desc("ldap", "x"), desc("azure", "x")), ok, unlimited, st{code: ok, rpu: 100, unit: minute, remaining: 99, reset: 50})
	})
	t.Run("6: shadow mode counts and never refuses", func(t *testing.T) {
		resp := h.ask(t, "example6", 11, desc("service", "auth-service", "user", "user-a"))
		checkResp(t, "user-a over, shadowed", resp, ok, st{code: ok, rpu: 10, unit: second, reset: 1})
		resp = h.ask(t, "example6", 21, desc("service", "auth-service", "user", "user-b"))
		checkResp(t, "user-b over", resp, over, st{code: over, rpu: 20, unit: second, reset: 1})
	})
	t.Run("7: replaces", func(t *testing.T) {
		one, two := func() *rlcommon.RateLimitDescriptor { return desc("key_1", "value_1", "user", "bkthomps") },
			func() *rlcommon.RateLimitDescriptor { return desc("key_2", "value_2", "user", "bkthomps") }
		for i := 1; i <= 10; i++ {
			checkResp(t, "both", h.ask(t, "example7", 0, one(), two()), ok, noLimit, st{code: ok, rpu: 10, unit: second, remaining: uint32(10 - i), reset: 1})
		}
		checkResp(t, "the 11th", h.ask(t, "example7", 0, two(), one()), over, st{code: over, rpu: 10, unit: second, reset: 1}, noLimit)
		// The replaced limit counted nothing: alone, it has its 5.
		checkResp(t, "key_1 alone", h.ask(t, "example7", 0, one()), ok, st{code: ok, rpu: 5, unit: second, remaining: 4, reset: 1, name: "specific_limit"})
	})
	t.Run("8: detailed metric descriptors count per value", func(t *testing.T) {
		checkResp(t, "unspecified value", h.ask(t, "example8", 10, desc("key1", "unspecified_value")), ok, st{code: ok, rpu: 10, unit: minute, reset: 50})
		checkResp(t, "another value", h.ask(t, "example8", 0, desc("key1", "unspecified_value2")), ok, st{code: ok, rpu: 10, unit: minute, remaining: 9, reset: 50})
		checkResp(t, "value1", h.ask(t, "example8", 0, desc("key1", "value1")), ok, st{code: ok, rpu: 20, unit: minute, remaining: 19, reset: 50})
	})
	t.Run("9: wildcards, a counter per value", func(t *testing.T) {
		checkResp(t, "123", h.ask(t, "example9", 20, desc("path", "/api/123/action")), ok, st{code: ok, rpu: 20, unit: minute, reset: 50})
		checkResp(t, "123 again", h.ask(t, "example9", 0, desc("path", "/api/123/action")), over, st{code: over, rpu: 20, unit: minute, reset: 50})
		checkResp(t, "user-id", h.ask(t, "example9", 0, desc("path", "/api/user-id/action")), ok, st{code: ok, rpu: 20, unit: minute, remaining: 19, reset: 50})
		checkResp(t, "no match", h.ask(t, "example9", 0, desc("path", "/api/123/other")), ok, noLimit)
	})
	t.Run("10: value_to_metric", func(t *testing.T) {
		checkResp(t, "GET", h.ask(t, "example10", 0, desc("route", "api", "http_method", "GET", "subject_id", "123")), ok, st{code: ok, rpu: 60, unit: minute, remaining: 59, reset: 50})
	})
	t.Run("11: share_threshold", func(t *testing.T) {
		for i, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt"} {
			checkResp(t, v, h.ask(t, "example11", 0, desc("files", v)), ok, st{code: ok, rpu: 10, unit: hour, remaining: uint32(9 - i), reset: 3590})
		}
		for _, v := range []string{"files_no_share/a.pdf", "files_no_share/b.csv"} {
			checkResp(t, v, h.ask(t, "example11", 0, desc("files_no_share", v)), ok, st{code: ok, rpu: 10, unit: hour, remaining: 9, reset: 3590})
		}
	})
}

// TestRLSWindows checks that the counts start again with each aligned
// window, and duration_until_reset counts down to it.
func TestRLSWindows(t *testing.T) {
	h := startRLS(t, fixtures(t, "readme/ex2.yaml"), rls.Config{}, edge.Options{})
	d := func() *rlcommon.RateLimitDescriptor { return desc("message_type", "marketing", "to_number", "1") }
	checkResp(t, "5 at once", h.ask(t, "messaging", 5, d()), ok, st{code: ok, rpu: 5, unit: day, reset: 57590})
	h.clock.Add(57589 * time.Second)
	checkResp(t, "the day's last second", h.ask(t, "messaging", 0, d()), over, st{code: over, rpu: 5, unit: day, reset: 1})
	h.clock.Add(time.Second)
	checkResp(t, "the next day", h.ask(t, "messaging", 0, d()), ok, st{code: ok, rpu: 5, unit: day, remaining: 4, reset: 86400})
}

// TestRLSHitsAddend checks hits_addend at request and descriptor level,
// and 0 at both.
func TestRLSHitsAddend(t *testing.T) {
	h := startRLS(t, inline(`domain: hits
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
`), rls.Config{}, edge.Options{})
	lim := func(code rlspb.RateLimitResponse_Code, rem uint32) st {
		return st{code: code, rpu: 10, unit: minute, remaining: rem, reset: 50}
	}
	checkResp(t, "request hits 0 means 1", h.ask(t, "hits", 0, desc("k", "a")), ok, lim(ok, 9))
	checkResp(t, "request hits 3", h.ask(t, "hits", 3, desc("k", "a")), ok, lim(ok, 6))
	checkResp(t, "descriptor hits 0 checks only", h.ask(t, "hits", 5, withHits(desc("k", "a"), 0)), ok, lim(ok, 6))
	checkResp(t, "descriptor hits 6 beats request hits 1", h.ask(t, "hits", 1, withHits(desc("k", "a"), 6)), ok, lim(ok, 0))
	checkResp(t, "at the limit, a check is OK", h.ask(t, "hits", 0, withHits(desc("k", "a"), 0)), ok, lim(ok, 0))
	checkResp(t, "one more hit", h.ask(t, "hits", 0, desc("k", "a")), over, lim(over, 0))
	checkResp(t, "over, a check is over", h.ask(t, "hits", 0, withHits(desc("k", "a"), 0)), over, lim(over, 0))
	// Per descriptor, in one request.
	resp := h.ask(t, "hits", 2, desc("k", "b"), withHits(desc("k", "c"), 0), withHits(desc("k", "d"), 11))
	checkResp(t, "three descriptors", resp, over, lim(ok, 8), lim(ok, 10), lim(over, 0))
	// Hits above the limit in one call are refused and count nothing.
	checkResp(t, "after 11", h.ask(t, "hits", 0, withHits(desc("k", "d"), 0)), ok, lim(ok, 10))
}

// TestRLSCheckOnly checks what a check-only descriptor (hits_addend 0)
// gets from each algorithm: nothing is counted, and the shared windows
// answer as ratelimit's check does (OVER_LIMIT once the count is above the
// limit); the per-edge algorithms admit a cost of 0 whatever their state
// (window's buckets and log: "n ≤ 0 is allowed").
func TestRLSCheckOnly(t *testing.T) {
	tests := []struct {
		ext       string
		overAfter rlspb.RateLimitResponse_Code // a check after a refused hit
	}{
		{"algorithm: fixed_window, mode: sync", over},
		{"algorithm: fixed_window, mode: async", over},
		{"algorithm: sliding_window, mode: sync", over},
		{"algorithm: sliding_window, mode: async", over},
		// The refused hit was not counted, but the key is in the block
		// cache until its window ends.
		{"algorithm: fixed_window, action: throttle", over},
		{"algorithm: token_bucket", ok},
		{"algorithm: leaky_bucket", ok},
		{"algorithm: sliding_log", ok},
	}
	for _, tt := range tests {
		t.Run(tt.ext, func(t *testing.T) {
			h := startRLS(t, inline("domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3, "+tt.ext+"}\n"), rls.Config{}, edge.Options{})
			check := func() *rlcommon.RateLimitDescriptor { return withHits(desc("k", "a"), 0) }
			lim := func(code rlspb.RateLimitResponse_Code, rem uint32) st {
				return st{code: code, rpu: 3, unit: minute, remaining: rem, reset: 50}
			}
			checkResp(t, "a check of a fresh key", h.ask(t, "c", 0, check()), ok, lim(ok, 3))
			checkResp(t, "3 hits", h.ask(t, "c", 3, desc("k", "a")), ok, lim(ok, 0))
			for i := 0; i < 3; i++ {
				checkResp(t, "a check at the limit", h.ask(t, "c", 0, check()), ok, lim(ok, 0))
			}
			checkResp(t, "a 4th hit", h.ask(t, "c", 0, desc("k", "a")), over, lim(over, 0))
			checkResp(t, "a check after it", h.ask(t, "c", 0, check()), tt.overAfter, lim(tt.overAfter, 0))
		})
	}
}

// TestRLSOverride checks descriptors that carry their own limit.
func TestRLSOverride(t *testing.T) {
	h := startRLS(t, fixtures(t, "readme/ex2.yaml"), rls.Config{}, edge.Options{})
	d := func() *rlcommon.RateLimitDescriptor {
		return withLimit(desc("custom", "x"), 3, typev3.RateLimitUnit_MINUTE)
	}
	for i := 1; i <= 3; i++ {
		checkResp(t, "within", h.ask(t, "messaging", 0, d()), ok, st{code: ok, rpu: 3, unit: minute, remaining: uint32(3 - i), reset: 50})
	}
	checkResp(t, "the 4th", h.ask(t, "messaging", 0, d()), over, st{code: over, rpu: 3, unit: minute, reset: 50})
	// The override wins over the configured limit of the same entries.
	checkResp(t, "override of a configured descriptor", h.ask(t, "messaging", 0, withLimit(desc("to_number", "9"), 1, typev3.RateLimitUnit_HOUR)), ok,
		st{code: ok, rpu: 1, unit: hour, remaining: 0, reset: 3590})
	checkResp(t, "unknown domain", h.ask(t, "nope", 0, withLimit(desc("a", "b"), 1, typev3.RateLimitUnit_SECOND)), ok, noLimit)
	_, err := h.try("messaging", 0, withLimit(desc("a", "b"), 1, typev3.RateLimitUnit_UNKNOWN))
	if status.Code(err) != codes.Unknown || !strings.Contains(fmt.Sprint(err), "unit") {
		t.Errorf("override with unit UNKNOWN: error %v, want UNKNOWN naming the unit", err)
	}
}

// TestRLSUnknown checks unknown domains and descriptors: OK, one status
// per descriptor, nothing counted.
func TestRLSUnknown(t *testing.T) {
	h := startRLS(t, fixtures(t, "readme/ex2.yaml"), rls.Config{}, edge.Options{})
	checkResp(t, "unknown domain", h.ask(t, "nope", 0, desc("to_number", "1"), desc("a", "b")), ok, noLimit, noLimit)
	if resp := h.ask(t, "nope", 0, desc("to_number", "1")); len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("unknown domain: headers %v, want none", resp.ResponseHeadersToAdd)
	}
	checkResp(t, "unknown descriptors", h.ask(t, "messaging", 0, desc("x", "y"), desc(), desc("to_number", "1", "extra", "z")), ok, noLimit, noLimit, noLimit)
	if n := testenv.MetricSum(t, h.e.Registry, "poplimit_rls_unknown_domain_total"); n != 2 {
		t.Errorf("poplimit_rls_unknown_domain_total = %v, want 2", n)
	}
	if n := testenv.MetricSum(t, h.e.Registry, "poplimit_rls_descriptors_total", "result", "no_limit"); n != 6 {
		t.Errorf("poplimit_rls_descriptors_total{result=no_limit} = %v, want 6", n)
	}
}

// TestRLSErrors checks what is answered with an error, with ratelimit's
// texts.
func TestRLSErrors(t *testing.T) {
	h := startRLS(t, fixtures(t, "readme/ex2.yaml"), rls.Config{MaxDescriptors: 2}, edge.Options{})
	tests := []struct {
		name   string
		domain string
		ds     []*rlcommon.RateLimitDescriptor
		text   string
		reason string
	}{
		{"empty domain", "", []*rlcommon.RateLimitDescriptor{desc("a", "b")}, "rate limit domain must not be empty", "empty_domain"},
		{"no descriptors", "messaging", nil, "rate limit descriptor list must not be empty", "no_descriptors"},
		{"too many descriptors", "messaging", []*rlcommon.RateLimitDescriptor{desc("a", "b"), desc("a", "b"), desc("a", "b")}, "too many rate limit descriptors", "too_many_descriptors"},
	}
	for _, tt := range tests {
		_, err := h.try(tt.domain, 0, tt.ds...)
		if s, _ := status.FromError(err); s.Code() != codes.Unknown || s.Message() != tt.text {
			t.Errorf("%s: error %v, want UNKNOWN %q", tt.name, err, tt.text)
		}
		if n := testenv.MetricSum(t, h.e.Registry, "poplimit_rls_errors_total", "reason", tt.reason); n != 1 {
			t.Errorf("%s: poplimit_rls_errors_total{reason=%s} = %v, want 1", tt.name, tt.reason, n)
		}
	}
	// Rules from a poplimit rules file have no descriptor index.
	if err := h.e.Core.SetRules(h.e.Rules()); err != nil {
		t.Fatal(err)
	}
	plain, err := rules.ParseRules([]byte(placeholderRules))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.e.Core.SetRules(plain); err != nil {
		t.Fatal(err)
	}
	if _, err := h.try("messaging", 0, desc("to_number", "1")); status.Convert(err).Message() != "no rate limit configuration loaded" {
		t.Errorf("without envoyproxy/ratelimit rules: error %v, want %q", err, "no rate limit configuration loaded")
	}
}

// TestRLSHeaders checks response_headers_to_add in each mode.
func TestRLSHeaders(t *testing.T) {
	files := inline(`domain: h
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: w
    rate_limit: {window: 90s, requests_per_unit: 7}
`)
	t.Run("draft", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{}, edge.Options{})
		resp := h.ask(t, "h", 0, desc("big", "a"), desc("k", "a"))
		// The descriptor with the least remaining: k (4 of 5 left).
		wantHeaders(t, "allowed", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=4;t=50`})
		resp = h.ask(t, "h", 0, desc("k", "a"), withHits(desc("big", "a"), 10))
		wantHeaders(t, "k still the least", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=3;t=50`})
		resp = h.ask(t, "h", 0, withHits(desc("k", "a"), 4), desc("big", "a"))
		wantHeaders(t, "refused", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=0;t=50`, "Retry-After": "50"})
		if resp.OverallCode != over {
			t.Errorf("refused: overall %v, want OVER_LIMIT", resp.OverallCode)
		}
		resp = h.ask(t, "h", 0, desc("w", "a"))
		wantHeaders(t, "a 90 s window", resp, map[string]string{"RateLimit-Policy": `"h.w";q=7;w=90`, "RateLimit": `"h.w";r=6;t=80`})
		// 1,800,000,010 mod 90 = 10: 80 s left. The window is 90 × SECOND.
		if l := resp.Statuses[0].CurrentLimit; l.Unit != second || l.GetUnitMultiplier().GetValue() != 90 {
			t.Errorf("a 90 s window: current_limit unit %v × %d, want SECOND × 90", l.Unit, l.GetUnitMultiplier().GetValue())
		}
		if resp := h.ask(t, "h", 0, desc("none", "a")); len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("no limit: headers %v, want none", resp.ResponseHeadersToAdd)
		}
	})
	t.Run("ratelimit", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{Headers: rls.HeadersRatelimit}, edge.Options{})
		resp := h.ask(t, "h", 0, desc("k", "a"), desc("big", "a"))
		wantHeaders(t, "allowed", resp, map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "4", "RateLimit-Reset": "50"})
		resp = h.ask(t, "h", 0, desc("big", "a"), withHits(desc("k", "a"), 5))
		wantHeaders(t, "refused", resp, map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "50"})
	})
	t.Run("none", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{Headers: rls.HeadersNone}, edge.Options{})
		if resp := h.ask(t, "h", 9, desc("k", "a")); len(resp.ResponseHeadersToAdd) != 0 || resp.OverallCode != over {
			t.Errorf("none: headers %v, overall %v; want none, OVER_LIMIT", resp.ResponseHeadersToAdd, resp.OverallCode)
		}
	})
	if _, err := rls.New(edgetest.New(t, placeholderRules, edge.Options{}).Core, rls.Config{Headers: "x-ratelimit", MaxDescriptors: -1}, nil, nil); err == nil ||
		!strings.Contains(err.Error(), `Headers "x-ratelimit"`) || !strings.Contains(err.Error(), "MaxDescriptors -1") {
		t.Errorf("NewRLS(bad config) = %v, want both bad fields named with their values", err)
	}
}

func wantHeaders(t *testing.T, what string, resp *rlspb.RateLimitResponse, want map[string]string) {
	t.Helper()
	if len(resp.ResponseHeadersToAdd) != len(want) {
		t.Errorf("%s: headers %v, want %v", what, resp.ResponseHeadersToAdd, want)
	}
	for k, v := range want {
		if got, _ := header(resp, k); got != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

// TestRLSGlobalModes checks the global shadow and quota modes.
func TestRLSGlobalModes(t *testing.T) {
	files := inline(`domain: g
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	t.Run("shadow", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{ShadowMode: true}, edge.Options{})
		resp := h.ask(t, "g", 2, desc("a", "x"))
		checkResp(t, "over, globally shadowed", resp, ok, st{code: over, rpu: 1, unit: minute, reset: 50})
		if _, ok := header(resp, "Retry-After"); ok {
			t.Error("globally shadowed: Retry-After set, want none on an OK answer")
		}
	})
	t.Run("quota descriptor", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{}, edge.Options{})
		checkResp(t, "quota within alone", h.ask(t, "g", 0, desc("q", "x")), ok, st{code: ok, rpu: 1, unit: minute, reset: 50})
		checkResp(t, "quota over alone", h.ask(t, "g", 0, desc("q", "x")), over, st{code: over, rpu: 1, unit: minute, reset: 50})
		checkResp(t, "quota over, another quota within", h.ask(t, "g", 0, desc("q", "x"), desc("q", "y")), ok,
			st{code: over, rpu: 1, unit: minute, reset: 50}, st{code: ok, rpu: 1, unit: minute, reset: 50})
		// Every quota descriptor over: over, whatever the others.
		checkResp(t, "quota over, a rate limit within", h.ask(t, "g", 0, desc("q", "x"), desc("a", "z")), over,
			st{code: over, rpu: 1, unit: minute, reset: 50}, st{code: ok, rpu: 1, unit: minute, reset: 50})
	})
	t.Run("global quota", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{QuotaMode: true}, edge.Options{})
		checkResp(t, "one within", h.ask(t, "g", 0, desc("a", "x")), ok, st{code: ok, rpu: 1, unit: minute, reset: 50})
		checkResp(t, "one over, one within", h.ask(t, "g", 0, desc("a", "x"), desc("a", "y")), ok,
			st{code: over, rpu: 1, unit: minute, reset: 50}, st{code: ok, rpu: 1, unit: minute, reset: 50})
		checkResp(t, "one over, one without a limit", h.ask(t, "g", 0, desc("a", "x"), desc("none", "y")), ok,
			st{code: over, rpu: 1, unit: minute, reset: 50}, noLimit)
		checkResp(t, "all over", h.ask(t, "g", 0, desc("a", "x"), desc("a", "y")), over,
			st{code: over, rpu: 1, unit: minute, reset: 50}, st{code: over, rpu: 1, unit: minute, reset: 50})
	})
}

// TestRLSReload checks that a reload that changes a limit applies to the
// next request, on the counters of the rule it keeps (same name, window
// and algorithm: the same counter identity).
func TestRLSReload(t *testing.T) {
	dir := t.TempDir()
	load := func(rpu int) *rules.Rules {
		t.Helper()
		text := fmt.Sprintf("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		rs, err := envoyconf.LoadPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	e := edgetest.Start(t, placeholderRules, edge.Options{})
	if err := e.Core.SetRules(load(5)); err != nil {
		t.Fatal(err)
	}
	h := serveRLS(t, e, rls.Config{})
	checkResp(t, "3 of 5", h.ask(t, "r", 3, desc("k", "a")), ok, st{code: ok, rpu: 5, unit: minute, remaining: 2, reset: 50})
	if err := e.Core.SetRules(load(10)); err != nil {
		t.Fatal(err)
	}
	checkResp(t, "after the reload to 10", h.ask(t, "r", 0, desc("k", "a")), ok, st{code: ok, rpu: 10, unit: minute, remaining: 6, reset: 50})
	if err := e.Core.SetRules(load(4)); err != nil {
		t.Fatal(err)
	}
	checkResp(t, "after the reload to 4", h.ask(t, "r", 0, desc("k", "a")), over, st{code: over, rpu: 4, unit: minute, reset: 50})
}

// TestRLSHealth checks the health service: SERVING while the edge is
// ready with envoyproxy/ratelimit rules, NOT_SERVING otherwise.
func TestRLSHealth(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	hs := startRLS(t, fixtures(t, "readme/ex1.yaml"), rls.Config{Ready: ready.Load, HealthInterval: 10 * time.Millisecond}, edge.Options{})
	hc := healthpb.NewHealthClient(hs.conn)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: rlspb.RateLimitService_ServiceDesc.ServiceName})
			cancel()
			if err == nil && r.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health = %v, %v; want %v within 5 s", r, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	check(healthpb.HealthCheckResponse_SERVING)
	ready.Store(false)
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	ready.Store(true)
	check(healthpb.HealthCheckResponse_SERVING)
	plain, err := rules.ParseRules([]byte(placeholderRules))
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.e.Core.SetRules(plain); err != nil {
		t.Fatal(err)
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
}

// TestRLSReflection checks that reflection is off unless configured.
func TestRLSReflection(t *testing.T) {
	list := func(h *rlsHarness) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return nil, err // io.EOF: the stream ended, Recv tells why
		}
		r, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range r.GetListServicesResponse().GetService() {
			out = append(out, s.Name)
		}
		return out, nil
	}
	files := fixtures(t, "readme/ex1.yaml")
	if _, err := list(startRLS(t, files, rls.Config{}, edge.Options{})); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection by default: %v, want Unimplemented", err)
	}
	got, err := list(startRLS(t, files, rls.Config{Reflection: true}, edge.Options{}))
	if err != nil || !strings.Contains(strings.Join(got, ","), rlspb.RateLimitService_ServiceDesc.ServiceName) {
		t.Errorf("reflection on: services %v, %v; want the rate limit service listed", got, err)
	}
}

// TestRLSTwoEdgesShareMemcached runs one Envoy fleet (two clients, one per
// edge) against two poplimit edges that share real memcached shards: the
// limit holds across both, exactly, as ratelimit's redis would hold it.
func TestRLSTwoEdgesShareMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	var o edge.Options
	for _, a := range addrs {
		o.Memcache.Servers = append(o.Memcache.Servers, shardproxy.Server{Addr: a})
	}
	o.Limiter.StoreTimeout = time.Second
	files := fixtures(t, "readme/ex2.yaml")
	clock := newClock(rlsBase)
	a := startRLS(t, files, rls.Config{Now: clock.Now}, o)
	b := startRLS(t, files, rls.Config{Now: clock.Now}, o)
	for i := 0; i < 30; i++ {
		h := a
		if i%2 == 1 {
			h = b
		}
		resp := h.ask(t, "messaging", 0, desc("to_number", "5550100"))
		checkResp(t, fmt.Sprintf("request %d", i+1), resp, ok, st{code: ok, rpu: 100, unit: day, remaining: uint32(99 - i), reset: 57590})
	}
	// 100 a day: the 30 requests above are all within; now fill it up.
	resp := a.ask(t, "messaging", 69, desc("to_number", "5550100"))
	checkResp(t, "edge a: the 99th and 100th hits", resp, ok, st{code: ok, rpu: 100, unit: day, remaining: 1, reset: 57590})
	resp = b.ask(t, "messaging", 0, desc("to_number", "5550100"))
	checkResp(t, "edge b: the 100th", resp, ok, st{code: ok, rpu: 100, unit: day, remaining: 0, reset: 57590})
	for _, h := range []*rlsHarness{a, b} {
		checkResp(t, "either edge, the 101st", h.ask(t, "messaging", 0, desc("to_number", "5550100")), over, st{code: over, rpu: 100, unit: day, reset: 57590})
	}
	// The marketing limit, 5 a day, alternating edges: exactly 5.
	allowed := 0
	for i := 0; i < 12; i++ {
		h := a
		if i%2 == 1 {
			h = b
		}
		if h.ask(t, "messaging", 0, desc("message_type", "marketing", "to_number", "5550199")).OverallCode == ok {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("two edges allowed %d marketing messages under 5 a day, want 5", allowed)
	}
}

// TestRLSConcurrent has several Envoy workers call at once, each with its
// own descriptor: every answer must be its own (responses are pooled and
// recycled by the server's codec), and each limit must hold exactly.
func TestRLSConcurrent(t *testing.T) {
	h := startRLS(t, inline(`domain: c
descriptors:
  - key: worker
    rate_limit: {unit: hour, requests_per_unit: 150}
`), rls.Config{}, edge.Options{})
	const workers, calls = 8, 200
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			id := fmt.Sprint("w", w)
			for i := 1; i <= calls; i++ {
				resp, err := h.try("c", 0, desc("worker", id))
				if err != nil {
					errs <- err
					return
				}
				s := resp.Statuses[0]
				wantRem, wantCode := uint32(max(150-i, 0)), ok
				if i > 150 {
					wantCode = over
				}
				if len(resp.Statuses) != 1 || s.Code != wantCode || s.LimitRemaining != wantRem || resp.OverallCode != wantCode {
					errs <- fmt.Errorf("%s call %d: %v remaining %d (overall %v), want %v remaining %d", id, i, s.Code, s.LimitRemaining, resp.OverallCode, wantCode, wantRem)
					return
				}
				if got, want := resp.ResponseHeadersToAdd[1].Value, fmt.Sprintf(`"c.worker";r=%d;t=3590`, wantRem); got != want {
					errs <- fmt.Errorf("%s call %d: RateLimit %q, want %q", id, i, got, want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRLSStopIsGraceful checks that Stop lets a call in flight finish and
// refuses new ones.
func TestRLSStopIsGraceful(t *testing.T) {
	e := edgetest.Start(t, placeholderRules, edge.Options{})
	if err := e.Core.SetRules(envoyRules(t, fixtures(t, "readme/ex1.yaml"))); err != nil {
		t.Fatal(err)
	}
	h := serveRLS(t, e, rls.Config{})
	h.ask(t, "mongo_cps", 0, desc("database", "users"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.rls.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := h.try("mongo_cps", 0, desc("database", "users")); err == nil {
		t.Error("a call after Stop succeeded, want an error")
	}
	if err := h.rls.Stop(ctx); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// rlsBenchRequest is a request as Envoy sends one for an API: the route's
// descriptor and the client's, the second nested.
func rlsBenchRequest() *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("message_type", "marketing", "to_number", "2061111111"),
		desc("to_number", "2061111111"),
	}}
}

// newBareRLS builds an RLS over an edge with the in-memory store (or o's)
// and no listener, for calling the handler directly.
func newBareRLS(tb testing.TB, files map[string][]byte, cfg rls.Config, o ...edge.Options) *rls.Service {
	tb.Helper()
	var opts edge.Options
	if len(o) > 0 {
		opts = o[0]
	}
	e := edgetest.New(tb, placeholderRules, opts)
	if err := e.Core.SetRules(envoyRules(tb, files)); err != nil {
		tb.Fatal(err)
	}
	r, err := rls.New(e.Core, cfg, edgetest.Discard, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// roomyFiles limit by a count no benchmark reaches, counting in the
// local view (mode async, the Limiter's path without a store round trip).
var roomyFiles = inline(`poplimit: {mode: async}
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 4000000000}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 4000000000}
  - key: over
    rate_limit: {unit: day, requests_per_unit: 0}
`)

// syncFiles are roomyFiles in ratelimit's default mode: one store
// increment per descriptor on the request path.
var syncFiles = map[string][]byte{"inline.yaml": []byte(strings.Replace(string(roomyFiles["inline.yaml"]), "mode: async", "mode: sync", 1))}

// TestRLSHandlerDoesNotAllocate proves ShouldRateLimit allocates nothing
// once its pool is warm, when its response is handed back as the gRPC
// codec hands it back: two counted descriptors with the draft headers, a
// refusal with Retry-After, a limit of 0, hits above the limit, an
// unknown domain. (In
// sync mode the Limiter's store call adds its own: see
// BenchmarkRLSHandler/sync.)
func TestRLSHandlerDoesNotAllocate(t *testing.T) {
	if edgetest.Race {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are checked without -race")
	}
	r := newBareRLS(t, roomyFiles, rls.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *rlspb.RateLimitRequest
		code rlspb.RateLimitResponse_Code
	}{
		{"allowed", rlsBenchRequest(), ok},
		// The warm-up call fills the limit; the measured ones are refused.
		{"refused", &rlspb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlcommon.RateLimitDescriptor{withHits(desc("to_number", "full"), 4000000000)}}, over},
		{"limit 0", &rlspb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlcommon.RateLimitDescriptor{desc("over", "x")}}, over},
		{"hits above the limit", &rlspb.RateLimitRequest{Domain: "messaging", Descriptors: []*rlcommon.RateLimitDescriptor{withHits(desc("to_number", "y"), math.MaxUint64)}}, over},
		{"unknown domain", &rlspb.RateLimitRequest{Domain: "nope", Descriptors: []*rlcommon.RateLimitDescriptor{desc("over", "x")}}, ok},
	} {
		var got rlspb.RateLimitResponse_Code
		allocs := testing.AllocsPerRun(1000, func() {
			resp, err := r.ShouldRateLimit(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			got = resp.OverallCode
			r.Release(resp)
		})
		if got != tc.code {
			t.Errorf("%s: overall %v, want %v", tc.name, got, tc.code)
		}
		if allocs != 0 {
			t.Errorf("%s: %v allocations per request, want 0", tc.name, allocs)
		}
	}
}

// BenchmarkRLSHandler calls ShouldRateLimit directly with two counted
// descriptors, handing each response back as the codec does: async
// (the local view), sync (a MemStore increment per descriptor), and sync
// over a real memcached shard (a loopback round trip per descriptor).
func BenchmarkRLSHandler(b *testing.B) {
	for _, bc := range []struct {
		name      string
		files     map[string][]byte
		memcached bool
	}{{"async", roomyFiles, false}, {"sync", syncFiles, false}, {"sync_memcached", syncFiles, true}} {
		b.Run(bc.name, func(b *testing.B) {
			var o edge.Options
			if bc.memcached {
				_, addrs := testenv.Shards(b, 1)
				o.Memcache.Servers = []shardproxy.Server{{Addr: addrs[0]}}
			}
			r := newBareRLS(b, bc.files, rls.Config{}, o)
			req := rlsBenchRequest()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				resp, err := r.ShouldRateLimit(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				r.Release(resp)
			}
		})
	}
}

// BenchmarkRLSGRPC is one ShouldRateLimit call over a loopback gRPC
// connection, client and server in this process: what grpc-go costs
// around the handler.
func BenchmarkRLSGRPC(b *testing.B) {
	e := edgetest.New(b, placeholderRules, edge.Options{})
	if err := e.Core.SetRules(envoyRules(b, roomyFiles)); err != nil {
		b.Fatal(err)
	}
	h := serveRLS(b, e, rls.Config{Now: time.Now})
	req := rlsBenchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.client.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRLSThroughBuild: the service as cmd/edge builds it, from
// envoyproxy/ratelimit files in a -rules directory, with -rls-listen; a
// file changed in the directory is reloaded and its new limit applies.
func TestRLSThroughBuild(t *testing.T) {
	dir := t.TempDir()
	write := func(limit int) {
		cfg := fmt.Sprintf("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", limit)
		os.WriteFile(filepath.Join(dir, "shop.yaml.new"), []byte(cfg), 0o644)
		os.Rename(filepath.Join(dir, "shop.yaml.new"), filepath.Join(dir, "shop.yaml"))
	}
	write(2)
	o := edge.Options{RLSListen: "127.0.0.1:0"}
	o.RulesFile, o.ReloadPoll = dir, 20*time.Millisecond
	e := edgetest.Start(t, "", o)
	conn, err := grpc.NewClient(e.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	ask := func(user string) rlspb.RateLimitResponse_Code {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", user)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		if got := ask("alice"); got != want {
			t.Fatalf("alice, request %d: %v, want %v", i+1, got, want)
		}
	}
	write(5)
	testenv.WaitFor(t, 5*time.Second, "the new limit applied", func() bool { return ask("bob") == rlspb.RateLimitResponse_OK && e.Rules().Rules[0].Limit == 5 })
	if got := ask("alice"); got != rlspb.RateLimitResponse_OK {
		t.Errorf("alice under the raised limit: %v, want OK", got)
	}
}
