package proxies_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestNginxAuthRequestSendsNoBody: nginx's auth_request sends its check
// without the request's body (proxy_pass_request_body off, as it must:
// the subrequest cannot carry it), so a rule keyed by a form field falls
// back to the client address there, and the edge says so in
// poplimit_edge_body_key_fallbacks_total{reason="absent"}; the origin still
// receives each body.
func TestNginxAuthRequestSendsNoBody(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, `
rules:
  - {name: login-account, path_prefix: /login, methods: [POST], key: ["form:user"], limit: 2, window: 1m}
  - {name: rest, limit: 100, window: 1m}
`, "-trusted-proxies", "127.0.0.1/32", "-check-prefix", "/check")
	site := startNginxPoplimit(t, e.addr, o.addr, "closed")
	a := newClient(t, "127.0.0.2")
	for i, user := range []string{"alice", "bob", "carol"} {
		r := a.do(t, "POST", site, "/login", host, "user="+user, "Content-Type", "application/x-www-form-urlencoded")
		if i < 2 {
			if r.status != http.StatusOK || r.echoed(t).Body != "user="+user {
				t.Fatalf("POST /login as %s: status %d, want 200 with the body at the origin", user, r.status)
			}
			continue
		}
		// Three accounts, one client address: the fallback key holds them.
		checkRefusal(t, r, "login-account", 2, 60)
	}
	resp, err := http.Get("http://" + e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if want := `poplimit_edge_body_key_fallbacks_total{reason="absent"} 3`; !strings.Contains(string(b), want) {
		t.Errorf("the edge's metrics lack %q:\n%s", want, grepLines(string(b), "body_key"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return fmt.Sprint(out)
}
