package faults

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/rules"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

// fuzzRules key requests every way a rule can, each part hostile-able, and
// add a per-iteration nonce so that every iteration starts from fresh keys.
const fuzzRules = `
match: all
rules:
  - {name: by-ip,     key: [ip, "header:X-Nonce"],                  limit: 1, window: 1h}
  - {name: by-header, key: ["header:X-Key", "header:X-Nonce"],      limit: 1, window: 1h, missing_key: skip}
  - {name: by-parts,  key: ["query:u", "cookie:sid", "header:X-Nonce"], limit: 1000, window: 1h, missing_key: skip}
`

// FuzzHostileRequestKey builds requests from hostile parts (a path, an
// X-Forwarded-For chain, a header key of any bytes, a query and a cookie
// header) and runs them through an edge's handler, from a trusted proxy:
//
//   - the handler answers 200, 400 or 429, never panics (its guard would
//     answer 500 and count it);
//   - AppendKeyStatus gives back exactly the header's bytes as the key, or
//     reports it missing when the header is empty;
//   - a client address that parses is one key whatever its spelling: the
//     request again with the address in canonical form is refused by the
//     rule of limit 1.
func FuzzHostileRequestKey(f *testing.F) {
	f.Add("/v1/x", "203.0.113.7", []byte("k1"), "u=a", "sid=1")
	f.Add("/", "::ffff:203.0.113.7", []byte("\xff\xfe\x80"), "u=%1F", "sid=\x1f")
	f.Add("//a/../b", "[2001:db8::1]:443", []byte(strings.Repeat("k", 10<<10)), "u=a&u=b", "sid=1; sid=2")
	f.Add("/check/x", "6.6.6.6, 198.51.100.4", []byte(" spaced "), "u", "=")
	f.Add("/%00", "garbage", []byte{}, "", "")
	f.Add("/", "fe80::1%eth0", []byte("a\x01b"), "u=\xff", "sid=\"q\"")
	f.Add("/", "1.2.3.4,,", []byte("x"), "&&&", ";;;")
	f.Add("/", "  2001:DB8::0001  ", []byte("x"), "u=1", "sid=1")

	e := newEdge(f, edgeSpec{rules: fuzzRules, cfg: httpedge.Config{ClientIPHeader: "CF-Connecting-IP"}})
	handler := e.srv.Handler()
	var nonce atomic.Uint64
	peer := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}
	run := func(build func(*fasthttp.Request)) (int, *fasthttp.Request) {
		var ctx fasthttp.RequestCtx
		req := &fasthttp.Request{}
		build(req)
		ctx.Init(req, peer, nil)
		handler(&ctx)
		return ctx.Response.StatusCode(), req
	}
	byHeader := e.rules.Lookup("by-header")
	keyRule := &rules.Rule{Name: "k", Key: byHeader.Key[:1]}

	f.Fuzz(func(t *testing.T, path, xff string, key []byte, query, cookie string) {
		n := strconv.FormatUint(nonce.Add(1), 10)
		build := func(xff string, key []byte) func(*fasthttp.Request) {
			return func(req *fasthttp.Request) {
				req.Header.SetMethod("GET")
				req.SetRequestURI("/" + strings.TrimLeft(path, "/") + "?" + query)
				req.Header.SetHost("x")
				req.Header.Set("X-Nonce", n)
				if xff != "" {
					req.Header.Set("X-Forwarded-For", xff)
				}
				req.Header.SetBytesV("X-Key", key)
				if cookie != "" {
					req.Header.Set("Cookie", cookie)
				}
			}
		}
		status, req := run(build(xff, key))
		switch status {
		case 200, 400, 429:
		default:
			t.Fatalf("path %q, XFF %q, key %q, query %q, cookie %q: status %d, want 200, 400 or 429", path, xff, key, query, cookie, status)
		}
		if p := testenv.MetricSum(t, e.reg, "poplimit_edge_panics_total"); p > 0 {
			t.Fatalf("path %q, XFF %q, key %q, query %q, cookie %q: the handler panicked", path, xff, key, query, cookie)
		}
		// A key of one header part is the header's bytes, exactly, but for
		// a value starting with 0x00 or 0x01, which gets a 0x01 before it
		// (so that no key starts like decision.FallbackKeyTag: finding F1).
		v := req.Header.Peek("X-Key")
		want := v
		if len(v) > 0 && v[0] <= 0x01 {
			want = append([]byte{0x01}, v...)
		}
		k, st := decision.AppendKeyStatus(nil, httpedge.FastFields(req), keyRule, netip.MustParseAddr("192.0.2.1"))
		if ok := st == decision.KeyBuilt; ok != (len(v) > 0) || ok && !bytes.Equal(k, want) {
			t.Fatalf("key %q: AppendKeyStatus = %q, status %d; the header holds %q, want %q", key, k, st, v, want)
		}
		// One client, one key, whatever the spelling of its address.
		a, err := netip.ParseAddr(strings.TrimSpace(xff))
		if err != nil || strings.ContainsAny(xff, ",") || status != 200 {
			return
		}
		canon := a.Unmap().WithZone("").String()
		// Another X-Key, so that only the rule keyed by address can refuse.
		other := append([]byte("other:"), key...)
		if again, _ := run(build(canon, other)); again != 429 {
			t.Fatalf("XFF %q then %q (the same address): second answered %d, want 429 (one key under a limit of 1)", xff, canon, again)
		}
	})
}

