package edge_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// wireMsg is one HTTP/1.1 message as read off the wire: its first line,
// its header lines in order as sent, and its body (decoded when chunked).
type wireMsg struct {
	first    string
	fields   [][2]string
	body     []byte
	chunked  bool
	complete bool // the body ended as its framing said
}

// values returns every value of the field name, in any case.
func (m *wireMsg) values(name string) []string {
	var out []string
	for _, f := range m.fields {
		if strings.EqualFold(f[0], name) {
			out = append(out, f[1])
		}
	}
	return out
}

// value returns the field's lines joined by ", ".
func (m *wireMsg) value(name string) string { return strings.Join(m.values(name), ", ") }

func (m *wireMsg) has(name string) bool { return len(m.values(name)) > 0 }

// readWireMsg reads one message from r. A request without Content-Length
// or chunked framing has no body; a response without them (and not
// noBody) runs to the connection's end.
func readWireMsg(r *bufio.Reader, response, noBody bool) (*wireMsg, error) {
	m := &wireMsg{}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	m.first = strings.TrimRight(line, "\r\n")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ":")
		m.fields = append(m.fields, [2]string{name, strings.TrimSpace(value)})
	}
	switch {
	case noBody:
		m.complete = true
	case strings.EqualFold(m.value("Transfer-Encoding"), "chunked"):
		m.chunked = true
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return m, err
			}
			size, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
			n, err := strconv.ParseInt(size, 16, 64)
			if err != nil {
				return m, fmt.Errorf("chunk size %q: %w", line, err)
			}
			if n == 0 {
				for { // trailer section
					line, err := r.ReadString('\n')
					if err != nil {
						return m, err
					}
					if strings.TrimRight(line, "\r\n") == "" {
						m.complete = true
						return m, nil
					}
				}
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(r, chunk); err != nil {
				return m, err
			}
			m.body = append(m.body, chunk[:n]...)
		}
	case m.has("Content-Length"):
		n, err := strconv.Atoi(m.value("Content-Length"))
		if err != nil {
			return m, err
		}
		m.body = make([]byte, n)
		if _, err := io.ReadFull(r, m.body); err != nil {
			return m, err
		}
		m.complete = true
	case response:
		m.body, err = io.ReadAll(r)
		m.complete = err == nil
	default:
		m.complete = true
	}
	return m, nil
}

// rawOrigin is a real HTTP/1.1 origin on a loopback port that writes its
// responses byte for byte and records every request as it came on the
// wire, finished or not.
type rawOrigin struct {
	addr    string
	mu      sync.Mutex
	reqs    []*wireMsg
	conns   map[net.Conn]bool
	accepts atomic.Int32
}

// startRawOrigin serves until the test ends; respond returns the raw
// response to a request (nil: the connection is closed unanswered).
func startRawOrigin(t *testing.T, respond func(*wireMsg) []byte) *rawOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &rawOrigin{addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		o.mu.Lock()
		for c := range o.conns {
			c.Close()
		}
		o.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.accepts.Add(1)
			o.mu.Lock()
			o.conns[c] = true
			o.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					m, err := readWireMsg(br, false, false)
					if m != nil {
						o.mu.Lock()
						o.reqs = append(o.reqs, m)
						o.mu.Unlock()
					}
					if err != nil {
						return
					}
					resp := respond(m)
					if resp == nil {
						return
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	return o
}

// requests returns the requests the origin read so far.
func (o *rawOrigin) requests() []*wireMsg {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*wireMsg(nil), o.reqs...)
}

// exchange sends raw on a new connection to addr and reads one response.
func exchange(t *testing.T, addr, raw string) *wireMsg {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	m, err := readWireMsg(bufio.NewReader(c), true, strings.HasPrefix(raw, "HEAD "))
	if err != nil {
		t.Fatalf("reading the response to %q: %v", raw, err)
	}
	return m
}

