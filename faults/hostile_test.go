package faults

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
)

// hostileEdge starts an in-process edge served by its own fasthttp server
// (its header limits and timeouts apply) and returns its address.
func hostileEdge(t *testing.T, rules string, cfg httpedge.Config, maxKeys int) (*inEdge, string) {
	t.Helper()
	e := newEdge(t, edgeSpec{rules: rules, cfg: cfg, maxKeys: maxKeys})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(ln)
	return e, ln.Addr().String()
}

// rawRequest sends one raw HTTP/1.1 request on a new connection and returns
// the status code of the answer (0 if none).
func rawRequest(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestClientAddressForms sends one client's address in every spelling a
// proxy may use, through X-Forwarded-For and a client-IP header from a
// trusted proxy: each client is one key (its third request is refused,
// whatever the spelling of the three), and malformed chains fall back to
// the proxy's own address without touching anyone else's quota.
func TestClientAddressForms(t *testing.T) {
	_, addr := hostileEdge(t, "rules: [{name: per-ip, limit: 2, window: 1m}]",
		httpedge.Config{ClientIPHeader: "CF-Connecting-IP", MaxHeaderSize: 64 << 10}, 0)
	type form struct{ header, value string }
	clients := []struct {
		name  string
		forms []form
	}{
		{"IPv4 and its IPv4-mapped IPv6 forms", []form{
			{"X-Forwarded-For", "203.0.113.9"}, {"X-Forwarded-For", "::ffff:203.0.113.9"},
			{"X-Forwarded-For", "[::ffff:203.0.113.9]:1234"}, {"X-Forwarded-For", "203.0.113.9:443"},
			{"X-Forwarded-For", "  203.0.113.9  "}, {"CF-Connecting-IP", "::FFFF:cb00:7109"}}},
		{"IPv6 spellings", []form{
			{"X-Forwarded-For", "2001:db8::1"}, {"X-Forwarded-For", "2001:0db8:0000:0000:0000:0000:0000:0001"},
			{"X-Forwarded-For", "2001:DB8::1"}, {"X-Forwarded-For", "[2001:db8::1]"},
			{"X-Forwarded-For", "[2001:db8::1]:8443"}, {"CF-Connecting-IP", "2001:db8:0::1"}}},
		{"an IPv6 address with and without a zone", []form{
			{"X-Forwarded-For", "fe80::1%eth0"}, {"X-Forwarded-For", "fe80::1"}, {"X-Forwarded-For", "fe80::1%25lo"}}},
		{"the rightmost hop of a chain, whatever precedes it", []form{
			{"X-Forwarded-For", "6.6.6.6, 198.51.100.4"}, {"X-Forwarded-For", "garbage, 198.51.100.4"},
			{"X-Forwarded-For", "198.51.100.4"}, {"X-Forwarded-For", ",,, 198.51.100.4"}}},
	}
	for _, c := range clients {
		for i, f := range c.forms {
			want := 200
			if i >= 2 {
				want = 429
			}
			got := rawRequest(t, addr, fmt.Sprintf("GET / HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n", f.header, f.value))
			if got != want {
				t.Errorf("%s: request %d (%s: %q): %d, want %d (one key for every spelling)", c.name, i+1, f.header, f.value, got, want)
			}
		}
	}

	// Malformed chains: the edge believes only what it saw, the proxy's
	// address (127.0.0.1): all of these are one key, and no one else's.
	malformed := []string{",", ",,,", "garbage", "1.2.3.4, garbage", "999.1.1.1", "1.2.3.4:99999", "１.２.３.４",
		"0x7f.0.0.1", "1.2.3.4,,", "[::1", "::1]", strings.Repeat("1", 70), "1.2.3.4 5.6.7.8", "\xff\xfe",
		strings.Repeat("10.0.0.1, ", 3000) + "garbage"}
	statuses := map[int]int{}
	for _, v := range malformed {
		statuses[rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: "+v+"\r\n\r\n")]++
	}
	if statuses[200] != 2 || statuses[429] != len(malformed)-2 {
		t.Errorf("%d malformed chains: %v, want 2×200 and the rest 429: all keyed by the proxy's own address", len(malformed), statuses)
	}
	// A client behind a chain of 3,000 trusted hops: the edge keeps the
	// rightmost 64 hops of a request (bounded memory and time), so this
	// chain is keyed by its 64th trusted hop, a proxy's address: the 3,000
	// hops buy no fresh key, and the client named left of them is untouched.
	long := "198.51.100.77" + strings.Repeat(", 127.0.0.2", 3000)
	for i, want := range []int{200, 200, 429} {
		if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: "+long+"\r\n\r\n"); got != want {
			t.Errorf("a chain of 3,000 trusted hops, request %d: %d, want %d", i+1, got, want)
		}
	}
	if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 127.0.0.2\r\n\r\n"); got != 429 {
		t.Errorf("127.0.0.2 after the chains that ended in it: %d, want 429 (the same key)", got)
	}
	// Within the 64 hops kept, the walk finds the client.
	chain := "198.51.100.78" + strings.Repeat(", 127.0.0.2", 60)
	for i, want := range []int{200, 200, 429} {
		if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: "+chain+"\r\n\r\n"); got != want {
			t.Errorf("a chain of 60 trusted hops, request %d: %d, want %d", i+1, got, want)
		}
	}
	if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.78\r\n\r\n"); got != 429 {
		t.Errorf("198.51.100.78 after its requests behind 60 trusted hops: %d, want 429 (the same key)", got)
	}
	// Nobody else was touched.
	for i, want := range []int{200, 200, 429} {
		if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 192.0.2.200\r\n\r\n"); got != want {
			t.Errorf("a well-behaved client after the hostile ones, request %d: %d, want %d", i+1, got, want)
		}
	}
}

