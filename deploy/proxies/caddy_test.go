package proxies_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// testRules are the edge's rules in every proxy test: a POST-only rule, a
// path rule, a rule that answers 400 without its key, a catch-all for the
// host; requests for other hosts match none.
const testRules = `
rules:
  - name: login
    host: api.example.test
    path_prefix: /login
    methods: [POST]
    limit: 2
    window: 1m
  - name: api
    host: api.example.test
    path_prefix: /v1/
    limit: 3
    window: 1m
  - name: keyed
    host: api.example.test
    path_prefix: /keyed/
    key: ["header:X-API-Key"]
    missing_key: deny
    limit: 100
    window: 1m
  - name: per-client
    host: api.example.test
    limit: 20
    window: 1m
`

const host = "api.example.test"

// quotaFields are the fields poplimit answers with.
var quotaFields = []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// startCaddy runs Caddy with caddy/Caddyfile in front of origin, asking
// decision, failing open or closed, and returns the site's address.
func startCaddy(t *testing.T, decision, origin, onFailure string) string {
	t.Helper()
	bin := testenv.LookBinary(t, "caddy", "caddy")
	dir := t.TempDir()
	site, allow := freeAddr(t), freeAddr(t)
	vars := map[string]string{
		"POPLIMIT_SITE":       "http://:" + port(t, site),
		"POPLIMIT_BIND":       "127.0.0.1",
		"POPLIMIT_DECISION":   decision,
		"POPLIMIT_ORIGIN":     origin,
		"POPLIMIT_ON_FAILURE": onFailure,
		"POPLIMIT_ALLOW_PORT": port(t, allow),
		"CADDY_ADMIN":         "off",
		"HOME":                dir,
		"XDG_CONFIG_HOME":     filepath.Join(dir, "config"),
		"XDG_DATA_HOME":       filepath.Join(dir, "data"),
	}
	p := startProc(t, env(vars), bin, "run", "--config", "caddy/Caddyfile", "--adapter", "caddyfile")
	p.waitAccept(t, site)
	p.waitAccept(t, allow)
	return site
}

// TestCaddyForwardAuth: allowed requests reach the origin with the quota
// fields, on the request for the origin and on the response for the client;
// the request over the limit gets poplimit's refusal as poplimit wrote it
// and never reaches the origin; limits follow the client behind Caddy,
// whatever X-Forwarded-For it sends; path rules match.
func TestCaddyForwardAuth(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, testRules, "-trusted-proxies", "127.0.0.1/32")
	site := startCaddy(t, e.addr, o.addr, "closed")
	a, b := newClient(t, "127.0.0.2"), newClient(t, "127.0.0.3")

	for i := int64(0); i < 3; i++ {
		r := a.do(t, "GET", site, "/v1/items?page=2", host, "",
			"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1), // a client's own hops: ignored
			"RateLimit", `"api";r=999;t=1`) // a client's own quota field: never reaches the origin
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d (body %q), want 200", i+1, r.status, r.body)
		}
		want := quota{policy: "api", limit: 3, window: 60, remaining: 2 - i}
		if got := quotaOf(t, r.header); got.policy != want.policy || got.limit != want.limit || got.window != want.window || got.remaining != want.remaining {
			t.Errorf("request %d: the client saw quota %+v, want %+v", i+1, got, want)
		}
		s := r.echoed(t)
		if got := quotaOf(t, s.Header); got.policy != want.policy || got.remaining != want.remaining {
			t.Errorf("request %d: the origin saw quota %+v, want %+v", i+1, got, want)
		}
		if s.Method != "GET" || s.URI != "/v1/items?page=2" || s.Host != host {
			t.Errorf("request %d: the origin saw %s %s Host %s, want GET /v1/items?page=2 Host %s", i+1, s.Method, s.URI, s.Host, host)
		}
		if got := s.Header.Values("X-Forwarded-For"); !slices.Equal(got, []string{"127.0.0.2"}) {
			t.Errorf("request %d: the origin saw X-Forwarded-For %q, want [127.0.0.2]", i+1, got)
		}
	}
	r := a.do(t, "GET", site, "/v1/items?page=2", host, "", "X-Forwarded-For", "198.51.100.99")
	checkRefusal(t, r, "api", 3, 60)
	if n := len(o.requests()); n != 3 {
		t.Errorf("the origin received %d requests, want the 3 allowed", n)
	}

	// Another client behind the same Caddy has its own count.
	r = b.do(t, "GET", site, "/v1/items", host, "")
	if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "api" || q.remaining != 2 {
		t.Errorf("client 127.0.0.3: status %d quota %+v, want 200 under api with 2 remaining", r.status, q)
	}
	// The path reaches poplimit: another path falls to the catch-all.
	r = a.do(t, "GET", site, "/about", host, "")
	if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "per-client" || q.remaining != 19 {
		t.Errorf("GET /about: status %d quota %+v, want 200 under per-client with 19 remaining", r.status, q)
	}
	// poplimit's 400 (a rule's key is missing) is the client's.
	if r = a.do(t, "GET", site, "/keyed/x", host, ""); r.status != http.StatusBadRequest {
		t.Errorf("GET /keyed/x without X-API-Key: status %d, want poplimit's 400", r.status)
	}
	// No rule matches another host: no quota fields anywhere, neither a
	// client's nor the placeholders' text Caddy 2.6 copies for absent ones.
	r = a.do(t, "GET", site, "/v1/items", "other.example.test", "", "RateLimit", `"api";r=999;t=1`)
	if r.status != http.StatusOK {
		t.Fatalf("other host: status %d, want 200", r.status)
	}
	for _, f := range quotaFields {
		if v := r.header.Values(f); len(v) > 0 {
			t.Errorf("other host: the client saw %s %q, want none", f, v)
		}
		if v := r.echoed(t).Header.Values(f); len(v) > 0 {
			t.Errorf("other host: the origin saw %s %q, want none", f, v)
		}
	}
}

