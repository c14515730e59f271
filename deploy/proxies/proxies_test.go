package proxies_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// TestMain removes the edge binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveCommands()
	os.Exit(code)
}

// edgeBinary returns the path of cmd/edge, built once per test binary
// without the race detector, as it is deployed.
func edgeBinary(t testing.TB) string { return testenv.Command(t, "edge") }

// lockedBuffer is a process's output, safe for concurrent use.
type lockedBuffer = testenv.LockedBuffer

// proc is a process a test started, in a process group of its own so that
// its children (nginx's workers) go with it. Cleanup stops it with SIGTERM,
// then SIGKILL to the group after 3 s, and logs its output if the test
// failed.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan struct{}
	err  error // after done
}

func startProc(t testing.TB, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: filepath.Base(bin), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 3*time.Second)
		if t.Failed() {
			t.Logf("%s %s output:\n%s", p.name, strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// stop sends sig, waits up to d, then kills the process group.
func (p *proc) stop(sig syscall.Signal, d time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	p.resume() // a paused process takes no signal but SIGKILL
	select {
	case <-p.done:
	case <-time.After(d):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// pause stops the process with SIGSTOP, as a hung server, and waits until
// every thread of it is stopped (the signal is delivered asynchronously).
func (p *proc) pause(t testing.TB) {
	t.Helper()
	pid := p.cmd.Process.Pid
	p.cmd.Process.Signal(syscall.SIGSTOP)
	waitFor(t, 2*time.Second, fmt.Sprintf("%s stopped by SIGSTOP", p.name), func() bool {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread exited
			}
			// pid (comm) state ...: comm may hold spaces and parentheses.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				return false
			}
		}
		return len(stats) > 0
	})
}

// resume continues a paused process.
func (p *proc) resume() { p.cmd.Process.Signal(syscall.SIGCONT) }

// kill stops the process at once, as a crash would.
func (p *proc) kill() { p.stop(syscall.SIGKILL, time.Second) }

// waitAccept waits until addr accepts or the process exits.
func (p *proc) waitAccept(t testing.TB, addr string) {
	t.Helper()
	exited := make(chan struct{})
	go func() {
		<-p.done
		close(exited)
	}()
	if err := testenv.WaitAccept(addr, exited); err != nil {
		t.Fatalf("%s: %v; output:\n%s", p.name, err, p.out.String())
	}
}

var edgeStarted = regexp.MustCompile(`msg="edge: started" listen=(\S+) admin=(\S+)`)

// edgeProc is a running cmd/edge.
type edgeProc struct {
	*proc
	addr, admin string
}

// startEdge runs cmd/edge with the given rules and flags (-listen and
// -admin are added, on ports the edge picks) and waits until it serves.
func startEdge(t testing.TB, rules string, args ...string) *edgeProc {
	t.Helper()
	bin := edgeBinary(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	args = append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-rules", path}, args...)
	p := startProc(t, nil, bin, args...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := edgeStarted.FindStringSubmatch(p.out.String()); m != nil {
			return &edgeProc{proc: p, addr: m[1], admin: m[2]}
		}
		select {
		case <-p.done:
			t.Fatalf("edge exited (%v) before serving:\n%s", p.err, p.out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("edge did not start within 10s:\n%s", p.out.String())
		}
	}
}

// port returns the port of a host:port.
func port(t testing.TB, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
}

// seen is one request as the origin received it.
type seen struct {
	Method string      `json:"method"`
	URI    string      `json:"uri"`
	Host   string      `json:"host"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
	Remote string      `json:"remote"`
}

// origin is an HTTP server on loopback that records every request and
// echoes it back as JSON. Its methods are safe for concurrent use.
type origin struct {
	addr string
	mu   sync.Mutex
	reqs []seen
}

func startOrigin(t testing.TB) *origin {
	t.Helper()
	o := &origin{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		s := seen{Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), Body: string(body), Remote: r.RemoteAddr}
		o.mu.Lock()
		o.reqs = append(o.reqs, s)
		o.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// requests returns a copy of what the origin has received.
func (o *origin) requests() []seen {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]seen(nil), o.reqs...)
}

// recorder is a decision endpoint stand-in that records what a proxy sends
// it and allows everything with the quota fields of a policy "rec".
type recorder struct {
	origin
}

func startRecorder(t testing.TB) *recorder {
	t.Helper()
	r := &recorder{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<16))
		s := seen{Method: req.Method, URI: req.RequestURI, Host: req.Host, Header: req.Header.Clone(), Body: string(body), Remote: req.RemoteAddr}
		r.mu.Lock()
		r.reqs = append(r.reqs, s)
		r.mu.Unlock()
		w.Header().Set("RateLimit-Policy", `"rec";q=10;w=60`)
		w.Header().Set("RateLimit", `"rec";r=9;t=60`)
		w.Header().Set("X-RateLimit-Limit", "10")
		w.Header().Set("X-RateLimit-Remaining", "9")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Unix()+60, 10))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return r
}

// client is an HTTP client whose connections come from a given loopback
// address, so that tests can tell clients apart behind a proxy.
type client struct {
	ip string
	c  *http.Client
}

func newClient(t testing.TB, ip string) *client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 2 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{ip: ip, c: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// reply is what a client saw.
type reply struct {
	status  int
	header  http.Header
	body    []byte
	elapsed time.Duration
}

// do sends one request to addr; host, when not empty, is its Host, and hdr
// are header lines as name, value pairs (a name may repeat).
func (c *client) do(t testing.TB, method, addr, target, host, body string, hdr ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+addr+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	begin := time.Now()
	resp, err := c.c.Do(req)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", method, target, c.ip, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s from %s: reading the body: %v", method, target, c.ip, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b, elapsed: time.Since(begin)}
}

// echoed decodes the origin's echo in an allowed reply.
func (r reply) echoed(t testing.TB) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatalf("status %d, body %q: not the origin's echo: %v", r.status, r.body, err)
	}
	return s
}

// sfItem parses one RateLimit or RateLimit-Policy item, `"name";k=v;k=v`
// (draft-ietf-httpapi-ratelimit-headers, structured fields).
func sfItem(t testing.TB, field, v string) (string, map[string]int64) {
	t.Helper()
	parts := strings.Split(v, ";")
	name, err := strconv.Unquote(parts[0])
	if err != nil {
		t.Fatalf("%s %q: the policy name is not an sf-string: %v", field, v, err)
	}
	params := map[string]int64{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if !ok || err != nil {
			t.Fatalf("%s %q: parameter %q is not key=integer", field, v, p)
		}
		params[k] = n
	}
	return name, params
}

// quota is what a set of quota fields says.
type quota struct {
	policy    string
	limit     int64 // q= of RateLimit-Policy, X-RateLimit-Limit
	window    int64 // w=, seconds
	remaining int64 // r= of RateLimit, X-RateLimit-Remaining
	reset     int64 // t=, seconds
	present   bool  // any of the fields was there
}

// quotaOf reads the quota fields from h (response or request headers) and
// checks that the draft's fields and the X- fields agree.
func quotaOf(t testing.TB, h http.Header) quota {
	t.Helper()
	var q quota
	names := []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	n := 0
	for _, name := range names {
		if len(h.Values(name)) > 0 {
			n++
		}
	}
	if n == 0 {
		return q
	}
	if n != len(names) {
		t.Fatalf("quota fields %v: some of %v are missing", h, names)
	}
	for _, name := range names {
		if vs := h.Values(name); len(vs) != 1 {
			t.Fatalf("%s: %d lines %q, want 1", name, len(vs), vs)
		}
	}
	q.present = true
	var pp, sp map[string]int64
	q.policy, pp = sfItem(t, "RateLimit-Policy", h.Get("RateLimit-Policy"))
	name, sp := sfItem(t, "RateLimit", h.Get("RateLimit"))
	if name != q.policy {
		t.Fatalf("RateLimit names %q, RateLimit-Policy %q", name, q.policy)
	}
	q.limit, q.window, q.remaining, q.reset = pp["q"], pp["w"], sp["r"], sp["t"]
	if got := h.Get("X-RateLimit-Limit"); got != strconv.FormatInt(q.limit, 10) {
		t.Errorf("X-RateLimit-Limit %q, want %d (q=)", got, q.limit)
	}
	if got := h.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(q.remaining, 10) {
		t.Errorf("X-RateLimit-Remaining %q, want %d (r=)", got, q.remaining)
	}
	reset, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	if now := time.Now().Unix(); err != nil || reset < now-1 || reset > now+q.window+1 {
		t.Errorf("X-RateLimit-Reset %q, want Unix seconds within the window from now (%d)", h.Get("X-RateLimit-Reset"), now)
	}
	return q
}

// problem is poplimit's RFC 9457 refusal body.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Policy     string `json:"policy"`
	Limit      int64  `json:"limit"`
	RetryAfter int64  `json:"retry_after"`
}

// checkRefusal checks that r is poplimit's refusal under policy with limit
// per window seconds: 429, Retry-After, the quota fields with nothing
// remaining, and the problem+json body that agrees with them.
func checkRefusal(t testing.TB, r reply, policy string, limit, window int64) {
	t.Helper()
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d (body %q), want 429", r.status, r.body)
	}
	ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
	// A sliding window may release later than one window from now; the
	// jitter adds up to 2 s.
	if err != nil || ra < 1 || ra > 2*window+3 {
		t.Errorf("Retry-After %q, want whole seconds in [1, %d]", r.header.Get("Retry-After"), 2*window+3)
	}
	q := quotaOf(t, r.header)
	if want := (quota{policy: policy, limit: limit, window: window, remaining: 0, reset: q.reset, present: true}); q != want {
		t.Errorf("quota fields %+v, want %+v", q, want)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("body %q: not JSON: %v", r.body, err)
	}
	want := problem{Type: "https://poplimit.dev/problems/rate-limited", Title: "Too Many Requests", Status: 429,
		Detail: fmt.Sprintf("rate limit %s exceeded: at most %d per %d s", policy, limit, window), Policy: policy, Limit: limit, RetryAfter: ra}
	if p != want {
		t.Errorf("problem %+v, want %+v", p, want)
	}
}

// render reads a configuration file of this directory and replaces each
// ${NAME} of vars in it, as envsubst restricted to those names does; it
// fails if a ${POPLIMIT_...} placeholder is left.
func render(t testing.TB, path string, vars map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for k, v := range vars {
		s = strings.ReplaceAll(s, "${"+k+"}", v)
	}
	if m := regexp.MustCompile(`\$\{POPLIMIT_[A-Z_]+\}`).FindString(s); m != "" {
		t.Fatalf("%s: placeholder %s left unset", path, m)
	}
	return s
}

// env turns a map into NAME=value lines.
func env(vars map[string]string) []string {
	var out []string
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v", what, d)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// downRun is one run of a proxy's "poplimit goes down" scenario: the
// requests answered while poplimit was stopped (hung), after it was killed
// (gone), and once more (again), and the origin's count before them.
type downRun struct {
	o                 *origin
	before            int
	hung, gone, again reply
}

// poplimitDown starts an origin, an edge and the proxy (start, in failure
// mode), checks that a client is decided and refused by poplimit while it
// answers, then stops poplimit (SIGSTOP), and kills it, asking after each.
func poplimitDown(t *testing.T, mode string, start func(t *testing.T, edge, origin, mode string) string) downRun {
	t.Helper()
	o := startOrigin(t)
	e := startEdge(t, testRules, "-trusted-proxies", "127.0.0.1/32")
	site := start(t, e.addr, o.addr, mode)
	a := newClient(t, "127.0.0.2")
	if r := a.do(t, "GET", site, "/about", host, ""); r.status != http.StatusOK || quotaOf(t, r.header).policy != "per-client" {
		t.Fatalf("poplimit up: status %d fields %v, want 200 under per-client", r.status, r.header)
	}
	// Either way, poplimit's refusals are the client's while it answers.
	var r reply
	for range 4 {
		r = a.do(t, "GET", site, "/v1/items", host, "")
	}
	checkRefusal(t, r, "api", 3, 60)
	d := downRun{o: o, before: len(o.requests())}
	e.pause(t)
	d.hung = a.do(t, "GET", site, "/about", host, "")
	e.resume()
	e.kill()
	d.gone = a.do(t, "GET", site, "/about", host, "")
	d.again = a.do(t, "GET", site, "/about", host, "")
	t.Logf("%s: hung: %d in %v; gone: %d in %v; again: %d in %v", mode, d.hung.status, d.hung.elapsed.Round(time.Millisecond),
		d.gone.status, d.gone.elapsed.Round(time.Millisecond), d.again.status, d.again.elapsed.Round(time.Millisecond))
	return d
}