// TestTooManyHeaders sends requests with hundreds and thousands of headers:
// a head within the limit is decided, a larger one gets 431, and neither
// affects the next client.
func TestTooManyHeaders(t *testing.T) {
	_, addr := hostileEdge(t, "rules: [{name: by-key, key: [\"header:X-Key\"], limit: 5, window: 1m}]", httpedge.Config{}, 0)
	head := func(n int) string {
		var b strings.Builder
		b.WriteString("GET / HTTP/1.1\r\nHost: x\r\nX-Key: many\r\n")
		for i := range n {
			fmt.Fprintf(&b, "X-H%d: v\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	for _, tc := range []struct {
		headers, want int
	}{{500, 200}, {5000, 431}, {50_000, 431}} {
		start := time.Now()
		if got := rawRequest(t, addr, head(tc.headers)); got != tc.want {
			t.Errorf("%d headers (%d bytes): %d, want %d", tc.headers, len(head(tc.headers)), got, tc.want)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%d headers took %v", tc.headers, d)
		}
	}
	if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Key: other\r\n\r\n"); got != 200 {
		t.Errorf("another client after them: %d", got)
	}
}

// TestHostileKeysBoundedMemory floods an edge whose limiter keeps at most
// 1,024 keys with 20,000 requests, each with its own 2 KB key of random
// bytes (visible ASCII and bytes above 0x7f, not UTF-8), pipelined: the
// limiter's table stays at its bound, the heap does not keep the keys, and
// a legitimate client is still limited exactly.
func TestHostileKeysBoundedMemory(t *testing.T) {
	e, addr := hostileEdge(t, "rules: [{name: by-key, key: [\"header:X-Key\"], limit: 2, window: 1m}]",
		httpedge.Config{MaxHeaderSize: 16 << 10}, 1024)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n, keyLen = 20_000, 2048
	rng := rand.New(rand.NewPCG(1, 2))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		key := make([]byte, keyLen)
		for range n {
			for j := range key {
				// Visible ASCII and bytes ≥ 0x80 (obs-text, not UTF-8):
				// what an HTTP parser lets through in a header value.
				b := byte(0x21 + rng.IntN(0x7e-0x21+1+0x80))
				if b > 0x7e {
					b += 0x80 - 0x7f
				}
				key[j] = b
			}
			w.WriteString("GET / HTTP/1.1\r\nHost: x\r\nX-Key: ")
			w.Write(key)
			w.WriteString("\r\n\r\n")
		}
		w.Flush()
	}()
	r := bufio.NewReader(c)
	codes := map[int]int{}
	for i := range n {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("response %d of %d: %v (answered so far: %v)", i, n, err, codes)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	keys := e.lim.Keys()
	after := heap()
	grown := int64(after) - int64(before)
	t.Logf("%d requests with distinct %d-byte hostile keys: statuses %v; limiter keys %d (bound 1,024); heap %d → %d bytes (%+d)",
		n, keyLen, codes, keys, before, after, grown)
	if codes[200] != n {
		t.Errorf("statuses %v, want every distinct key admitted once", codes)
	}
	if keys > 1024+64 {
		t.Errorf("limiter holds %d keys, want at most its bound 1,024 (and a few per shard)", keys)
	}
	if grown > 16<<20 {
		t.Errorf("heap grew by %d bytes after %d hostile keys (%d MB of keys): want them not kept", grown, n, n*keyLen>>20)
	}
	for i, want := range []int{200, 200, 429} {
		if got := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nX-Key: legit\r\n\r\n"); got != want {
			t.Errorf("a legitimate key after the flood, request %d: %d, want %d", i+1, got, want)
		}
	}
}

