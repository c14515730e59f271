package httpedge_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
)

// heapBytes is the live heap after a collection.
func heapBytes() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// readFinal reads the first non-1xx response on r.
func readFinal(r *bufio.Reader) (*http.Response, []byte, error) {
	for {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return nil, nil, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 200 {
			return resp, body, nil
		}
	}
}

// TestDecisionBodyHeadsHoldNoMemory is the probe's attack on decision
// mode: many connections each send only a request head declaring a 4 MiB
// body (by Content-Length, by a chunk's size, behind Expect: 100-continue)
// and nothing more. The edge answers each 413 problem+json at once,
// without buffering any of the declared body, so the heap does not grow
// by the declared bodies while the connections are open; the refusals are
// counted.
func TestDecisionBodyHeadsHoldNoMemory(t *testing.T) {
	const (
		conns    = 128
		declared = 4 << 20
		// What a connection may cost the heap: fasthttp's request context
		// and buffers (a read buffer of MaxHeaderSize, a write buffer), the
		// test's reader; far below the declared 4 MiB.
		perConn = 64 << 10
		bound   = conns*perConn + 8<<20
	)
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1000000, window: 1m}]",
		cfg: httpedge.Config{ReadTimeout: 5 * time.Second, DecideToken: decideToken}})
	heads := []struct{ name, head string }{
		{"check, Content-Length", "POST /check/x HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(declared) + "\r\n\r\n"},
		{"decide, Content-Length", "POST /_poplimit/decide HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + decideToken +
			"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(declared) + "\r\n\r\n"},
		{"check, one chunk", "POST /check/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(declared, 16) + "\r\n"},
		{"check, Expect: 100-continue", "POST /check/x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " + strconv.Itoa(declared) + "\r\n\r\n"},
	}
	refused := 0.0
	for _, tc := range heads {
		base := heapBytes()
		var answered atomic.Int64
		statuses := make([]string, conns)
		cs := make([]net.Conn, 0, conns)
		for i := range conns {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.head); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer answered.Add(1)
				resp, body, err := readFinal(bufio.NewReader(c))
				if err != nil {
					statuses[i] = err.Error()
					return
				}
				statuses[i] = strconv.Itoa(resp.StatusCode) + " " + resp.Header.Get("Content-Type") + " " + string(body)
			}()
		}
		// Sample the heap while the connections are open, until every one
		// is answered (or the growth is over the bound, or 4 s pass).
		var peak uint64
		for deadline := time.Now().Add(4 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if h := heapBytes(); h > base {
				peak = max(peak, h-base)
			}
			if answered.Load() == conns || peak > bound || time.Now().After(deadline) {
				break
			}
		}
		for _, c := range cs {
			c.Close()
		}
		t.Logf("%s: %d connections, the heap grew %d KiB at most", tc.name, conns, peak>>10)
		if peak > bound {
			t.Errorf("%s: %d connections declaring %d MiB each grew the heap by %d MiB, want at most %d MiB",
				tc.name, conns, declared>>20, peak>>20, bound>>20)
		}
		for i, s := range statuses {
			if !strings.HasPrefix(s, "413 application/problem+json {") || !strings.Contains(s, `"status":413`) {
				t.Errorf("%s: connection %d answered %.120q, want 413 problem+json", tc.name, i, s)
				break
			}
		}
		refused += conns
		if got := metricSum(t, e, "poplimit_edge_unreadable_requests_total", "reason", "body_too_large"); got != refused {
			t.Errorf("%s: poplimit_edge_unreadable_requests_total{reason=body_too_large} %v, want %v", tc.name, got, refused)
		}
	}
	if s := get(t, e.addr, "/check/x").StatusCode; s != 200 {
		t.Errorf("a check after the attack: %d, want 200", s)
	}
}

