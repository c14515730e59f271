package middleware_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
)

// Behind the net/http middleware a login rule keyed by a form field holds
// each account's attempts, case and width folded, and the handler reads
// the whole body as the client sent it, with Content-Length or chunked, a
// body over the bound included (keyed by the client IP, counted).
func TestNetHTTPBodyKeys(t *testing.T) {
	const rules = `
rules:
  - {name: login, path_prefix: /login, methods: [POST], key: ["form:username"], key_case: insensitive, limit: 3, window: 15m}
  - {name: big, path_prefix: /big, methods: [POST], key: ["json:/user"], limit: 10, window: 15m}
  - {name: rest, limit: 1000, window: 1m}
`
	e := edgetest.New(t, rules, edge.Options{})
	var got []string
	h := e.NetHTTP()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		r.Body.Close()
		got = append(got, fmt.Sprintf("%d %x", len(b), sha256.Sum256(b)))
		w.WriteHeader(http.StatusUnauthorized)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	hc := srv.Client()
	hc.Timeout = 30 * time.Second
	send := func(path, ctype string, body []byte, chunked bool) int {
		t.Helper()
		var r io.Reader = bytes.NewReader(body)
		if chunked {
			r = io.MultiReader(r)
		}
		req, _ := http.NewRequest("POST", srv.URL+path, r)
		req.Header.Set("Content-Type", ctype)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 401 {
			if want := fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)); got[len(got)-1] != want {
				t.Fatalf("the handler read %s, the client sent %s", got[len(got)-1], want)
			}
		}
		return resp.StatusCode
	}
	const form = "application/x-www-form-urlencoded"
	for i, u := range []string{"ivan", "IVAN", "%EF%BC%A9van"} {
		if st := send("/login", form, []byte("username="+u+"&password=x"), i == 1); st != 401 {
			t.Fatalf("attempt %d: %d", i, st)
		}
	}
	if st := send("/login", form, []byte("username=Ivan"), false); st != 429 {
		t.Errorf("ivan's fourth attempt: %d, want 429", st)
	}
	if st := send("/login", form, []byte("username=judy"), true); st != 401 {
		t.Errorf("judy, from the same client: %d, want 401", st)
	}
	for _, chunked := range []bool{false, true} {
		big := []byte(`{"user": "mallory", "pad": "` + strings.Repeat("x", 1<<20) + `"}`)
		if st := send("/big", "application/json", big, chunked); st != 401 {
			t.Errorf("a 1 MiB body (chunked %v): %d", chunked, st)
		}
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_body_key_fallbacks_total", "reason", "too_large"); n != 2 {
		t.Errorf("too_large = %v, want 2", n)
	}
	if st := send("/login", form, []byte("username=a&username=b"), false); st != 400 {
		t.Errorf("a field twice: %d, want 400", st)
	}
}