func okResponse(body string) []byte {
	return []byte("HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// hopFields are the hop-by-hop fields of RFC 9110 §7.6.1 that a proxy
// removes, and those before it that other proxies still send.
var hopFields = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "TE", "Trailer", "Upgrade"}

// TestProxyHopByHop sends, in both directions, every hop-by-hop field and
// fields named in Connection, and checks none crosses the edge while
// end-to-end fields do, and that Via gets the edge's entry both ways.
func TestProxyHopByHop(t *testing.T) {
	origin := startRawOrigin(t, func(*wireMsg) []byte {
		return []byte("HTTP/1.1 200 OK\r\nX-List: a\r\nContent-Length: 2\r\nConnection: X-Up-Hop, keep-alive\r\nX-Up-Hop: secret\r\n" +
			"keep-alive: timeout=5\r\nX-List: b\r\nProxy-Authenticate: Basic realm=x\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\n" +
			"X-End: origin\r\nVia: 1.0 origin-cache\r\nX-List: c\r\n\r\nok")
	})
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr}})
	resp := exchange(t, e.addr, "GET /h?q=1 HTTP/1.1\r\nX-List: 1\r\nHost: app.example\r\nConnection: keep-alive, X-Client-Hop, x-other-hop\r\n"+
		"X-Client-Hop: 1\r\nX-List: 2\r\nX-Other-Hop: 2\r\nKeep-Alive: 300\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n"+
		"TE: trailers\r\nUpgrade: websocket\r\nX-End: client\r\nVia: 1.1 corp-proxy\r\nX-List: 3\r\n\r\n")
	reqs := origin.requests()
	if len(reqs) != 1 {
		t.Fatalf("origin got %d requests, want 1", len(reqs))
	}
	up := reqs[0]
	if up.first != "GET /h?q=1 HTTP/1.1" {
		t.Errorf("request line upstream %q, want %q", up.first, "GET /h?q=1 HTTP/1.1")
	}
	for _, f := range append(hopFields, "X-Client-Hop", "X-Other-Hop", "Transfer-Encoding") {
		if up.has(f) {
			t.Errorf("upstream got hop-by-hop %s: %q", f, up.values(f))
		}
	}
	for _, tc := range []struct{ name, want string }{
		{"Host", "app.example"}, {"X-End", "client"}, {"Via", "1.1 corp-proxy, 1.1 poplimit"}, {"X-List", "1, 2, 3"},
		{"X-Forwarded-For", "127.0.0.1"}, {"X-Forwarded-Proto", "http"}, {"X-Forwarded-Host", "app.example"},
	} {
		if got := up.value(tc.name); got != tc.want {
			t.Errorf("upstream %s = %q, want %q", tc.name, got, tc.want)
		}
	}

	if !strings.HasPrefix(resp.first, "HTTP/1.1 200") || string(resp.body) != "ok" {
		t.Fatalf("response %q %q, want 200 ok", resp.first, resp.body)
	}
	for _, f := range append(hopFields, "X-Up-Hop") {
		if resp.has(f) {
			t.Errorf("client got hop-by-hop %s: %q", f, resp.values(f))
		}
	}
	for _, tc := range []struct{ name, want string }{
		{"X-End", "origin"}, {"Via", "1.0 origin-cache, 1.1 poplimit"}, {"X-List", "a, b, c"},
	} {
		if got := resp.value(tc.name); got != tc.want {
			t.Errorf("client %s = %q, want %q", tc.name, got, tc.want)
		}
	}
	if !resp.has("RateLimit") {
		t.Error("the proxied response lost the quota headers")
	}

	// An HTTP/1.0 request is received as 1.0, and says so in Via.
	exchange(t, e.addr, "GET /old HTTP/1.0\r\nHost: app.example\r\n\r\n")
	if reqs := origin.requests(); len(reqs) != 2 || reqs[1].value("Via") != "1.0 poplimit" {
		t.Errorf("HTTP/1.0 request: upstream Via %q, want %q", reqs[len(reqs)-1].value("Via"), "1.0 poplimit")
	}
}

