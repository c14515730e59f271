package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// stepClock is a clock a test sets: every part of an edge reads it.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// renderBase is 10 s into a minute: a 1-minute fixed window resets in 50 s.
var renderBase = time.Unix(1_800_000_010, 0)

// The one rule every front end decides: HTTP front ends by the rules file,
// the rate limit service by the envoyproxy/ratelimit file, which names its
// rule domain.key.
const (
	renderRules = `
rules:
  - name: h.k
    key: ["header:X-K"]
    algorithm: fixed_window
    limit: 2
    window: 1m
`
	renderEnvoy = "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	renderToken = "render-test-token-0123456789"
)

// refusal is what a front end answered to one refused request.
type refusal struct {
	status                     int
	policy, rateLimit          string
	xLimit, xRemaining, xReset string
	retryAfter                 string
	contentType                string
	body                       []byte
}

// frontEnd asks one front end of an edge for the rule's key once.
type frontEnd struct {
	name  string
	ask   func() refusal
	rls   bool // the rate limit service: quota fields and Retry-After only
	jsonB bool // the decision endpoint: its own JSON body
}

// TestEveryFrontEndRendersTheSameRefusal asks each front end (the fasthttp
// server in decision and proxy mode, the decision endpoint, the rate limit
// service and the net/http middleware) for the same rule and key past its
// limit, on one stepped clock, and checks they render the same refusal:
// status, quota fields as of that clock, Retry-After from the release plus
// at most the jitter (spread: the jitter reaches each of them), and the
// same problem body.
func TestEveryFrontEndRendersTheSameRefusal(t *testing.T) {
	const n = 30 // refusals per front end: 3^-29 that 3 jittered values agree
	reset := strconv.FormatInt(renderBase.Truncate(time.Minute).Add(time.Minute).Unix(), 10)
	build := func(o edge.Options) *edge.Edge {
		clock := new(stepClock)
		clock.ns.Store(renderBase.UnixNano())
		o.Clock, o.RetryJitter = clock, 2*time.Second
		o.Server.DecideToken = renderToken
		return edgetest.New(t, renderRules, o)
	}
	fast := func(e *edge.Edge, path string, body []byte, hdr ...string) refusal {
		var req fasthttp.Request
		req.SetRequestURI("http://api.example.com" + path)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		if body != nil {
			req.Header.SetMethod("POST")
			req.SetBody(body)
		}
		ctx := &fasthttp.RequestCtx{}
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4242}, nil)
		e.Server.Handler()(ctx)
		// The fields as the wire has them, under any case.
		var wire bytes.Buffer
		ctx.Response.Header.WriteTo(&wire)
		hr, err := http.ReadResponse(bufio.NewReader(&wire), nil)
		if err != nil {
			t.Fatalf("%s: response head %q: %v", path, wire.String(), err)
		}
		h := hr.Header
		return refusal{status: ctx.Response.StatusCode(), policy: h.Get("RateLimit-Policy"), rateLimit: h.Get("RateLimit"),
			xLimit: h.Get("X-RateLimit-Limit"), xRemaining: h.Get("X-RateLimit-Remaining"), xReset: h.Get("X-RateLimit-Reset"),
			retryAfter: h.Get("Retry-After"), contentType: h.Get("Content-Type"), body: append([]byte(nil), ctx.Response.Body()...)}
	}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer origin.Close()

	var frontEnds []frontEnd
	{
		e := build(edge.Options{})
		frontEnds = append(frontEnds, frontEnd{name: "fasthttp decision mode", ask: func() refusal { return fast(e, "/x", nil, "X-K", "a") }})
	}
	{
		var o edge.Options
		o.Server.Mode, o.Server.Upstream = httpedge.Proxy, origin.Listener.Addr().String()
		o.Server.DecideToken = ""
		e := build(o)
		frontEnds = append(frontEnds, frontEnd{name: "fasthttp proxy mode", ask: func() refusal { return fast(e, "/x", nil, "X-K", "a") }})
	}
	{
		e := build(edge.Options{})
		frontEnds = append(frontEnds, frontEnd{name: "decision endpoint", jsonB: true, ask: func() refusal {
			return fast(e, "/_poplimit/decide", []byte(`{"rule":"h.k","key":"a"}`), "Authorization", "Bearer "+renderToken)
		}})
	}
	{
		e := build(edge.Options{RLSListen: "127.0.0.1:0"})
		rs, err := envoyconf.LoadRules(map[string][]byte{"h.yaml": []byte(renderEnvoy)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Core.SetRules(rs); err != nil {
			t.Fatal(err)
		}
		frontEnds = append(frontEnds, frontEnd{name: "rate limit service", rls: true, ask: func() refusal {
			resp, err := e.RLS.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "h",
				Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "a"}}}}})
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			r := refusal{status: 200}
			if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
				r.status = 429
			}
			for _, h := range resp.ResponseHeadersToAdd {
				switch h.Key {
				case "RateLimit-Policy":
					r.policy = h.Value
				case "RateLimit":
					r.rateLimit = h.Value
				case "Retry-After":
					r.retryAfter = h.Value
				}
			}
			return r
		}})
	}
	{
		e := build(edge.Options{})
		mw := e.NetHTTP()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		frontEnds = append(frontEnds, frontEnd{name: "net/http middleware", ask: func() refusal {
			req := httptest.NewRequest("GET", "http://api.example.com/x", nil)
			req.RemoteAddr = "198.51.100.7:4242"
			req.Header.Set("X-K", "a")
			w := httptest.NewRecorder()
			mw.ServeHTTP(w, req)
			h := w.Result().Header
			return refusal{status: w.Code, policy: h.Get("RateLimit-Policy"), rateLimit: h.Get("RateLimit"),
				xLimit: h.Get("X-RateLimit-Limit"), xRemaining: h.Get("X-RateLimit-Remaining"), xReset: h.Get("X-RateLimit-Reset"),
				retryAfter: h.Get("Retry-After"), contentType: h.Get("Content-Type"), body: w.Body.Bytes()}
		}})
	}

	for _, fe := range frontEnds {
		t.Run(fe.name, func(t *testing.T) {
			for i := 0; i < 2; i++ {
				if r := fe.ask(); r.status != 200 {
					t.Fatalf("request %d: status %d, want 200 (within the limit)", i+1, r.status)
				}
			}
			seen := map[int64]bool{}
			for i := 0; i < n; i++ {
				r := fe.ask()
				if r.status != 429 {
					t.Fatalf("refusal %d: status %d, want 429", i+1, r.status)
				}
				if r.policy != `"h.k";q=2;w=60` || r.rateLimit != `"h.k";r=0;t=50` {
					t.Errorf("refusal %d: RateLimit-Policy %q, RateLimit %q; want %q, %q (as of the edge's clock)",
						i+1, r.policy, r.rateLimit, `"h.k";q=2;w=60`, `"h.k";r=0;t=50`)
				}
				ra, err := strconv.ParseInt(r.retryAfter, 10, 64)
				if err != nil || ra < 50 || ra > 52 {
					t.Fatalf("refusal %d: Retry-After %q, want 50 to 52 (the release, plus at most the 2 s jitter)", i+1, r.retryAfter)
				}
				seen[ra] = true
				if fe.rls {
					continue
				}
				if r.xLimit != "2" || r.xRemaining != "0" || r.xReset != reset {
					t.Errorf("refusal %d: X-RateLimit-Limit/-Remaining/-Reset %q/%q/%q, want 2/0/%s", i+1, r.xLimit, r.xRemaining, r.xReset, reset)
				}
				if fe.jsonB {
					var d httpedge.DecideResponse
					if err := json.Unmarshal(r.body, &d); err != nil || d.Allowed || d.RetryMillis != 50000 {
						t.Errorf("refusal %d: body %s, want the decision refused, retry_after_ms 50000", i+1, r.body)
					}
					continue
				}
				want := `{"type":"https://poplimit.dev/problems/rate-limited","title":"Too Many Requests","status":429,` +
					`"detail":"rate limit h.k exceeded: at most 2 per 60 s","policy":"h.k","limit":2,"retry_after":` + r.retryAfter + `}`
				if r.contentType != decision.ContentTypeProblem || string(r.body) != want {
					t.Errorf("refusal %d: %s %s, want %s %s", i+1, r.contentType, r.body, decision.ContentTypeProblem, want)
				}
			}
			if len(seen) < 2 {
				t.Errorf("%d refusals all said Retry-After %v: the jitter did not reach this front end", n, seen)
			}
		})
	}
}