// fakeMemcached is a loopback server that answers every read with reply.
type fakeMemcached struct {
	ln    net.Listener
	reply []byte
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newFakeMemcached(t testing.TB, reply []byte) *fakeMemcached {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeMemcached{ln: ln, reply: reply}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write(s.reply); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *fakeMemcached) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// FuzzMemcachedReply answers a shardproxy client's increment, decrement and
// read with arbitrary bytes: the call returns within its batch timeout, never
// panics, and a value it reports without error is one the reply held (or,
// for an increment that missed, the delta it created the counter with).
func FuzzMemcachedReply(f *testing.F) {
	hit := "VALUE " + string(shardproxy.AppendCounterKey(nil, 1, 0)) + " 0 2\r\n42\r\nEND\r\n"
	for _, seed := range []string{"5\r\n", "NOT_FOUND\r\n", "STORED\r\n", "NOT_STORED\r\n", "END\r\n", hit,
		"VALUE " + string(shardproxy.AppendCounterKey(nil, 1, 0)) + " 0 3\r\n4  \r\nEND\r\n",
		"CLIENT_ERROR bad data chunk\r\n", "SERVER_ERROR out of memory\r\n", "ERROR\r\n", "", "\r\n",
		"99999999999999999999999\r\n", "-1\r\n", "VALUE x 0 2\r\n1", "VALUE", "\x00\xff\xfe", "5", "5\r\n5\r\n5\r\n",
		"VALUE " + string(shardproxy.AppendCounterKey(nil, 1, 0)) + " 0 -5\r\n", "VALUE a b c d e f\r\nEND\r\n"} {
		for op := range uint8(3) {
			f.Add([]byte(seed), op)
		}
	}
	f.Fuzz(func(t *testing.T, reply []byte, op uint8) {
		if announcesHugeValue(reply) {
			// gomemcache allocates the size a VALUE line announces before
			// reading it (shardproxy's package doc: it trusts its shards).
			t.Skip("a VALUE line announcing more than 1 MB")
		}
		s := newFakeMemcached(t, reply)
		defer s.close()
		c, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: s.ln.Addr().String()}},
			Timeout: 50 * time.Millisecond, FailureLimit: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		delta := []int64{3, -2, 0}[op%3]
		ops := []shardproxy.Op{{Key: 1, Start: 0, Delta: delta, TTL: time.Minute}}
		start := time.Now()
		c.Do(context.Background(), ops)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("reply %q, delta %d: Do took %v, want it bounded by its batch timeout (100 ms)", reply, delta, d)
		}
		o := ops[0]
		if o.Err != nil {
			return
		}
		ok := false
		switch {
		case delta > 0 && o.Value == uint64(delta): // created by add
			ok = true
		case delta <= 0 && o.Value == 0: // a miss reads 0; a decrement of one leaves it missing
			ok = true
		default:
			ok = bytes.Contains(reply, []byte(strconv.FormatUint(o.Value, 10)))
		}
		if !ok {
			t.Fatalf("reply %q, delta %d: Value %d without error, which the reply does not hold", reply, delta, o.Value)
		}
	})
}

// announcesHugeValue reports whether reply has a VALUE line whose size field
// is over 1 MB.
func announcesHugeValue(reply []byte) bool {
	for _, line := range bytes.Split(reply, []byte("\n")) {
		fs := strings.Fields(string(line))
		if len(fs) >= 4 && fs[0] == "VALUE" {
			if n, err := strconv.ParseInt(fs[3], 10, 64); err == nil && n > 1<<20 {
				return true
			}
		}
	}
	return false
}