// TestProxyForwardingFields checks X-Forwarded-For/-Proto/-Host and
// Forwarded as the edge sends them: appended to a trusted proxy's,
// replacing an untrusted client's.
func TestProxyForwardingFields(t *testing.T) {
	origin := startRawOrigin(t, func(*wireMsg) []byte { return okResponse("ok") })
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	tests := []struct {
		name    string
		trusted []netip.Prefix
		fwd     clientaddr.Forwarding
		ipHdr   string
		sent    string // header lines sent, each ending in \r\n
		want    map[string]string
	}{
		{"untrusted client's fields replaced", nil, "", "CF-Connecting-IP",
			"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\nForwarded: for=6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\n",
			map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "app.example",
				"Forwarded": "", "CF-Connecting-IP": ""}},
		{"no fields sent", nil, "", "", "",
			map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "app.example"}},
		{"trusted proxy's chain, this hop appended", loopback, "", "",
			"X-Forwarded-For: 6.6.6.6, 203.0.113.5\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: public.example\r\n",
			map[string]string{"X-Forwarded-For": "6.6.6.6, 203.0.113.5, 127.0.0.1", "X-Forwarded-Proto": "https",
				"X-Forwarded-Host": "public.example"}},
		{"trusted proxy's lines joined", loopback, "", "",
			"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 203.0.113.5, 127.0.0.2\r\n",
			map[string]string{"X-Forwarded-For": "6.6.6.6, 203.0.113.5, 127.0.0.2, 127.0.0.1", "X-Forwarded-Proto": "http",
				"X-Forwarded-Host": "app.example"}},
		{"trusted proxy's client IP header kept and used", loopback, "", "CF-Connecting-IP",
			"CF-Connecting-IP: 2001:db8::7\r\nX-Forwarded-For: 198.51.100.1\r\n",
			map[string]string{"X-Forwarded-For": "198.51.100.1, 127.0.0.1", "CF-Connecting-IP": "2001:db8::7"}},
		{"Forwarded appended for a trusted proxy", loopback, clientaddr.Forwarded, "",
			"Forwarded: for=203.0.113.5;proto=https\r\n",
			map[string]string{"Forwarded": `for=203.0.113.5;proto=https, for=127.0.0.1;host="app.example";proto=http`,
				"X-Forwarded-For": "127.0.0.1"}},
		{"Forwarded replaced for an untrusted client", nil, clientaddr.Forwarded, "",
			"Forwarded: for=6.6.6.6\r\n",
			map[string]string{"Forwarded": `for=127.0.0.1;host="app.example";proto=http`, "X-Forwarded-For": "127.0.0.1"}},
		{"IPv6 client in Forwarded", loopback, clientaddr.Forwarded, "",
			"Forwarded: for=\"[2001:db8::1]:4711\"\r\n",
			map[string]string{"Forwarded": `for="[2001:db8::1]:4711", for=127.0.0.1;host="app.example";proto=http`,
				"X-Forwarded-For": "127.0.0.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr,
				TrustedProxies: tc.trusted, Forwarding: tc.fwd, ClientIPHeader: tc.ipHdr}})
			n := len(origin.requests())
			if resp := exchange(t, e.addr, "GET / HTTP/1.1\r\nHost: app.example\r\n"+tc.sent+"\r\n"); !strings.HasPrefix(resp.first, "HTTP/1.1 200") {
				t.Fatalf("status %q, want 200", resp.first)
			}
			up := origin.requests()[n]
			for name, want := range tc.want {
				if got := up.value(name); got != want {
					t.Errorf("upstream %s = %q, want %q", name, got, want)
				}
				if want == "" && up.has(name) {
					t.Errorf("upstream got %s %q, want it removed", name, up.values(name))
				}
			}
		})
	}
}

// TestProxyTLS proxies for a TLS listener: the upstream hears plain HTTP
// with X-Forwarded-Proto https.
func TestProxyTLS(t *testing.T) {
	origin := startRawOrigin(t, func(*wireMsg) []byte { return okResponse("over tls") })
	certFile, keyFile, cert := writeCert(t, t.TempDir(), "edge")
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr,
		TLSCert: certFile, TLSKey: keyFile}})
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c, err := tls.Dial("tcp", e.addr, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /secure HTTP/1.1\r\nHost: app.example\r\n\r\n")
	resp, err := readWireMsg(bufio.NewReader(c), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.first, "HTTP/1.1 200") || string(resp.body) != "over tls" {
		t.Fatalf("over TLS: %q %q, want 200 from the origin", resp.first, resp.body)
	}
	up := origin.requests()[0]
	if got := up.value("X-Forwarded-Proto"); got != "https" {
		t.Errorf("X-Forwarded-Proto = %q, want https", got)
	}
	if up.first != "GET /secure HTTP/1.1" {
		t.Errorf("request line upstream %q", up.first)
	}
}

// patternReader yields n bytes of a fixed pseudo-random pattern.
type patternReader struct {
	n   int64
	off int
}

