package rls_test

import (
	"math"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/shardproxy"
)

// otherCaller is a second Envoy calling the same RLS as h over a
// connection of its own.
func otherCaller(t *testing.T, h *rlsHarness) *rlsHarness {
	t.Helper()
	conn, err := grpc.NewClient(h.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := *h
	c.conn, c.client = conn, rlspb.NewRateLimitServiceClient(conn)
	return &c
}

// oversized is one way a hostile caller asks for more hits than a limit
// of 5 admits in one call: request is the request's hits_addend, own the
// descriptor's (nil: unset).
type oversized struct {
	name    string
	request uint32
	own     *uint64
}

func u64(n uint64) *uint64 { return &n }

var oversizedCalls = []oversized{
	{"request hits_addend 2^32-1", math.MaxUint32, nil},
	{"descriptor hits_addend 2^32-1", 0, u64(math.MaxUint32)},
	{"descriptor hits_addend limit+1", 0, u64(6)},
	{"descriptor hits_addend 2^64-1", 0, u64(math.MaxUint64)},
	// 2^64 − 5 is −5 as a signed store increment, and wraps a count of 5
	// plus it to 0.
	{"descriptor hits_addend 2^64-5", 0, u64(math.MaxUint64 - 4)},
}

func (o oversized) desc(d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	if o.own != nil {
		return withHits(d, *o.own)
	}
	return d
}

// TestRLSOversizedHitsDoNotLockOut has a hostile caller send one call
// whose hits_addend exceeds a limit of 5 per minute on a descriptor it
// shares with another caller, on a fresh counter and on one at its limit:
// the call is answered OVER_LIMIT and counts nothing, so the other
// caller still has all 5 of its window and the limit still holds; and a
// count at the limit is not lowered by a hits_addend that wraps.
func TestRLSOversizedHitsDoNotLockOut(t *testing.T) {
	for _, tc := range []struct {
		ext string
		// shareWait: an async token bucket, whose view admits past this
		// edge's share of the room only once a store reply (real time)
		// says the edge is alone: a call of 4 right after one of 1 may be
		// refused under load, so that step is left out.
		shareWait bool
	}{
		{"algorithm: fixed_window, mode: sync", false}, // envoyproxy/ratelimit's
		{"algorithm: fixed_window, mode: async", false},
		{"algorithm: sliding_window, mode: sync", false},
		{"algorithm: sliding_window, mode: async", false},
		{"algorithm: fixed_window, action: block, timeout: 1h", false},
		{"algorithm: fixed_window, action: throttle", false},
		{"algorithm: token_bucket", true},
		{"algorithm: token_bucket, action: block, timeout: 1h", true},
		{"algorithm: sliding_log, action: block, timeout: 1h", false},
	} {
		t.Run(tc.ext, func(t *testing.T) {
			hostile := startRLS(t, inline("domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5, "+tc.ext+"}\n"),
				rls.Config{}, edge.Options{})
			other := otherCaller(t, hostile)
			lim := func(code rlspb.RateLimitResponse_Code, rem uint32) st {
				return st{code: code, rpu: 5, unit: minute, remaining: rem, reset: 50}
			}
			for _, o := range oversizedCalls {
				t.Run(o.name, func(t *testing.T) {
					fresh := func() *rlcommon.RateLimitDescriptor { return desc("tenant", "fresh "+o.name) }
					checkResp(t, "the hostile call", hostile.ask(t, "shared", o.request, o.desc(fresh())), over, lim(over, 0))
					checkResp(t, "the other caller's first call", other.ask(t, "shared", 0, fresh()), ok, lim(ok, 4))
					if !tc.shareWait {
						checkResp(t, "the other caller's next 4", other.ask(t, "shared", 4, fresh()), ok, lim(ok, 0))
						checkResp(t, "the other caller's 6th", other.ask(t, "shared", 0, fresh()), over, lim(over, 0))
					}

					full := func() *rlcommon.RateLimitDescriptor { return desc("tenant", "full "+o.name) }
					checkResp(t, "the other caller's 5", other.ask(t, "shared", 5, full()), ok, lim(ok, 0))
					checkResp(t, "the hostile call at the limit", hostile.ask(t, "shared", o.request, o.desc(full())), over, lim(over, 0))
					checkResp(t, "the other caller's 6th, after it", other.ask(t, "shared", 0, full()), over, lim(over, 0))
				})
			}
			want := float64(2 * len(oversizedCalls))
			if n := testenv.MetricSum(t, hostile.e.Registry, "poplimit_rls_uncounted_total", "reason", "hits_above_limit"); n != want {
				t.Errorf("poplimit_rls_uncounted_total{reason=hits_above_limit} = %v, want %v", n, want)
			}
		})
	}
}

// TestRLSOversizedHitsOverride is TestRLSOversizedHitsDoNotLockOut for a
// descriptor carrying its own limit (5 per minute): the override rule
// counts for a ceiling far above it, so only the front end's check keeps
// one call from filling the shared counter.
func TestRLSOversizedHitsOverride(t *testing.T) {
	hostile := startRLS(t, fixtures(t, "readme/ex2.yaml"), rls.Config{}, edge.Options{})
	other := otherCaller(t, hostile)
	lim := func(code rlspb.RateLimitResponse_Code, rem uint32) st {
		return st{code: code, rpu: 5, unit: minute, remaining: rem, reset: 50}
	}
	for _, o := range oversizedCalls {
		t.Run(o.name, func(t *testing.T) {
			d := func() *rlcommon.RateLimitDescriptor {
				return withLimit(desc("custom", o.name), 5, typev3.RateLimitUnit_MINUTE)
			}
			checkResp(t, "the hostile call", hostile.ask(t, "messaging", o.request, o.desc(d())), over, lim(over, 0))
			checkResp(t, "the other caller's first call", other.ask(t, "messaging", 0, d()), ok, lim(ok, 4))
			checkResp(t, "the other caller's next 4", other.ask(t, "messaging", 4, d()), ok, lim(ok, 0))
			checkResp(t, "the other caller's 6th", other.ask(t, "messaging", 0, d()), over, lim(over, 0))
		})
	}
}

// TestRLSOversizedHitsTwoEdges runs the hostile caller and the other one
// against two edges sharing real memcached shards, the fleet Envoy sees:
// the hostile call leaves the shared counter as it found it.
func TestRLSOversizedHitsTwoEdges(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	var o edge.Options
	for _, a := range addrs {
		o.Memcache.Servers = append(o.Memcache.Servers, shardproxy.Server{Addr: a})
	}
	o.Limiter.StoreTimeout = time.Second
	files := fixtures(t, "readme/ex2.yaml") // to_number: 100 a day
	o.Clock = newClock(rlsBase)             // both edges on one clock
	hostile := startRLS(t, files, rls.Config{}, o)
	other := startRLS(t, files, rls.Config{}, o)
	lim := func(code rlspb.RateLimitResponse_Code, rem uint32) st {
		return st{code: code, rpu: 100, unit: day, remaining: rem, reset: 57590}
	}
	for _, o := range []oversized{
		{"request hits_addend 2^32-1", math.MaxUint32, nil},
		{"descriptor hits_addend limit+1", 0, u64(101)},
	} {
		t.Run(o.name, func(t *testing.T) {
			d := func() *rlcommon.RateLimitDescriptor { return desc("to_number", o.name) }
			checkResp(t, "the hostile call, edge 1", hostile.ask(t, "messaging", o.request, o.desc(d())), over, lim(over, 0))
			checkResp(t, "the other caller, edge 2", other.ask(t, "messaging", 0, d()), ok, lim(ok, 99))
			checkResp(t, "the other caller's next 99", other.ask(t, "messaging", 99, d()), ok, lim(ok, 0))
			checkResp(t, "the 101st, edge 1", hostile.ask(t, "messaging", 0, d()), over, lim(over, 0))
		})
	}
}

// TestRLSOversizedHitsShadow checks a shadowed limit: the oversized call is
// answered as shadow mode answers a refusal (OK, 0 remaining) and counts
// nothing either.
func TestRLSOversizedHitsShadow(t *testing.T) {
	h := startRLS(t, inline("domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    shadow_mode: true\n"),
		rls.Config{}, edge.Options{})
	lim := func(rem uint32) st { return st{code: ok, rpu: 5, unit: minute, remaining: rem, reset: 50} }
	checkResp(t, "the oversized call", h.ask(t, "s", math.MaxUint32, desc("k", "a")), ok, lim(0))
	checkResp(t, "an ordinary call", h.ask(t, "s", 0, desc("k", "a")), ok, lim(4))
}

// TestRLSZeroLimitCountsNothing checks a limit of 0 (a block list): every
// hit is refused and nothing is counted, so no hits_addend can wrap the
// count into an admission, and a check (hits_addend 0) is OK with 0
// remaining.
func TestRLSZeroLimitCountsNothing(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			h := startRLS(t, inline("domain: z\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 0, mode: "+mode+"}\n"),
				rls.Config{}, edge.Options{})
			lim := func(code rlspb.RateLimitResponse_Code) st { return st{code: code, rpu: 0, unit: second, reset: 1} }
			checkResp(t, "a hit", h.ask(t, "z", 0, desc("ip", "a")), over, lim(over))
			checkResp(t, "hits_addend 2^64-1", h.ask(t, "z", 0, withHits(desc("ip", "a"), math.MaxUint64)), over, lim(over))
			checkResp(t, "hits_addend 2^32-1", h.ask(t, "z", math.MaxUint32, desc("ip", "a")), over, lim(over))
			checkResp(t, "a check", h.ask(t, "z", 0, withHits(desc("ip", "a"), 0)), ok, lim(ok))
			if n := testenv.MetricSum(t, h.e.Registry, "poplimit_rls_uncounted_total", "reason", "zero_limit"); n != 3 {
				t.Errorf("poplimit_rls_uncounted_total{reason=zero_limit} = %v, want 3", n)
			}
			if n := testenv.MetricSum(t, h.e.Registry, "poplimit_rls_uncounted_total", "reason", "hits_above_limit"); n != 0 {
				t.Errorf("poplimit_rls_uncounted_total{reason=hits_above_limit} = %v, want 0", n)
			}
		})
	}
}