// TestCaddyForwardAuthRequest records exactly what forward_auth sends to
// the decision endpoint, with a recorder in poplimit's place.
func TestCaddyForwardAuthRequest(t *testing.T) {
	o := startOrigin(t)
	rec := startRecorder(t)
	site := startCaddy(t, rec.addr, o.addr, "closed")
	a := newClient(t, "127.0.0.2")
	r := a.do(t, "POST", site, "/v1/a%2Fb/./c?x=1&y=2", host, "hello",
		"X-Forwarded-For", "198.51.100.1", "X-Forwarded-Method", "DELETE", "X-Forwarded-Uri", "/spoofed", "X-API-Key", "k1")
	if r.status != http.StatusOK {
		t.Fatalf("status %d (body %q), want 200", r.status, r.body)
	}
	got := rec.requests()
	if len(got) != 1 {
		t.Fatalf("the decision endpoint received %d requests, want 1", len(got))
	}
	d := got[0]
	t.Logf("forward_auth sent: %s %s Host %s, headers %v, body %q", d.Method, d.URI, d.Host, d.Header, d.Body)
	// The method is always GET; the original is in X-Forwarded-Method.
	// uri /check{uri} carries the path and query, with %2F decoded and dot
	// segments kept; X-Forwarded-Uri keeps the request target as sent.
	for _, c := range []struct{ what, got, want string }{
		{"method", d.Method, "GET"},
		{"request target", d.URI, "/check/v1/a/b/./c?x=1&y=2"},
		{"Host", d.Host, host},
		{"X-Forwarded-Method", strings.Join(d.Header.Values("X-Forwarded-Method"), ","), "POST"},
		{"X-Forwarded-Uri", strings.Join(d.Header.Values("X-Forwarded-Uri"), ","), "/v1/a%2Fb/./c?x=1&y=2"},
		{"X-Forwarded-For", strings.Join(d.Header.Values("X-Forwarded-For"), ","), "127.0.0.2"},
		{"X-Forwarded-Host", d.Header.Get("X-Forwarded-Host"), host},
		{"X-Forwarded-Proto", d.Header.Get("X-Forwarded-Proto"), "http"},
		{"X-Api-Key", d.Header.Get("X-Api-Key"), "k1"},
		{"Content-Length", d.Header.Get("Content-Length"), ""},
		{"body", d.Body, ""},
	} {
		if c.got != c.want {
			t.Errorf("%s %q, want %q", c.what, c.got, c.want)
		}
	}
	s := r.echoed(t)
	if s.Method != "POST" || s.Body != "hello" || s.URI != "/v1/a%2Fb/./c?x=1&y=2" {
		t.Errorf("the origin saw %s %s body %q, want POST /v1/a%%2Fb/./c?x=1&y=2 body \"hello\"", s.Method, s.URI, s.Body)
	}
	if q := quotaOf(t, s.Header); q.policy != "rec" || q.remaining != 9 {
		t.Errorf("the origin saw quota %+v, want the recorder's", q)
	}
}

// TestCaddyMethodRules: a rule for POST only. forward_auth asks with GET
// and names the method only in X-Forwarded-Method, which the edge believes
// from a trusted proxy with -forwarded-method-header.
func TestCaddyMethodRules(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, testRules, "-trusted-proxies", "127.0.0.1/32", "-forwarded-method-header", "X-Forwarded-Method")
	site := startCaddy(t, e.addr, o.addr, "closed")
	a := newClient(t, "127.0.0.2")
	var r reply
	for i := 0; i < 3; i++ {
		r = a.do(t, "POST", site, "/login", host, "user=a")
	}
	checkRefusal(t, r, "login", 2, 60)
}

// TestCaddyPoplimitDown: what clients see when poplimit hangs (stopped
// with SIGSTOP) and when it is gone (killed), failing closed (Caddy's own
// behaviour: an error) and open (the allow-all responder).
func TestCaddyPoplimitDown(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			d := poplimitDown(t, mode, startCaddy)
			o, n := d.o, d.before
			for _, c := range []struct {
				what string
				r    reply
			}{{"hung", d.hung}, {"gone", d.gone}, {"again", d.again}} {
				if c.r.elapsed > 2500*time.Millisecond {
					t.Errorf("poplimit %s: the client waited %v, want about the 1 s response_header_timeout at most", c.what, c.r.elapsed)
				}
				switch mode {
				case "closed":
					if c.r.status != http.StatusBadGateway && c.r.status != http.StatusGatewayTimeout {
						t.Errorf("poplimit %s: status %d, want Caddy's 502 or 504", c.what, c.r.status)
					}
				case "open":
					if c.r.status != http.StatusOK {
						t.Errorf("poplimit %s: status %d (body %q), want 200 from the origin", c.what, c.r.status, c.r.body)
					}
					for _, f := range quotaFields {
						if v := c.r.echoed(t).Header.Values(f); len(v) > 0 {
							t.Errorf("poplimit %s: the origin saw %s %q, want none", c.what, f, v)
						}
					}
				}
			}
			want := n
			if mode == "open" {
				want += 3
			}
			if got := len(o.requests()); got != want {
				t.Errorf("the origin received %d requests, want %d", got, want)
			}
		})
	}
}