var pattern = func() []byte {
	b := make([]byte, 64<<10)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	n := 0
	for n < len(b) {
		c := copy(b[n:], pattern[p.off:])
		p.off = (p.off + c) % len(pattern)
		n += c
	}
	p.n -= int64(n)
	return n, nil
}

func patternCRC(n int64) uint32 {
	h := crc32.NewIEEE()
	io.Copy(h, &patternReader{n: n})
	return h.Sum32()
}

// vmRSS returns the process's resident set size in bytes.
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// TestProxyStreamsBodies sends a 100 MB upload and a 100 MB download
// through one edge, with Content-Length and chunked, and checks every byte
// arrives while the resident memory of the process (client, edge and
// origin together) stays flat: nothing buffers a body.
func TestProxyStreamsBodies(t *testing.T) {
	const size = 100 << 20
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			h := crc32.NewIEEE()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%d %08x %v", n, h.Sum32(), r.TransferEncoding)
		case "/download":
			n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			if r.URL.Query().Get("chunked") == "" {
				w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			}
			io.Copy(w, &patternReader{n: n})
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go origin.Serve(ln)
	t.Cleanup(func() { origin.Close() })
	e := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 1000, window: 1m}]", cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: ln.Addr().String(),
		UpstreamTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute}})
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()

	upload := func(n int64, chunked bool) string {
		t.Helper()
		var body io.Reader = &patternReader{n: n}
		req, _ := http.NewRequest("PUT", "http://"+e.addr+"/upload", body)
		req.ContentLength = n
		if chunked {
			req.ContentLength = -1
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("upload of %d bytes (chunked %v): %d %s", n, chunked, resp.StatusCode, got)
		}
		return string(got)
	}
	download := func(n int64, chunked bool) (int64, uint32) {
		t.Helper()
		url := fmt.Sprintf("http://%s/download?n=%d", e.addr, n)
		if chunked {
			url += "&chunked=1"
		}
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("download: status %d", resp.StatusCode)
		}
		if want := n; !chunked && resp.ContentLength != want {
			t.Errorf("download Content-Length %d, want %d", resp.ContentLength, want)
		}
		h := crc32.NewIEEE()
		got, err := io.Copy(h, resp.Body)
		if err != nil {
			t.Fatalf("download (chunked %v) after %d bytes: %v", chunked, got, err)
		}
		return got, h.Sum32()
	}

	// Warm up every path, then measure from a collected heap.
	upload(1<<20, false)
	download(1<<20, true)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	allocBefore := ms.TotalAlloc
	before := vmRSS(t)
	var peak atomic.Int64
	peak.Store(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if r := vmRSS(t); r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	}()
	start := time.Now()
	want := fmt.Sprintf("%d %08x", size, patternCRC(size))
	if got := upload(size, false); got != want+" []" {
		t.Errorf("upload with Content-Length: origin saw %q, want %q", got, want+" []")
	}
	if got := upload(size, true); got != want+" [chunked]" {
		t.Errorf("chunked upload: origin saw %q, want %q", got, want+" [chunked]")
	}
	for _, chunked := range []bool{false, true} {
		if n, crc := download(size, chunked); fmt.Sprintf("%d %08x", n, crc) != want {
			t.Errorf("download (chunked %v): got %d bytes crc %08x, want %s", chunked, n, crc, want)
		}
	}
	close(stop)
	<-sampled
	runtime.ReadMemStats(&ms)
	allocated := ms.TotalAlloc - allocBefore
	growth := peak.Load() - before
	t.Logf("4 × 100 MiB through the edge in %v: VmRSS %.1f MiB before, %.1f MiB at most during (+%.1f MiB); %.1f MiB allocated by the process",
		time.Since(start).Round(time.Millisecond), float64(before)/(1<<20), float64(peak.Load())/(1<<20), float64(growth)/(1<<20),
		float64(allocated)/(1<<20))
	// Buffering one body would allocate its 100 MiB at least.
	if allocated > 32<<20 {
		t.Errorf("%.1f MiB allocated while 400 MiB streamed, want a small fraction of one body", float64(allocated)/(1<<20))
	}
	// The race detector's own memory makes the resident size noisy.
	if !edgetest.Race && growth > 48<<20 {
		t.Errorf("VmRSS grew %.1f MiB while 100 MiB bodies streamed, want well under a body's size", float64(growth)/(1<<20))
	}
}