// TestBadRulesPushedToRunningEdge pushes bad rules files to a running edge
// binary, by SIGHUP and by rewriting the file it watches: each is rejected
// with every error in the log and in the metrics, and the running rules
// stay in force; a good file then applies.
func TestBadRulesPushedToRunningEdge(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		t.Helper()
		// Write a new file and rename it over the old one, as a
		// configuration manager does.
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("rules: [{name: api, limit: 3, window: 1m}]")
	e := startEdgeProc(t, "-rules", file, "-trusted-proxies", "127.0.0.0/8")
	hc := &http.Client{Timeout: 5 * time.Second}
	status := func(ip string) int {
		req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/x", nil)
		req.Header.Set("X-Forwarded-For", ip)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	limitIs := func(ip string, n int) bool {
		for i := range n + 1 {
			want := 200
			if i == n {
				want = 429
			}
			if got := status(ip); got != want {
				t.Errorf("client %s, request %d: %d, want %d (limit %d)", ip, i+1, got, want, n)
				return false
			}
		}
		return true
	}
	limitIs("192.0.2.1", 3)

	// 1. By SIGHUP: a file with three errors.
	write("rules: [{name: api, limit: -1, window: 1m, mode: fast}, {name: api, window: 0s, limit: 1}]")
	e.cmd.Process.Signal(syscall.SIGHUP)
	m := e.waitLog(t, regexp.MustCompile(`msg="edge: reload rejected; the running rules stay" err="([^\n]*)"`), 10*time.Second)
	t.Logf("rejected by SIGHUP, logged: %s", m[1])
	for _, want := range []string{"rules[0].limit", "rules[0].mode", "rules[1].window"} {
		if !strings.Contains(m[1], want) {
			t.Errorf("the logged error lacks %q: %s", want, m[1])
		}
	}
	ms := e.metrics(t)
	if r, ok := ms.sum("poplimit_edge_rule_reloads_total", "result", "rejected"), ms.sum("poplimit_edge_rules_last_reload_ok"); r != 1 || ok != 0 {
		t.Errorf("after a rejected reload: rejected %v, last_reload_ok %v; want 1 and 0", r, ok)
	}
	limitIs("192.0.2.2", 3)

	// 2. By the file watcher: not YAML at all.
	write("rules: [{name: api, limit: 3, window: 1m}\n\x00\xff garbage: [")
	deadline := time.Now().Add(15 * time.Second)
	for e.metrics(t).sum("poplimit_edge_rule_reloads_total", "result", "rejected") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the rewritten bad file was not rejected within 15 s:\n%s", e.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	limitIs("192.0.2.3", 3)

	// 3. A good file applies, and the gauge says so.
	write("rules: [{name: api, limit: 5, window: 1m}]")
	e.cmd.Process.Signal(syscall.SIGHUP)
	e.waitLog(t, regexp.MustCompile(`msg="edge: rules reloaded"`), 10*time.Second)
	if ok := e.metrics(t).sum("poplimit_edge_rules_last_reload_ok"); ok != 1 {
		t.Errorf("after a good reload: last_reload_ok %v, want 1", ok)
	}
	limitIs("192.0.2.4", 5)
	if bytes.Contains([]byte(e.out.String()), []byte("panic")) {
		t.Errorf("the edge logged a panic:\n%s", e.out.String())
	}
}

// TestQueryKeyCannotTakeAnotherClientsFallbackKey: under a rule keyed by a
// query parameter, a client without it is keyed by its address (missing_key:
// ip). Another client, from elsewhere, must not be able to spend that
// quota by sending the parameter with crafted bytes.
func TestQueryKeyCannotTakeAnotherClientsFallbackKey(t *testing.T) {
	_, addr := hostileEdge(t, `rules: [{name: by-user, key: ["query:u"], limit: 2, window: 1m}]`, httpedge.Config{}, 0)
	// The victim, 203.0.113.9 (through the trusted proxy), sends no u.
	victim := "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n"
	// The attacker, from another address, sends u = "\x00ip\x00203.0.113.9".
	attacker := "GET /?u=%00ip%00203.0.113.9 HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.66\r\n\r\n"
	for i, want := range []int{200, 200, 429} { // the attacker's own quota
		if got := rawRequest(t, addr, attacker); got != want {
			t.Errorf("the attacker's request %d: %d, want %d", i+1, got, want)
		}
	}
	if got := rawRequest(t, addr, victim); got != 200 {
		t.Errorf("a client keyed by its address, after another client sent u=%%00ip%%00<its address> three times: %d, want 200 (its own quota, untouched)", got)
	}
}

// TestCompositeKeysDoNotCollide sends two clients whose composite keys
// differ only in where a part ends: (u="a\x1fb", o="c") and (u="a",
// o="b\x1fc"). They are different clients and must not share a quota.
func TestCompositeKeysDoNotCollide(t *testing.T) {
	_, addr := hostileEdge(t, `rules: [{name: by-user-org, key: ["query:u", "query:o"], limit: 1, window: 1m}]`, httpedge.Config{}, 0)
	first := rawRequest(t, addr, "GET /?u=a%1Fb&o=c HTTP/1.1\r\nHost: x\r\n\r\n")
	second := rawRequest(t, addr, "GET /?u=a&o=b%1Fc HTTP/1.1\r\nHost: x\r\n\r\n")
	if first != 200 || second != 200 {
		t.Errorf("clients (u=\"a\\x1fb\", o=\"c\") then (u=\"a\", o=\"b\\x1fc\"), limit 1 each: %d then %d, want 200 and 200 (two keys)", first, second)
	}
}
