package httpedge_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
)

// loginOrigin is a real net/http origin that answers every login 401 and
// records the digest and framing of each body it read.
type loginOrigin struct {
	addr   string
	mu     sync.Mutex
	bodies []string // "<len> <sha256> <transfer-encoding>"
}

func startLoginOrigin(t *testing.T) *loginOrigin {
	t.Helper()
	o := &loginOrigin{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		o.mu.Lock()
		o.bodies = append(o.bodies, digest(b)+" "+strings.Join(r.TransferEncoding, ","))
		o.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	o.addr = ln.Addr().String()
	return o
}

func digest(b []byte) string { return fmt.Sprintf("%d %x", len(b), sha256.Sum256(b)) }

func (o *loginOrigin) last() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.bodies) == 0 {
		return ""
	}
	return o.bodies[len(o.bodies)-1]
}

const bodyKeyRules = `
rules:
  - {name: form-login, path_prefix: /login, methods: [POST], key: ["form:username"], key_case: insensitive, limit: 3, window: 15m}
  - {name: json-login, path_prefix: /api/login, methods: [POST], key: ["json:/user/email"], key_case: insensitive, limit: 3, window: 15m}
  - {name: strict, path_prefix: /strict, methods: [POST], key: ["json:/user"], missing_key: deny, limit: 3, window: 15m}
  - {name: big, path_prefix: /big, methods: [POST], key: ["form:username"], limit: 10, window: 15m}
  - {name: rest, path_prefix: /, limit: 1000, window: 1m}
`

// post sends body to url with the content type; chunked sends it without
// a Content-Length; expect adds Expect: 100-continue.
func post(t *testing.T, hc *http.Client, url, ctype string, body []byte, chunked, expect bool, hdr ...string) int {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(bytes.NewReader(body)) // hides the length
	}
	req, _ := http.NewRequest("POST", url, r)
	req.Header.Set("Content-Type", ctype)
	if expect {
		req.Header.Set("Expect", "100-continue")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// In proxy mode a login rule keyed by a form field or a JSON member holds
// the attempts of each account whatever the case or width it is written
// in, apart from the other accounts of the same client; the origin
// receives exactly the bytes the client sent, with Content-Length,
// chunked and Expect: 100-continue alike, and a body over the bound
// streams on and falls back to the client IP, counted.
func TestProxyBodyKeys(t *testing.T) {
	origin := startLoginOrigin(t)
	e := startEdge(t, edgeOpts{rules: bodyKeyRules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr,
		UpstreamTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}})
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true, ExpectContinueTimeout: 5 * time.Second}}
	defer hc.CloseIdleConnections()
	base := "http://" + e.addr
	const form, js = "application/x-www-form-urlencoded", "application/json"

	check := func(what string, status, want int, body []byte, chunked bool) {
		t.Helper()
		if status != want {
			t.Fatalf("%s: status %d, want %d", what, status, want)
		}
		if want != 401 {
			return
		}
		wantTE := ""
		if chunked && len(body) > 64<<10 {
			wantTE = "chunked" // a long chunked body streams on chunked; a short one is sent with its length
		}
		if got := origin.last(); got != digest(body)+" "+wantTE {
			t.Fatalf("%s: the origin read %q, the client sent %q", what, got, digest(body)+" "+wantTE)
		}
	}
	// Three failures for alice, written three ways, each framed its own way.
	for i, tt := range []struct {
		user            string
		chunked, expect bool
	}{{"alice%40example.com", false, false}, {"ALICE%40Example.com", true, false}, {"%EF%BC%A1lice%40example.com", false, true}} {
		body := []byte("username=" + tt.user + "&password=wrong" + fmt.Sprint(i))
		check("alice "+tt.user, post(t, hc, base+"/login", form, body, tt.chunked, tt.expect), 401, body, tt.chunked)
	}
	body := []byte("password=x&username=Alice%40example.com")
	check("alice's fourth attempt", post(t, hc, base+"/login", form, body, false, false), 429, body, false)
	// The same client, another account: not held by alice's failures.
	body = []byte("username=bob%40example.com&password=x")
	check("bob", post(t, hc, base+"/login", form, body, false, true), 401, body, false)
	// JSON, with a chunked body.
	for i := range 3 {
		body = []byte(fmt.Sprintf(`{"user": {"email": "Carol@Example.com"}, "password": "p%d"}`, i))
		check("carol", post(t, hc, base+"/api/login", js, body, i == 1, i == 2), 401, body, i == 1)
	}
	body = []byte(`{"user":{"email":"carol@example.com"}}`)
	check("carol's fourth", post(t, hc, base+"/api/login", js, body, false, false), 429, body, false)

	// Over the bound (8 KiB): the body streams on whole, keyed by the IP.
	for _, tt := range []struct {
		n       int
		chunked bool
	}{{20 << 10, false}, {20 << 10, true}, {200 << 10, true}, {10 << 20, false}} {
		big := append([]byte("username=dave&pad="), bytes.Repeat([]byte{'x'}, tt.n)...)
		check(fmt.Sprintf("%d bytes, chunked %v", len(big), tt.chunked), post(t, hc, base+"/big", form, big, tt.chunked, tt.n > 1<<20), 401, big, tt.chunked)
	}
	if got := metricSum(t, e, "poplimit_edge_body_key_fallbacks_total", "reason", "too_large"); got != 4 {
		t.Errorf("body_key_fallbacks_total{reason=too_large} = %v, want 4", got)
	}
	// A field sent twice is refused, as a duplicated header is.
	body = []byte("username=erin&username=frank")
	check("field twice", post(t, hc, base+"/login", form, body, false, false), 400, body, false)
	// missing_key: deny refuses what it cannot read.
	body = []byte(`{"user": ` + strings.Repeat("[", 3000) + strings.Repeat("]", 3000) + `}`)
	check("JSON bomb", post(t, hc, base+"/strict", js, body, false, false), 400, body, false)
	if got := metricSum(t, e, "poplimit_edge_body_key_fallbacks_total", "reason", "too_deep"); got != 1 {
		t.Errorf("body_key_fallbacks_total{reason=too_deep} = %v, want 1", got)
	}
	// A request no body rule matches is not read before the decision.
	body = bytes.Repeat([]byte{'y'}, 3000)
	check("other path", post(t, hc, base+"/upload", form, body, false, false), 401, body, false)
}

