package rls_test

import (
	"context"
	"math"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/shardproxy"
)

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
	h := serveRLS(b, e, rls.Config{})
	req := rlsBenchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.client.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
