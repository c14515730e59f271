package httpedge_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// loginHandler is what each test origin answers on its /login route, so
// that a request that reached it is known whatever its status.
const loginHandler = "the login handler"

// loginRule spends /login's quota in one request per client.
const loginRule = "rules:\n  - {name: login, path_prefix: /login, limit: 1, window: 1m}\n"

// A path the edge matches one way and an origin reads another could dodge
// a path rule. These forms hold a backslash (raw or %5C) or start with two
// slashes: the WHATWG URL parser (Node's new URL) reads a backslash as a
// slash and a leading "//" as an authority, so /x/..\login, /x\..\login
// and //evil/login are /login to it; Go's ServeMux and nginx on Linux read
// a backslash as a byte of a segment. A tab, which the WHATWG parser
// drops, is here too.
var pathDodges = []string{
	`/x/..\login`,
	`/x\..\login`,
	`/x/..%5Clogin`,
	`/x/..%5clogin`,
	`/x%5C..%5Clogin`,
	`/x/%2e%2e\login`,
	`/x/..\\login`,
	`/\evil/login`,
	`/%5Cevil/login`,
	`//evil/login`,
	`\login`,
	`/\login`,
	`/x/..\login?a=1`,
	"/lo\tgin",
	"/x/..\\lo\tgin",
}

// origin is one real server the edge proxies to: Node (the WHATWG URL
// parser), Go's ServeMux (path cleaning) or nginx, each routing /login to
// loginHandler and anything else elsewhere.
type testOrigin struct {
	name, addr string
}

// startNodeOrigin runs Node with an origin that routes by
// new URL(req.url, 'http://x').pathname, as Node servers commonly do.
func startNodeOrigin(t *testing.T) testOrigin {
	t.Helper()
	bin := testenv.LookBinary(t, "node", "nodejs")
	port := testenv.FreePort(t)
	script := filepath.Join(t.TempDir(), "origin.js")
	src := `const http = require('http');
http.createServer((req, res) => {
  let p;
  try { p = new URL(req.url, 'http://x').pathname; } catch (e) { res.writeHead(400); res.end('unparsable'); return; }
  if (p.startsWith('/login')) { res.writeHead(200); res.end('` + loginHandler + `'); return; }
  res.writeHead(404); res.end('other: ' + p);
}).listen(` + strconv.Itoa(port) + `, '127.0.0.1');
`
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	startGroup(t, addr, bin, script)
	return testOrigin{"node", addr}
}

// startGoOrigin serves Go's ServeMux, which cleans paths (a redirect to
// the clean path) before it routes.
func startGoOrigin(t *testing.T) testOrigin {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, loginHandler) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "other: "+r.URL.Path, http.StatusNotFound) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return testOrigin{"go", ln.Addr().String()}
}

// startNginxOrigin runs nginx with a location for /login.
func startNginxOrigin(t *testing.T) testOrigin {
	t.Helper()
	addr := startNginx(t, func(listen string) string {
		return fmt.Sprintf(`server {
        listen %s;
        location /login { return 200 "%s"; }
        location / { return 404 "other"; }
    }`, listen, loginHandler)
	})
	return testOrigin{"nginx", addr}
}

