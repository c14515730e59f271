package middleware_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
)

const testRules = `
rules:
  - {name: by-key, path_prefix: /api, key: ["header:X-API-Key"], missing_key: deny, limit: 2, window: 1m}
  - {name: by-user, path_prefix: /q, key: ["query:user", "cookie:sid"], limit: 1, window: 1m}
  - {name: per-client, limit: 3, window: 1m}
`

func newMiddleware(t testing.TB, rules string, o edge.Options) http.Handler {
	e := edgetest.New(t, rules, o)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "origin") })
	return e.NetHTTP()(ok)
}

func do(h http.Handler, method, target, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The middleware answers as the edge server does: quota fields on what the
// handler answers, the 429 contract on refusals, 400 for a missing key;
// keys from headers, query parameters and cookies; trusted proxies' hops.
func TestNetHTTP(t *testing.T) {
	var o edge.Options
	o.Server.TrustedProxies, _ = clientaddr.ParsePrefixes("10.0.0.0/8")
	h := newMiddleware(t, testRules, o)
	for i, want := range []int{200, 200, 200, 429} {
		w := do(h, "GET", "http://example.com/x", "192.0.2.1:1234")
		if w.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, w.Code, want)
		}
		if want == 200 && (w.Body.String() != "origin" || w.Header().Get("RateLimit-Policy") != `"per-client";q=3;w=60` ||
			!strings.HasPrefix(w.Header().Get("RateLimit"), fmt.Sprintf(`"per-client";r=%d;t=`, 2-i))) {
			t.Errorf("request %d: body %q, fields %q %q", i+1, w.Body, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		}
		if want == 429 {
			if w.Header().Get("Retry-After") == "" || w.Header().Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(w.Body.String(), `"policy":"per-client"`) || w.Header().Get("X-RateLimit-Remaining") != "0" {
				t.Errorf("refusal: %v %q", w.Header(), w.Body)
			}
		}
	}
	// Another client is its own key; behind a trusted proxy, the hop.
	if w := do(h, "GET", "http://example.com/x", "10.1.1.1:80", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "192.0.2.2"); w.Code != 200 {
		t.Errorf("client behind a trusted proxy: %d", w.Code)
	}
	for i := 0; i < 3; i++ {
		do(h, "GET", "http://example.com/x", "10.1.1.1:80", "X-Forwarded-For", fmt.Sprintf("6.6.6.%d, 192.0.2.2", i))
	}
	if w := do(h, "GET", "http://example.com/x", "10.1.1.1:80", "X-Forwarded-For", "192.0.2.2"); w.Code != 429 {
		t.Errorf("192.0.2.2 after 4 requests with forged hops: %d, want 429", w.Code)
	}
	// Header keys, a missing one denied.
	if w := do(h, "GET", "http://example.com/api/a", "192.0.2.9:1"); w.Code != 400 || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("missing API key: %d %v", w.Code, w.Header())
	}
	for i, want := range []int{200, 200, 429} {
		if w := do(h, "GET", "http://example.com/api/a", "192.0.2.9:1", "x-api-key", "k1"); w.Code != want {
			t.Errorf("API key request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	// Query and cookie keys: user=a with sid=s1 once, then refused; another sid is another key.
	if w := do(h, "GET", "http://example.com/q?x=1&user=a%20b", "192.0.2.9:1", "Cookie", "other=1; sid=s1"); w.Code != 200 {
		t.Errorf("query+cookie first: %d", w.Code)
	}
	if w := do(h, "GET", "http://example.com/q?user=a+b", "192.0.2.9:1", "Cookie", "sid=s1"); w.Code != 429 {
		t.Errorf("query+cookie again (same key, other spelling): %d, want 429", w.Code)
	}
	if w := do(h, "GET", "http://example.com/q?user=a+b", "192.0.2.9:1", "Cookie", "sid=s2"); w.Code != 200 {
		t.Errorf("query+cookie with another sid: %d", w.Code)
	}
}

// Concurrency rules hold a slot while the wrapped handler runs.
func TestNetHTTPConcurrency(t *testing.T) {
	e := edgetest.New(t, "rules: [{name: one-at-a-time, kind: concurrency, limit: 1}]", edge.Options{})
	inner := make(chan int, 1)
	var h http.Handler
	h = e.NetHTTP()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/outer" {
			inner <- do(h, "GET", "http://example.com/inner", r.RemoteAddr).Code // while this one holds the slot
		}
	}))
	if w := do(h, "GET", "http://example.com/outer", "192.0.2.1:1"); w.Code != 200 {
		t.Fatalf("outer: %d", w.Code)
	}
	if c := <-inner; c != 429 {
		t.Errorf("a second request while the first runs: %d, want 429", c)
	}
	if w := do(h, "GET", "http://example.com/after", "192.0.2.1:1"); w.Code != 200 {
		t.Errorf("after the first finished: %d, want 200", w.Code)
	}
}