// countingOrigin is a real HTTP server that counts its requests, answers
// /health with health (200 unless set), and everything else with status.
type countingOrigin struct {
	addr   string
	hits   atomic.Int64
	checks atomic.Int64 // health checks
	health atomic.Int32
	status atomic.Int32
}

func startCountingOrigin(t *testing.T) *countingOrigin {
	t.Helper()
	o := &countingOrigin{}
	o.health.Store(200)
	o.status.Store(200)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			o.checks.Add(1)
			w.WriteHeader(int(o.health.Load()))
			return
		}
		o.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(int(o.status.Load()))
		io.WriteString(w, o.addr)
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// TestProxyRoundRobinAndHealthChecks spreads requests over three
// upstreams, skips the one failing its health checks, and takes it back
// once it passes.
func TestProxyRoundRobinAndHealthChecks(t *testing.T) {
	ups := []*countingOrigin{startCountingOrigin(t), startCountingOrigin(t), startCountingOrigin(t)}
	e := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 1000000, window: 1m}]", cfg: httpedge.Config{Mode: httpedge.Proxy,
		Upstream:           ups[0].addr + ", " + ups[1].addr + "," + ups[2].addr,
		UpstreamHealthPath: "/health", UpstreamHealthInterval: 30 * time.Millisecond, UpstreamHealthTimeout: 30 * time.Millisecond,
		UpstreamHealthThreshold: 2}})
	healthy := func(o *countingOrigin) float64 {
		return metricSum(t, e, "poplimit_edge_upstream_healthy", "upstream", o.addr)
	}
	round := func(n int) []int64 {
		t.Helper()
		var before []int64
		for _, o := range ups {
			before = append(before, o.hits.Load())
		}
		for i := 0; i < n; i++ {
			if s := get(t, e.addr, "/x").StatusCode; s != 200 {
				t.Fatalf("request %d: status %d", i, s)
			}
		}
		var got []int64
		for i, o := range ups {
			got = append(got, o.hits.Load()-before[i])
		}
		return got
	}
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests over 3 healthy upstreams: %v, want [10 10 10]", got)
	}
	ups[1].health.Store(503)
	testenv.WaitFor(t, 5*time.Second, "the failing upstream marked unhealthy", func() bool { return healthy(ups[1]) == 0 })
	if got := round(30); fmt.Sprint(got) != "[15 0 15]" {
		t.Errorf("30 requests with the second upstream failing its checks: %v, want [15 0 15]", got)
	}
	ups[1].health.Store(200)
	testenv.WaitFor(t, 5*time.Second, "the upstream back", func() bool { return healthy(ups[1]) == 1 })
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests after it passed again: %v, want [10 10 10]", got)
	}
	// All failing: requests still go to all of them rather than none.
	for _, o := range ups {
		o.health.Store(500)
	}
	testenv.WaitFor(t, 5*time.Second, "all upstreams unhealthy", func() bool {
		return healthy(ups[0])+healthy(ups[1])+healthy(ups[2]) == 0
	})
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests with every upstream failing its checks: %v, want [10 10 10]", got)
	}
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	// The checks stop with the edge.
	e.shutdown(t)
	time.Sleep(100 * time.Millisecond) // a check in flight ends within its timeout
	n := ups[0].checks.Load()
	time.Sleep(200 * time.Millisecond)
	if got := ups[0].checks.Load(); got != n {
		t.Errorf("%d health checks after the edge stopped, want none", got-n)
	}
}

// TestProxyClientConnection keeps the client's connection when the
// upstream closes its own, and answers HEAD with the upstream's length
// and no body.
func TestProxyClientConnection(t *testing.T) {
	origin := startRawOrigin(t, func(m *wireMsg) []byte {
		if strings.HasPrefix(m.first, "HEAD ") {
			return []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
		}
		return []byte("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")
	})
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr}})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for i, method := range []string{"GET", "GET", "HEAD"} {
		fmt.Fprintf(c, "%s /c%d HTTP/1.1\r\nHost: x\r\n\r\n", method, i)
		resp, err := readWireMsg(br, true, method == "HEAD")
		if err != nil {
			t.Fatalf("%s %d on one connection: %v", method, i, err)
		}
		if !strings.HasPrefix(resp.first, "HTTP/1.1 200") || resp.has("Connection") {
			t.Errorf("%s %d: %q Connection %q, want 200 on a kept connection", method, i, resp.first, resp.values("Connection"))
		}
		if method == "HEAD" && resp.value("Content-Length") != "5" {
			t.Errorf("HEAD: Content-Length %q, want the upstream's 5", resp.value("Content-Length"))
		}
		if method == "GET" && string(resp.body) != "hello" {
			t.Errorf("GET %d: body %q", i, resp.body)
		}
	}
}