// In decision mode the body is the one the proxy sent with its check
// (Envoy's ext_authz with with_request_body): keyed by the account; a
// body Envoy marks as cut falls back; a check without a body (nginx
// auth_request) falls back to the client IP.
func TestDecisionBodyKeys(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: bodyKeyRules})
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	base := "http://" + e.addr
	const form = "application/x-www-form-urlencoded"
	for i, u := range []string{"grace", "GRACE", "Grace"} {
		if st := post(t, hc, base+"/login", form, []byte("username="+u), false, false); st != 200 {
			t.Fatalf("attempt %d: %d", i, st)
		}
	}
	if st := post(t, hc, base+"/login", form, []byte("username=grace"), false, false); st != 429 {
		t.Errorf("grace's fourth attempt: %d, want 429", st)
	}
	if st := post(t, hc, base+"/login", form, []byte("username=heidi"), false, false); st != 200 {
		t.Errorf("heidi: %d, want 200", st)
	}
	if st := post(t, hc, base+"/login", form, []byte("username=grace"), false, false, "X-Envoy-Auth-Partial-Body", "true"); st != 200 {
		t.Errorf("a cut body: %d, want 200 (keyed by the IP)", st)
	}
	if st := post(t, hc, base+"/login", form, nil, false, false); st != 200 {
		t.Errorf("no body: %d, want 200 (keyed by the IP)", st)
	}
	if got := metricSum(t, e, "poplimit_edge_body_key_fallbacks_total", "reason", "too_large"); got != 1 {
		t.Errorf("too_large = %v, want 1", got)
	}
	if got := metricSum(t, e, "poplimit_edge_body_key_fallbacks_total", "reason", "absent"); got != 1 {
		t.Errorf("absent = %v, want 1", got)
	}
}