// BenchmarkNetHTTP compares a handler behind the middleware with the bare
// handler, the allowed path: the difference in allocs/op is what the
// middleware adds. net/http keeps each header value as a string in a
// slice: the five quota fields cost five strings and one shared array;
// the decision itself allocates nothing.
func BenchmarkNetHTTP(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	e := edgetest.New(b, "rules: [{name: roomy, key: [\"header:X-API-Key\"], limit: 1000000000, window: 1m}]", edge.Options{})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare", ok}, {"middleware", e.NetHTTP()(ok)}} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest("GET", "http://example.com/x?y=1", nil)
			r.RemoteAddr = "192.0.2.1:1234"
			r.Header.Set("X-API-Key", "key-123")
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				c.h.ServeHTTP(w, r)
			}
		})
	}
}

// Behind the middleware as behind the edge server, a key field sent twice
// is refused and counted, unless the rule keys by its first or last value;
// HEAD meets a GET rule; path_case: insensitive meets any casing.
func TestNetHTTPDuplicateKeysHeadAndPathCase(t *testing.T) {
	e := edgetest.New(t, `
rules:
  - {name: hdr, path_prefix: /h, key: ["header:X-API-Key"], limit: 5, window: 1m}
  - {name: qry, path_prefix: /q, key: ["query:key"], limit: 5, window: 1m}
  - {name: ckie, path_prefix: /c, key: ["cookie:sid"], limit: 5, window: 1m}
  - {name: last, path_prefix: /last, key: ["query:key"], duplicate_key: last, limit: 1, window: 1m}
  - {name: get, path_prefix: /g, methods: [GET], limit: 1, window: 1m}
  - {name: login, path_prefix: /login, path_case: insensitive, limit: 1, window: 1m}
`, edge.Options{})
	h := e.NetHTTP()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "origin") }))
	for _, tc := range []struct {
		name, target string
		hdr          []string
	}{
		{"two header lines", "http://x/h", []string{"X-API-Key", "r1", "x-api-key", "real"}},
		{"two query parameters", "http://x/q?key=r1&k%65y=real", nil},
		{"two cookies", "http://x/c", []string{"Cookie", "sid=r1", "Cookie", "a=1; sid=real"}},
	} {
		w := do(h, "GET", tc.target, "192.0.2.1:1", tc.hdr...)
		if w.Code != 400 || w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(w.Body.String(), "more than once") {
			t.Errorf("%s: %d %q, want 400 saying the field appears more than once", tc.name, w.Code, w.Body)
		}
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_bad_requests_total", "reason", "duplicate_key"); n != 3 {
		t.Errorf("bad_requests_total{reason=duplicate_key} = %v, want 3", n)
	}
	steps := []struct {
		method, target string
		want           int
	}{
		{"GET", "http://x/last?key=r1&key=real", 200},
		{"GET", "http://x/last?key=r2&key=real", 429},
		{"HEAD", "http://x/g", 200},
		{"GET", "http://x/g", 429},
		{"GET", "http://x/LOGIN", 200},
		{"GET", "http://x/login", 429},
	}
	for _, s := range steps {
		if w := do(h, s.method, s.target, "192.0.2.1:1"); w.Code != s.want {
			t.Errorf("%s %s: %d, want %d", s.method, s.target, w.Code, s.want)
		}
	}
}