// closingOrigin accepts connections and closes each at once: every
// request sent to it fails with a connection error.
func closingOrigin(t *testing.T) *rawOrigin {
	return startRawOrigin(t, func(*wireMsg) []byte { return nil })
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func send(t *testing.T, addr, method, path string, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader("payload"))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestProxyRetries(t *testing.T) {
	const rules = "rules: [{name: p, limit: 1000000, window: 1m}]"
	t.Run("idempotent requests go to the next upstream", func(t *testing.T) {
		good := startCountingOrigin(t)
		e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: deadAddr(t) + "," + good.addr}})
		for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"} {
			for i := 0; i < 2; i++ { // one of the two picks the dead upstream first
				if s := send(t, e.addr, m, "/r"); s != 200 {
					t.Errorf("%s %d with one upstream refusing connections: %d, want 200", m, i, s)
				}
			}
		}
		if n := metricSum(t, e, "poplimit_edge_upstream_retries_total"); n != 6 {
			t.Errorf("retries counted %v, want 6", n)
		}
		codes := map[int]int{}
		for i := 0; i < 4; i++ {
			codes[send(t, e.addr, "POST", "/r")]++
		}
		if codes[200] != 2 || codes[502] != 2 {
			t.Errorf("4 POSTs without an idempotency key: %v, want 2×200 and 2×502 (never retried)", codes)
		}
		codes = map[int]int{}
		for i := 0; i < 4; i++ {
			codes[send(t, e.addr, "PATCH", "/r", "Idempotency-Key", "k"+strconv.Itoa(i))]++
		}
		if codes[200] != 4 {
			t.Errorf("4 PATCHes with Idempotency-Key: %v, want 4×200", codes)
		}
	})
	t.Run("at most the configured retries", func(t *testing.T) {
		for _, tc := range []struct {
			retries, attempts int
		}{{-1, 1}, {0, 2}, {2, 3}} {
			closers := []*rawOrigin{closingOrigin(t), closingOrigin(t), closingOrigin(t), closingOrigin(t)}
			var list []string
			for _, c := range closers {
				list = append(list, c.addr)
			}
			e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: strings.Join(list, ","),
				UpstreamRetries: tc.retries}})
			if s := send(t, e.addr, "GET", "/r"); s != 502 {
				t.Errorf("retries %d: GET to upstreams that all close: %d, want 502", tc.retries, s)
			}
			var attempts int32
			for _, c := range closers {
				attempts += c.accepts.Load()
			}
			if attempts != int32(tc.attempts) {
				t.Errorf("UpstreamRetries %d: %d attempts, want %d", tc.retries, attempts, tc.attempts)
			}
		}
	})
	t.Run("never after a response or a timeout", func(t *testing.T) {
		a, b := startCountingOrigin(t), startCountingOrigin(t)
		a.status.Store(503)
		b.status.Store(503)
		e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: a.addr + "," + b.addr,
			UpstreamTimeout: 300 * time.Millisecond}})
		if s := send(t, e.addr, "GET", "/r"); s != 503 {
			t.Errorf("upstream answering 503: %d, want its 503", s)
		}
		if n := a.hits.Load() + b.hits.Load(); n != 1 {
			t.Errorf("a 503 was sent %d times, want 1", n)
		}
		slow := startRawOrigin(t, func(*wireMsg) []byte { time.Sleep(time.Second); return okResponse("late") })
		e2 := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: slow.addr,
			UpstreamTimeout: 300 * time.Millisecond}})
		if s := send(t, e2.addr, "GET", "/slow"); s != 504 {
			t.Errorf("slow upstream: %d, want 504", s)
		}
		if n := len(slow.requests()); n != 1 {
			t.Errorf("the slow upstream got the request %d times, want 1: a timeout is not retried", n)
		}
		if n := metricSum(t, e2, "poplimit_edge_upstream_errors_total", "kind", "timeout"); n != 1 {
			t.Errorf("timeouts counted %v, want 1", n)
		}
	})
}

