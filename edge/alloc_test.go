package edge_test

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
)

// newBareServer builds an edge with the in-memory store and no listener,
// for driving its handler directly.
func newBareServer(tb testing.TB, rules string) (*httpedge.Server, *blockcache.Cache) {
	tb.Helper()
	var o edge.Options
	o.BlockCache.MaxEntries = 1 << 12
	e := edgetest.New(tb, rules, o)
	return e.Server, e.Blocks
}

const allocRules = `
rules:
  - name: roomy
    path_prefix: /allow
    key: ["header:X-API-Key", ip]
    limit: 1000000000
    window: 1m
  - name: tight
    path_prefix: /blocked
    limit: 1
    window: 1m
    action: block
    timeout: 1h
`

func requestCtx(path string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.SetRequestURI("http://api.example.com" + path)
	req.Header.Set("X-API-Key", "key-123")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4242}, nil)
	return ctx
}

// TestHandlerDoesNotAllocate proves the allow path and the blocked path of
// the request handler allocate nothing.
func TestHandlerDoesNotAllocate(t *testing.T) {
	if edgetest.Race {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are checked without -race")
	}
	s, blocks := newBareServer(t, allocRules)
	h := s.Handler()
	for _, tc := range []struct {
		path   string
		status int
	}{{"/allow/x", 200}, {"/blocked/x", 429}} {
		ctx := requestCtx(tc.path)
		for i := 0; i < 3; i++ { // warm up: first decisions, block, buffers
			ctx.Response.Reset()
			h(ctx)
			blocks.Wait() // ristretto applies Sets asynchronously
		}
		if ctx.Response.StatusCode() != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.path, ctx.Response.StatusCode(), tc.status)
		}
		n := testing.AllocsPerRun(1000, func() {
			ctx.Response.Reset()
			h(ctx)
		})
		if n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", tc.path, n)
		}
	}
}

func benchmarkHandler(b *testing.B, path string) {
	s, blocks := newBareServer(b, allocRules)
	h := s.Handler()
	ctx := requestCtx(path)
	for i := 0; i < 3; i++ {
		ctx.Response.Reset()
		h(ctx)
		blocks.Wait()
	}
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		h(ctx)
	}
}

func BenchmarkHandlerAllow(b *testing.B)   { benchmarkHandler(b, "/allow/x") }
func BenchmarkHandlerBlocked(b *testing.B) { benchmarkHandler(b, "/blocked/x") }

// countingAllocRules has a counting rule and the same rule without count,
// both decided by one store round trip (a counting rule's admissions are,
// whatever its mode).
const countingAllocRules = `
rules:
  - name: failed-logins
    path_prefix: /login
    key: ["header:X-API-Key"]
    limit: 1000000000
    window: 1m
    count: {status: [401], cost_header: X-Rate-Cost}
  - name: plain
    key: ["header:X-API-Key"]
    limit: 1000000000
    window: 1m
    mode: sync
`

// The settle path adds no allocation to the request path: a counting
// rule's request, reserved then settled from the response, whether it
// counts (kept), does not (given back) or gives its own units, allocates
// what the same rule's request without count allocates, through the
// fasthttp middleware (the edge's own request path; proxy mode settles
// the same way).
func TestCountingHandlerAllocatesAsItsDecision(t *testing.T) {
	if edgetest.Race {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are checked without -race")
	}
	s, _ := newBareServer(t, countingAllocRules)
	allocs := func(path string, status int, cost string) float64 {
		h := s.Wrap(func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(status)
			if cost != "" {
				ctx.Response.Header.Set("X-Rate-Cost", cost)
			}
		})
		ctx := requestCtx(path)
		for i := 0; i < 3; i++ {
			ctx.Response.Reset()
			h(ctx)
		}
		if ctx.Response.StatusCode() != status {
			t.Fatalf("%s: status %d, want %d", path, ctx.Response.StatusCode(), status)
		}
		return testing.AllocsPerRun(1000, func() {
			ctx.Response.Reset()
			h(ctx)
		})
	}
	base := allocs("/other", 200, "")
	for _, tc := range []struct {
		name   string
		status int
		cost   string
	}{{"counted", 401, ""}, {"given back", 200, ""}, {"origin's units", 401, "3"}, {"origin's zero", 401, "0"}} {
		if n := allocs("/login", tc.status, tc.cost); n > base {
			t.Errorf("%s: %v allocs/op, the same rule without count %v", tc.name, n, base)
		}
	}
}