// TestProblemAnswersDoNotAllocate checks that the fasthttp server renders
// the core's problem bodies without allocating: a request its rule denies
// (400, the key missing) and one refused before any decision (a path
// origins read differently).
func TestProblemAnswersDoNotAllocate(t *testing.T) {
	if edgetest.Race {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are checked without -race")
	}
	e := edgetest.New(t, "rules: [{name: keyed, key: [\"header:X-Need\"], missing_key: deny, limit: 5, window: 1m}]", edge.Options{})
	h := e.Server.Handler()
	for _, tc := range []struct {
		path   string
		status int
	}{{"/x", 400}, {"/a%5Cb", 400}} {
		ctx := requestCtx(tc.path)
		for i := 0; i < 3; i++ {
			ctx.Response.Reset()
			h(ctx)
		}
		if ctx.Response.StatusCode() != tc.status || !bytes.HasPrefix(ctx.Response.Body(), []byte(`{"type":"about:blank","title":"Bad Request","status":400,"detail":"`)) {
			t.Fatalf("%s: %d %s, want %d and the core's problem body", tc.path, ctx.Response.StatusCode(), ctx.Response.Body(), tc.status)
		}
		if n := testing.AllocsPerRun(1000, func() {
			ctx.Response.Reset()
			h(ctx)
		}); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", tc.path, n)
		}
	}
}