// TestProxyRefusesSmuggling sends request framings that could smuggle a
// second request and checks each is answered 400 before any decision,
// with the connection closed, and reaches no upstream; each case says
// whether fasthttp refuses it by itself or the edge's check does.
func TestProxyRefusesSmuggling(t *testing.T) {
	origin := startRawOrigin(t, func(*wireMsg) []byte { return okResponse("ok") })
	e := startEdge(t, edgeOpts{rules: "rules: [{name: one, limit: 1, window: 1m}]",
		cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr}})
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	tests := []struct {
		name, raw string
		by        string // "fasthttp" or "edge": who refuses
		reason    string // the edge's metric label
	}{
		{"CL.TE", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, "edge", "content_length_and_transfer_encoding"},
		{"TE.CL", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5c\r\n" + smuggled + "\r\n0\r\n\r\n", "edge", "content_length_and_transfer_encoding"},
		{"duplicate Content-Length, different", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd" + smuggled, "fasthttp", ""},
		{"duplicate Content-Length, same", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\ncontent-length: 4\r\n\r\nabcd", "fasthttp", ""},
		{"Content-Length list", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 40\r\n\r\nabcd", "fasthttp", ""},
		{"Content-Length signed", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +4\r\n\r\nabcd", "fasthttp", ""},
		{"Transfer-Encoding identity", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 4\r\n\r\nabcd", "edge", "transfer_encoding"},
		{"Transfer-Encoding identity alone", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, "edge", "transfer_encoding"},
		{"Transfer-Encoding gzip", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "fasthttp", ""},
		{"Transfer-Encoding gzip, chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "fasthttp", ""},
		{"Transfer-Encoding chunked, chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "fasthttp", ""},
		{"two Transfer-Encoding lines", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "fasthttp", ""},
		{"Transfer-Encoding with a space before the colon", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\nabcd", "fasthttp", ""},
		{"Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "fasthttp", ""},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n", "edge", "obs_fold"},
		{"obs-fold with a tab", "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n\tb\r\n\r\n", "edge", "obs_fold"},
		{"obs-fold hiding Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-Note: x\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "edge", "obs_fold"},
		{"first header line folded", "GET / HTTP/1.1\r\n Host: x\r\n\r\n", "fasthttp", ""},
		{"chunk size not hex", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk size negative", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nabc\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk size 0x", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk size overflowing", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000003\r\nabc\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk size with a bare LF", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk longer than its size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n", "edge", "chunk"},
		{"second chunk malformed", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nq\r\n0\r\n\r\n", "edge", "chunk"},
		{"chunk extension with a space before ;", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3 ;x\r\nabc\r\n0\r\n\r\n", "edge", "chunk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, tc.raw)
			br := bufio.NewReader(c)
			resp, err := readWireMsg(br, true, false)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			if !strings.HasPrefix(resp.first, "HTTP/1.1 400") {
				t.Fatalf("answered %q %q, want 400", resp.first, resp.body)
			}
			ct := resp.value("Content-Type")
			switch {
			case tc.by == "edge" && ct != "application/problem+json":
				t.Errorf("Content-Type %q %q: want the edge's problem+json", ct, resp.body)
			case tc.by == "fasthttp" && !strings.HasPrefix(ct, "text/plain"):
				t.Errorf("Content-Type %q %q: want fasthttp's own text/plain refusal", ct, resp.body)
			}
			if tc.reason != "" {
				if n := metricSum(t, e, "poplimit_edge_framing_refused_total", "reason", tc.reason); n < 1 {
					t.Errorf("framing_refused_total{reason=%q} = %v, want it counted", tc.reason, n)
				}
			}
			if rest, _ := io.ReadAll(br); len(rest) > 0 {
				t.Errorf("after the 400 the edge sent more: %q", rest)
			}
		})
	}
	if reqs := origin.requests(); len(reqs) != 0 {
		t.Errorf("the origin got %d requests, first %q, want none", len(reqs), reqs[0].first)
	}
	if n := metricSum(t, e, "poplimit_edge_requests_total"); n != 0 {
		t.Errorf("%v decisions for refused framings, want none", n)
	}
	// Nothing was spent: the one request of the minute is still there.
	if resp := exchange(t, e.addr, "POST /fine HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"); !strings.HasPrefix(resp.first, "HTTP/1.1 200") {
		t.Errorf("a well-framed chunked request after the refused ones: %q, want 200", resp.first)
	}
	if reqs := origin.requests(); len(reqs) != 1 || string(reqs[0].body) != "abc" || reqs[0].value("Content-Length") != "3" || reqs[0].chunked {
		t.Errorf("the origin got %d requests, want the one small chunked body forwarded with Content-Length 3", len(reqs))
	}
}

// TestProxyMalformedChunkLate sends a chunked body whose framing breaks
// after the part the edge reads before deciding: the client is answered
// 400 and the upstream never gets a complete request.
func TestProxyMalformedChunkLate(t *testing.T) {
	origin := startRawOrigin(t, func(*wireMsg) []byte { return okResponse("ok") })
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: origin.addr}})
	big := strings.Repeat("a", 100<<10)
	raw := fmt.Sprintf("POST /late HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n"+
		"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", len(big), big)
	resp := exchange(t, e.addr, raw)
	if !strings.HasPrefix(resp.first, "HTTP/1.1 400") {
		t.Errorf("a chunk broken after 100 KiB: %q %q, want 400", resp.first, resp.body)
	}
	testenv.WaitFor(t, 5*time.Second, "the upstream's request to end", func() bool { return len(origin.requests()) > 0 })
	for _, r := range origin.requests() {
		if r.complete || strings.Contains(r.first, "smuggled") {
			t.Errorf("the upstream got %q with %d body bytes, complete %v: want only an unfinished request", r.first, len(r.body), r.complete)
		}
	}
}

func TestProxyConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  httpedge.Config
		want []string // substrings of the error; none: valid
	}{
		{"one upstream", httpedge.Config{Mode: httpedge.Proxy, Upstream: "127.0.0.1:8080"}, nil},
		{"a list", httpedge.Config{Mode: httpedge.Proxy, Upstream: "a.internal:80, b.internal:80,[::1]:8080"}, nil},
		{"no port", httpedge.Config{Mode: httpedge.Proxy, Upstream: "a.internal"}, []string{`Upstream "a.internal"`, "must be host:port"}},
		{"bad entries", httpedge.Config{Mode: httpedge.Proxy, Upstream: "a:80,,b:0,http://c:80,a:80"},
			[]string{"empty entry", `"b:0": port must be 1 to 65535`, `"http://c:80": must be host:port`, `"a:80": listed twice`}},
		{"bad proxy fields", httpedge.Config{Mode: httpedge.Proxy, Upstream: "a:80", UpstreamConns: -1, UpstreamRetries: 11,
			UpstreamHealthPath: "health", UpstreamHealthThreshold: -2, UpstreamHealthInterval: -time.Second,
			UpstreamIdempotencyHeader: "Idem Key"},
			[]string{"UpstreamConns -1", "UpstreamRetries 11", `UpstreamHealthPath "health"`, "UpstreamHealthThreshold -2",
				"UpstreamHealthInterval -1s", `UpstreamIdempotencyHeader "Idem Key"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to say %q", err, w)
				}
			}
		})
	}
}

// FuzzParseUpstreams checks that any list either fails or parses into at
// most MaxUpstreams distinct host:port entries that parse back the same.
func FuzzParseUpstreams(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8080", "a:1, b:2,c:3", "[::1]:80", "a:80,a:80", "a", ":80", "a:99999",
		"a:80,", " a:80 ", "http://a:80", "a:80/x", strings.Repeat("h:1,", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := httpedge.ParseUpstreams(s)
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > httpedge.MaxUpstreams {
			t.Fatalf("ParseUpstreams(%q) = %d entries, want 1 to %d", s, len(got), httpedge.MaxUpstreams)
		}
		seen := map[string]bool{}
		for _, a := range got {
			host, port, err := net.SplitHostPort(a)
			if err != nil || host == "" || port == "" || seen[a] {
				t.Fatalf("ParseUpstreams(%q) gave %q: not a distinct host:port", s, a)
			}
			seen[a] = true
		}
		again, err := httpedge.ParseUpstreams(strings.Join(got, ","))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
			t.Fatalf("ParseUpstreams(%q) = %q, which parses back as %q, %v", s, got, again, err)
		}
	})
}