// startNginx runs nginx on a free loopback port with the server block
// server(listen) in an http block of its own, and returns the address.
func startNginx(t *testing.T, server func(listen string) string) string {
	t.Helper()
	bin := testenv.LookBinary(t, "nginx", "nginx")
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		os.Chmod(d, 0o755) // workers run as nobody when the master is root
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	conf := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log stderr notice;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    %[2]s
}
`, dir, server(addr))
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	startGroup(t, addr, bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;")
	return addr
}

// startGroup runs bin in a process group of its own (nginx's workers
// outlive a killed master), its output in a file, waits until it accepts
// on addr, and at cleanup stops the group: SIGTERM, then SIGKILL after 3 s.
func startGroup(t *testing.T, addr, bin string, args ...string) {
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(3 * time.Second):
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		out.Close()
	})
	if err := testenv.WaitAccept(addr, exited); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("%s: %v\n%s", bin, err, b)
	}
}

// TestBackslashPathsThroughTheProxy: with /login's quota spent, no form of
// the path that some origin reads as /login reaches that origin's login
// handler through an edge in proxy mode: each is answered 400 or 429 by
// the edge. Paths without those forms, and a backslash in the query, go
// through as before.
func TestBackslashPathsThroughTheProxy(t *testing.T) {
	for _, start := range []func(*testing.T) testOrigin{startNodeOrigin, startGoOrigin, startNginxOrigin} {
		o := start(t)
		t.Run(o.name, func(t *testing.T) {
			e := startEdge(t, edgeOpts{rules: loginRule, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: o.addr}})
			send := func(target string) *wireMsg {
				return exchange(t, e.addr, "GET "+target+" HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n")
			}
			if r := send("/login"); !strings.HasPrefix(r.first, "HTTP/1.1 200") || string(r.body) != loginHandler {
				t.Fatalf("the first /login: %q %q, want 200 from %s's login handler", r.first, r.body, o.name)
			}
			if r := send("/login"); !strings.HasPrefix(r.first, "HTTP/1.1 429") {
				t.Fatalf("the second /login: %q, want 429", r.first)
			}
			for _, p := range pathDodges {
				r := send(p)
				if strings.Contains(string(r.body), loginHandler) {
					t.Errorf("%q reached %s's login handler with /login's quota spent: %q", p, o.name, r.first)
				}
				if !strings.HasPrefix(r.first, "HTTP/1.1 400") && !strings.HasPrefix(r.first, "HTTP/1.1 429") {
					t.Errorf("%q: %q %q, want 400 or 429 from the edge", p, r.first, r.body)
				}
			}
			// Not refused: another path, and a backslash in the query.
			for _, p := range []string{"/other", `/other?q=a\b`, "/other?q=a%5Cb", "/a//b"} {
				if r := send(p); strings.HasPrefix(r.first, "HTTP/1.1 400") || strings.HasPrefix(r.first, "HTTP/1.1 429") {
					t.Errorf("%q: %q %q, want the origin's answer", p, r.first, r.body)
				}
			}
		})
	}
}

// TestBackslashPathsInDecisionMode: the same holds for checks. Directly,
// with /login's quota spent, each form after the check prefix is answered
// 400 or 429, as is a check whose X-Original-URI or X-Forwarded-Uri (the
// target an auth-request proxy says the origin will see) holds one. Through
// nginx's auth_request in front of the Node origin, no form reaches the
// login handler.
func TestBackslashPathsInDecisionMode(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: loginRule})
	status := func(target string, hdr ...string) int {
		raw := "GET " + target + " HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n"
		for i := 0; i+1 < len(hdr); i += 2 {
			raw += hdr[i] + ": " + hdr[i+1] + "\r\n"
		}
		r := exchange(t, e.addr, raw+"\r\n")
		n, _ := strconv.Atoi(strings.Fields(r.first)[1])
		return n
	}
	if s := status("/check/login"); s != 200 {
		t.Fatalf("the first check of /login: %d, want 200", s)
	}
	for _, p := range pathDodges {
		if s := status("/check" + p); s != 400 && s != 429 {
			t.Errorf("check %q: %d, want 400 or 429", "/check"+p, s)
		}
		if strings.ContainsAny(p, "\t") {
			continue // not a header value
		}
		for _, h := range []string{"X-Original-URI", "X-Forwarded-Uri"} {
			if s := status("/check", h, p); s != 400 {
				t.Errorf("check /check with %s %q: %d, want 400", h, p, s)
			}
		}
	}
	for _, tc := range []struct {
		target string
		hdr    []string
	}{{"/check/other", nil}, {`/check/other?q=a\b`, nil}, {"/check", []string{"X-Original-URI", `/other?q=a\b`}},
		{"/check", []string{"X-Forwarded-Uri", "/a//b"}}} {
		if s := status(tc.target, tc.hdr...); s != 200 {
			t.Errorf("check %q %q: %d, want 200", tc.target, tc.hdr, s)
		}
	}
	if n := metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "ambiguous_path"); n == 0 {
		t.Error("no refusal counted in poplimit_edge_bad_requests_total{reason=ambiguous_path}")
	}

	// nginx's auth_request asks the edge, then proxies to Node.
	node := startNodeOrigin(t)
	front := startNginx(t, func(listen string) string {
		return fmt.Sprintf(`server {
        listen %s;
        location / {
            auth_request /_poplimit;
            proxy_pass http://%s;
        }
        location = /_poplimit {
            internal;
            proxy_pass http://%s/check$request_uri;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }
    }`, listen, node.addr, e.addr)
	})
	if r := exchange(t, front, "GET /login HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n"); strings.Contains(string(r.body), loginHandler) {
		t.Fatalf("/login through nginx with its quota spent: %q %q, want a refusal", r.first, r.body)
	}
	if r := exchange(t, front, "GET /other HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n"); !strings.HasPrefix(r.first, "HTTP/1.1 404") {
		t.Fatalf("/other through nginx: %q %q, want Node's 404", r.first, r.body)
	}
	for _, p := range pathDodges {
		r := exchange(t, front, "GET "+p+" HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n")
		if strings.Contains(string(r.body), loginHandler) {
			t.Errorf("%q through nginx reached Node's login handler with /login's quota spent: %q", p, r.first)
		}
	}
}
