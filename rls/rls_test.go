package rls_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rules"
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
			// The limiter reads the edge's clock too: a bucket's edge learns
			// it is alone on the key only as that clock moves on past the
			// first read's reply (window's unsure time), never within one
			// frozen instant. Once the reply has landed, step half a second
			// (the resets stay whole seconds away).
			waitStoreOps(t, h, 1)
			h.clock.Add(500 * time.Millisecond)
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

// waitStoreOps waits, 10 s at most, until h's limiter has sent n store
// operations and folded their replies in
// (poplimit_window_store_ops_total counts them after).
func waitStoreOps(t *testing.T, h *rlsHarness, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mfs, err := h.e.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "poplimit_window_store_ops_total" && mf.GetMetric()[0].GetCounter().GetValue() >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the limiter sent fewer than %v store operations in 10 s", n)
		}
		time.Sleep(time.Millisecond)
	}
}