// TestDecisionBodyBound: in decision mode a body up to MaxDecisionBody is
// read (a check ignores it, the decide endpoint decides it); one byte more
// is answered 413 problem+json before any decision, for checks and the
// decide endpoint alike, and counted. Proxy mode streams bodies of any
// size past it.
func TestDecisionBodyBound(t *testing.T) {
	const bound = 1024
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1000000, window: 1m}]",
		cfg: httpedge.Config{MaxDecisionBody: bound, DecideToken: decideToken}})
	decide := func(n int) string { // a decide body of n bytes
		head := `{"rule":"api","key":"k","pad":"`
		return head + strings.Repeat("p", n-len(head)-2) + `"}`
	}
	for _, tc := range []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"check at the bound", "POST", "/check/x", "", strings.Repeat("b", bound), 200},
		{"check over the bound", "POST", "/check/x", "", strings.Repeat("b", bound+1), 413},
		{"decide at the bound", "POST", "/_poplimit/decide", decideToken, decide(bound), 200},
		{"decide over the bound", "POST", "/_poplimit/decide", decideToken, decide(bound + 1), 413},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+e.addr+tc.path, strings.NewReader(tc.body))
		if tc.auth != "" {
			req.Header.Set("Authorization", "Bearer "+tc.auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.want)
		}
		if tc.want == 413 && (resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(string(body), `"status":413`) || !strings.Contains(string(body), strconv.Itoa(bound)+" bytes")) {
			t.Errorf("%s: %s %s, want problem+json naming the %d-byte bound", tc.name, resp.Header.Get("Content-Type"), body, bound)
		}
	}
	if got := metricSum(t, e, "poplimit_edge_unreadable_requests_total", "reason", "body_too_large"); got != 2 {
		t.Errorf("poplimit_edge_unreadable_requests_total{reason=body_too_large} %v, want 2", got)
	}

	// Proxy mode: a body over the decision bound streams to the upstream.
	up := upstreamEcho(t)
	p := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1000000, window: 1m}]",
		cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: up, MaxDecisionBody: bound}})
	big := strings.Repeat("u", 1<<20)
	resp, err := client.Post("http://"+p.addr+"/upload", "application/octet-stream", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != strconv.Itoa(len(big)) {
		t.Errorf("proxy mode, a 1 MiB body: %d %.80q, want 200 and the upstream's count %d", resp.StatusCode, body, len(big))
	}
}

// upstreamEcho serves an upstream on loopback answering each request with
// the length of the body it received.
func upstreamEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		io.WriteString(w, strconv.FormatInt(n, 10))
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestUnreadableRequestsCounted: what else the HTTP reader refuses
// before any decision is answered as fasthttp answers it (text/plain; the
// framing refusals of proxy mode keep that form) and counted by reason.
func TestUnreadableRequestsCounted(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{MaxHeaderSize: 4096}})
	counted := map[string]float64{}
	for _, tc := range []struct {
		name, raw, reason string
		want              int
	}{
		{"a head over MaxHeaderSize", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8192) + "\r\n\r\n", "head_too_large", 431},
		{"a malformed request line", "GET\r\n\r\n", "malformed", 400},
		{"a broken chunk", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed", 400},
	} {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		go io.WriteString(c, tc.raw)
		resp, body, err := readFinal(bufio.NewReader(c))
		c.Close()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if resp.StatusCode != tc.want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("%s: %d %s %s, want %d as fasthttp answers it", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.want)
		}
		counted[tc.reason]++
		if got := metricSum(t, e, "poplimit_edge_unreadable_requests_total", "reason", tc.reason); got != counted[tc.reason] {
			t.Errorf("%s: poplimit_edge_unreadable_requests_total{reason=%s} %v, want %v", tc.name, tc.reason, got, counted[tc.reason])
		}
	}
}

// Validate names a body or connection limit out of range, with its value.
func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  httpedge.Config
		want string // "" valid
	}{
		{httpedge.Config{MaxDecisionBody: 4 << 20, MaxConnsPerClient: -1}, ""},
		{httpedge.Config{MaxDecisionBody: 1, MaxConnsPerClient: 1}, ""},
		{httpedge.Config{MaxDecisionBody: -1}, "MaxDecisionBody -1"},
		{httpedge.Config{MaxDecisionBody: 4<<20 + 1}, "MaxDecisionBody 4194305"},
		{httpedge.Config{MaxConnsPerClient: -2}, "MaxConnsPerClient -2"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: Validate() = %v, want nil", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Validate() = %v, want it to say %q", err, tc.want)
		}
	}
}
