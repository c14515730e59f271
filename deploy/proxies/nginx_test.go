package proxies_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// startNginx runs nginx in the foreground with conf included in its http
// block, its pid file, logs and temporary paths in a directory of its own,
// and waits until it accepts on addr.
func startNginx(t *testing.T, conf, addr string) {
	t.Helper()
	bin := testenv.LookBinary(t, "nginx", "nginx")
	dir := t.TempDir()
	// Workers run as nobody when the master is root: let them reach the
	// temporary paths (request bodies beyond the buffer go there).
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "poplimit.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log stderr notice;
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/poplimit.conf;
}
`, dir)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, nil, bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;")
	p.waitAccept(t, addr)
}

// startNginxPoplimit runs nginx with nginx/poplimit.conf.template in front
// of origin, asking decision, and returns its address.
func startNginxPoplimit(t *testing.T, decision, origin, onFailure string) string {
	t.Helper()
	addr := freeAddr(t)
	conf := render(t, "nginx/poplimit.conf.template", map[string]string{
		"POPLIMIT_LISTEN":     addr,
		"POPLIMIT_DECISION":   decision,
		"POPLIMIT_ORIGIN":     origin,
		"POPLIMIT_ON_FAILURE": onFailure,
	})
	startNginx(t, conf, addr)
	return addr
}

// TestNginxAuthRequest: allowed requests reach the origin with the quota
// fields, for the origin and for the client; the request over the limit
// gets a 429 with poplimit's Retry-After, quota fields and problem body;
// limits follow the client behind nginx, whatever X-Forwarded-For it
// sends; path and method rules match; poplimit's 400 stays a 400.
func TestNginxAuthRequest(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, testRules, "-trusted-proxies", "127.0.0.1/32")
	site := startNginxPoplimit(t, e.addr, o.addr, "closed")
	a, b := newClient(t, "127.0.0.2"), newClient(t, "127.0.0.3")

	for i := int64(0); i < 3; i++ {
		spoof := fmt.Sprintf("198.51.100.%d", i+1)
		r := a.do(t, "GET", site, "/v1/items?page=2", host, "", "X-Forwarded-For", spoof, "RateLimit", `"api";r=999;t=1`)
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
		if got, want := s.Header.Values("X-Forwarded-For"), []string{spoof + ", 127.0.0.2"}; !slices.Equal(got, want) {
			t.Errorf("request %d: the origin saw X-Forwarded-For %q, want %q", i+1, got, want)
		}
	}
	r := a.do(t, "GET", site, "/v1/items?page=2", host, "", "X-Forwarded-For", "198.51.100.99")
	checkRefusal(t, r, "api", 3, 60)
	if n := len(o.requests()); n != 3 {
		t.Errorf("the origin received %d requests, want the 3 allowed", n)
	}

	r = b.do(t, "GET", site, "/v1/items", host, "")
	if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "api" || q.remaining != 2 {
		t.Errorf("client 127.0.0.3: status %d quota %+v, want 200 under api with 2 remaining", r.status, q)
	}
	r = a.do(t, "GET", site, "/about", host, "")
	if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "per-client" || q.remaining != 19 {
		t.Errorf("GET /about: status %d quota %+v, want 200 under per-client with 19 remaining", r.status, q)
	}
	// proxy_method sends the original method: POST-only rules match.
	for i := 0; i < 3; i++ {
		r = b.do(t, "POST", site, "/login", host, "user=b")
		if i < 2 {
			if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "login" || r.echoed(t).Body != "user=b" {
				t.Errorf("POST /login %d: status %d quota %+v, want 200 under login with the body at the origin", i+1, r.status, q)
			}
		}
	}
	checkRefusal(t, r, "login", 2, 60)
	if r = a.do(t, "GET", site, "/keyed/x", host, ""); r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("GET /keyed/x without X-API-Key: status %d %s, want 400 problem+json", r.status, r.header.Get("Content-Type"))
	}
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

// TestNginxAuthRequestSends records exactly what the auth subrequest sends
// to the decision endpoint, with a recorder in poplimit's place.
func TestNginxAuthRequestSends(t *testing.T) {
	o := startOrigin(t)
	rec := startRecorder(t)
	site := startNginxPoplimit(t, rec.addr, o.addr, "closed")
	a := newClient(t, "127.0.0.2")
	r := a.do(t, "POST", site, "/v1/a%2Fb/./c?x=1&y=2", host, "hello", "X-Forwarded-For", "198.51.100.1", "X-API-Key", "k1")
	if r.status != http.StatusOK {
		t.Fatalf("status %d (body %q), want 200", r.status, r.body)
	}
	got := rec.requests()
	if len(got) != 1 {
		t.Fatalf("the decision endpoint received %d requests, want 1", len(got))
	}
	d := got[0]
	t.Logf("auth_request sent: %s %s Host %s, headers %v, body %q", d.Method, d.URI, d.Host, d.Header, d.Body)
	for _, c := range []struct{ what, got, want string }{
		{"method", d.Method, "POST"},
		{"request target", d.URI, "/check/v1/a%2Fb/./c?x=1&y=2"},
		{"Host", d.Host, host},
		{"X-Forwarded-For", strings.Join(d.Header.Values("X-Forwarded-For"), "|"), "198.51.100.1, 127.0.0.2"},
		{"X-Original-Method", d.Header.Get("X-Original-Method"), "POST"},
		{"X-Original-Uri", d.Header.Get("X-Original-Uri"), "/v1/a%2Fb/./c?x=1&y=2"},
		{"X-Api-Key", d.Header.Get("X-Api-Key"), "k1"},
		{"Content-Length", d.Header.Get("Content-Length"), ""},
		{"body", d.Body, ""},
	} {
		if c.got != c.want {
			t.Errorf("%s %q, want %q", c.what, c.got, c.want)
		}
	}
	if s := r.echoed(t); s.Method != "POST" || s.Body != "hello" {
		t.Errorf("the origin saw %s body %q, want POST body \"hello\"", s.Method, s.Body)
	}
}

// TestNginxBareAuthRequest shows why the idiom is needed: auth_request
// alone turns poplimit's 429 into a 500 without its fields, and fails
// closed with a 500 when poplimit is down.
func TestNginxBareAuthRequest(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, testRules, "-trusted-proxies", "127.0.0.1/32")
	addr := freeAddr(t)
	startNginx(t, fmt.Sprintf(`server {
    listen %s;
    location / {
        auth_request /_check;
        proxy_pass http://%s;
    }
    location = /_check {
        internal;
        proxy_pass http://%s/check$request_uri;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }
}
`, addr, o.addr, e.addr), addr)
	a := newClient(t, "127.0.0.2")
	var r reply
	for i := 0; i < 4; i++ {
		r = a.do(t, "GET", addr, "/v1/items", host, "")
	}
	if r.status != http.StatusInternalServerError || r.header.Get("Retry-After") != "" || r.header.Get("RateLimit") != "" {
		t.Errorf("4th request: status %d Retry-After %q RateLimit %q, want nginx's bare 500", r.status, r.header.Get("Retry-After"), r.header.Get("RateLimit"))
	}
	e.kill()
	if r = a.do(t, "GET", addr, "/v1/items", host, ""); r.status != http.StatusInternalServerError {
		t.Errorf("poplimit down: status %d, want nginx's 500", r.status)
	}
}

// TestNginxPoplimitDown: what clients see when poplimit hangs (SIGSTOP)
// and when it is gone (killed), failing closed (503 problem) and open (the
// origin, undecided).
func TestNginxPoplimitDown(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			d := poplimitDown(t, mode, startNginxPoplimit)
			o, n := d.o, d.before
			for _, c := range []struct {
				what string
				r    reply
			}{{"hung", d.hung}, {"gone", d.gone}, {"again", d.again}} {
				if c.r.elapsed > 2500*time.Millisecond {
					t.Errorf("poplimit %s: the client waited %v, want about the 1 s proxy_read_timeout at most", c.what, c.r.elapsed)
				}
				for _, f := range quotaFields {
					if v := c.r.header.Values(f); len(v) > 0 {
						t.Errorf("poplimit %s: the client saw %s %q, want none", c.what, f, v)
					}
				}
				switch mode {
				case "closed":
					if c.r.status != http.StatusServiceUnavailable || c.r.header.Get("Content-Type") != "application/problem+json" {
						t.Errorf("poplimit %s: status %d %s (body %q), want 503 problem+json", c.what, c.r.status, c.r.header.Get("Content-Type"), c.r.body)
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
