package middleware

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/httpedge"
)

// bothFields reads one raw request (lines ending in \n) as net/http and as
// the edge server do; ok is false when either refuses it.
func bothFields(t testing.TB, head string) (mw *fields, fast decision.Fields, ok bool) {
	t.Helper()
	raw := strings.ReplaceAll(head, "\n", "\r\n")
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		return nil, nil, false
	}
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		return nil, nil, false
	}
	return &fields{m: &netHTTP{}, r: r}, httpedge.FastFields(&req), true
}

type lookup func(name string) (first, last []byte, n int)

// sameFields reports how the middleware's answer for name differs from the
// edge server's, or "".
func sameFields(mw, fast lookup, name string) string {
	f1, l1, n1 := mw(name)
	f2, l2, n2 := fast(name)
	if string(f1) != string(f2) || string(l1) != string(l2) || n1 != n2 {
		return fmt.Sprintf("net/http: %q … %q ×%d; fasthttp: %q … %q ×%d", f1, l1, n1, f2, l2, n2)
	}
	return ""
}

// The middleware counts and decodes header lines, query parameters and
// cookies as the edge server does, so one rules file keys alike behind
// either.
func TestFieldsMatchEdgeServer(t *testing.T) {
	tests := []struct {
		head   string
		source string // header, query or cookie
		name   string
		n      int
	}{
		{"GET / HTTP/1.1\nHost: x\nX-API-Key: r1\nx-api-key:  real \n\n", "header", "X-API-Key", 2},
		{"GET / HTTP/1.1\nHost: x\nX-API-Key: real\n\n", "header", "x-api-key", 1},
		{"GET / HTTP/1.1\nHost: x\n\n", "header", "X-API-Key", 0},
		{"GET /?key=r1&key=real HTTP/1.1\nHost: x\n\n", "query", "key", 2},
		{"GET /?key=r1&k%65y=re%61l&k+y=1 HTTP/1.1\nHost: x\n\n", "query", "key", 2},
		{"GET /?k+y=a+b&k%20y=%2B HTTP/1.1\nHost: x\n\n", "query", "k y", 2},
		{"GET /?key&&key=&x=1 HTTP/1.1\nHost: x\n\n", "query", "key", 2},
		{"GET /?x=1 HTTP/1.1\nHost: x\n\n", "query", "key", 0},
		{"GET / HTTP/1.1\nHost: x\nCookie: sid=r1; a=b\nCookie: sid=\"real\"\n\n", "cookie", "sid", 2},
		{"GET / HTTP/1.1\nHost: x\nCookie: sid=%72eal;sid= x \n\n", "cookie", "sid", 2},
		{"GET / HTTP/1.1\nHost: x\nCookie: sid=a\"b; sid=c\\d; sid=ok\n\n", "cookie", "sid", 1},
		{"GET / HTTP/1.1\nHost: x\nCookie: SID=a; sid\n\n", "cookie", "sid", 0},
	}
	for _, tt := range tests {
		mw, fast, ok := bothFields(t, tt.head)
		if !ok {
			t.Fatalf("%q: not read", tt.head)
		}
		var m, f lookup
		switch tt.source {
		case "header":
			m, f = mw.Header, fast.Header
		case "query":
			m, f = mw.Query, fast.Query
		default:
			m, f = mw.Cookie, fast.Cookie
		}
		if d := sameFields(m, f, tt.name); d != "" {
			t.Errorf("%q, %s %s: %s", tt.head, tt.source, tt.name, d)
		}
		if _, _, n := m(tt.name); n != tt.n {
			t.Errorf("%q, %s %s: n = %d, want %d", tt.head, tt.source, tt.name, n, tt.n)
		}
	}
}

// FuzzFieldsMatchEdgeServer: for any query and Cookie line both front ends
// accept, the middleware finds the same first and last value and count as
// the edge server.
func FuzzFieldsMatchEdgeServer(f *testing.F) {
	f.Add("key=r1&key=real", "sid=r1; sid=real", "key")
	f.Add("k%65y=a&key=%zz&key=%4", "sid=\"q\"; sid= x ;sid", "key")
	f.Add("a+b=1&a%20b=2", "a b=1", "a b")
	f.Add("key=A;key=B", "sid=1", "key")
	f.Fuzz(func(t *testing.T, query, cookie, name string) {
		if strings.ContainsAny(query, " \r\n#\x00") || strings.ContainsAny(cookie, "\r\n\x00") || name == "" {
			return
		}
		mw, fast, ok := bothFields(t, "GET /?"+query+" HTTP/1.1\nHost: x\nCookie: "+cookie+"\n\n")
		if !ok {
			return
		}
		if d := sameFields(mw.Query, fast.Query, name); d != "" {
			t.Errorf("query %q, name %q: %s", query, name, d)
		}
		if d := sameFields(mw.Cookie, fast.Cookie, name); d != "" {
			t.Errorf("cookie %q, name %q: %s", cookie, name, d)
		}
		// The raw query, which rules with query_semicolon: split read.
		rq, ok := fast.(decision.RawQuery)
		if !ok || string(mw.RawQuery()) != string(rq.RawQuery()) {
			t.Errorf("query %q: raw query net/http %q, fasthttp %v %q", query, mw.RawQuery(), ok, rq)
		}
	})
}

// Looking up fields without escapes allocates nothing.
func TestFieldsDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	mw, _, ok := bothFields(t, "GET /?a=1&key=r1&key=real HTTP/1.1\nHost: x\nX-API-Key: a\nX-API-Key: b\nCookie: x=1; sid=r1\nCookie: sid=real\n\n")
	if !ok {
		t.Fatal("not read")
	}
	mw.m.canonical("X-API-Key") // the first lookup of a name stores its canonical form
	n := testing.AllocsPerRun(1000, func() {
		_, _, h := mw.Header("X-API-Key")
		_, _, q := mw.Query("key")
		_, _, c := mw.Cookie("sid")
		if h != 2 || q != 2 || c != 2 {
			t.Fatalf("counts %d %d %d, want 2 each", h, q, c)
		}
	})
	if n != 0 {
		t.Errorf("%v allocs/op, want 0", n)
	}
}
