package httpedge

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// smugglingHeads are request heads (header lines after Host) of the
// framings headFraming judges, for the fuzzers' seeds.
var smugglingHeads = []string{
	"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n",
	"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
	"Content-Length: 4\r\nContent-Length: 40\r\n",
	"Transfer-Encoding: identity\r\nContent-Length: 4\r\n",
	"Transfer-Encoding: identity\r\n",
	"X-Folded: a\r\n b\r\n",
	"Content-Length: 5\r\nX-Note: x\r\n Transfer-Encoding: chunked\r\n",
	"Transfer-Encoding: Chunked\r\n",
	"Content-Length: 4\r\n",
	"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nTE: trailers\r\n",
	"Connection: Content-Length, Host\r\nContent-Length: 3\r\n",
	"ConneCtion:0\n1:\n2:\r\n", // fasthttp's Del reorders the lines left
	"X-A: 1\r\nConnection: x-b\r\nX-A: 2\r\nX-B: 3\r\nX-A: 3\r\n",
	"",
}

func TestHeadFraming(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want framingReason
	}{
		{"Host: x\r\nContent-Length: 4\r\n\r\n", framingOK},
		{"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n", framingOK},
		{"Host: x\r\ntransfer-encoding:  CHUNKED \r\n\r\n", framingOK},
		{"Host: x\r\nContent-Length: 4\r\ncontent-length: 4\r\n\r\n", framingOK},
		{"Host: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", framingContentLength},
		{"Host: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", framingCLTE},
		{"Host: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", framingCLTE},
		{"Host: x\r\nTransfer-Encoding: identity\r\n\r\n", framingTransferEncoding},
		{"Host: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", framingTransferEncoding},
		{"Host: x\r\nX-A: 1\r\n 2\r\n\r\n", framingObsFold},
		{"Host: x\r\nX-A: 1\n\t2\n\n", framingObsFold},
		{"", framingOK},
	} {
		if got := headFraming([]byte(tc.raw)); got != tc.want {
			t.Errorf("headFraming(%q) = %q, want %q", tc.raw, got, tc.want)
		}
	}
}

func TestHeadFramingDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	raw := []byte("Host: x\r\nContent-Length: 4\r\nX-A: b\r\nTransfer-Encoding: chunked\r\n\r\n")
	if n := testing.AllocsPerRun(100, func() { headFraming(raw) }); n != 0 {
		t.Errorf("headFraming: %v allocs, want 0", n)
	}
}

// FuzzHeadFraming checks headFraming against a second, independent HTTP
// parser: whenever fasthttp and net/http both accept a request head and
// headFraming lets it through, they must frame its body the same way
// (both chunked, or both the same length). A head on which two parsers
// disagree is what request smuggling is made of.
func FuzzHeadFraming(f *testing.F) {
	for _, h := range smugglingHeads {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, head string) {
		raw := "POST / HTTP/1.1\r\nHost: x\r\n" + head + "\r\n"
		var fh fasthttp.RequestHeader
		if err := fh.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		r := headFraming(fh.RawHeaders())
		if r >= numFramingReasons {
			t.Fatalf("headFraming(%q) = %d, not a reason", fh.RawHeaders(), r)
		}
		hr, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil || r != framingOK {
			return
		}
		fastChunked := fh.ContentLength() == -1
		goChunked := len(hr.TransferEncoding) > 0 && hr.TransferEncoding[0] == "chunked"
		fastLen := max(fh.ContentLength(), 0)
		if fastChunked != goChunked || !fastChunked && int64(fastLen) != hr.ContentLength {
			t.Fatalf("head %q passed, but fasthttp frames it chunked=%v length %d and net/http chunked=%v length %d",
				head, fastChunked, fh.ContentLength(), goChunked, hr.ContentLength)
		}
	})
}

// FuzzStripHops checks that after the hop-by-hop fields are dropped none
// is left (those of RFC 9110 §7.6.1 and those Connection named, but
// Content-Length and Host), and that every other line is, in its order.
func FuzzStripHops(f *testing.F) {
	for _, h := range smugglingHeads {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, head string) {
		raw := "GET / HTTP/1.1\r\nHost: x\r\n" + head + "\r\n"
		var req fasthttp.Request
		if err := req.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return
		}
		var tokens []string
		for k, v := range req.Header.All() {
			if strings.EqualFold(string(k), "Connection") {
				for _, tok := range strings.Split(string(v), ",") {
					tokens = append(tokens, strings.Trim(tok, " \t"))
				}
			}
		}
		hop := func(name string) bool {
			for _, h := range hopHeaders {
				if strings.EqualFold(name, h) {
					return true
				}
			}
			if strings.EqualFold(name, "Content-Length") || strings.EqualFold(name, "Host") {
				return false
			}
			for _, tok := range tokens {
				if tok != "" && strings.EqualFold(name, tok) {
					return true
				}
			}
			return false
		}
		var kept []string
		for k, v := range req.Header.All() {
			if !hop(string(k)) {
				kept = append(kept, string(k)+": "+string(v))
			}
		}
		var ps proxyScratch
		if !ps.filter.reset(&req.Header) {
			return // Connection names more than maxConnectionTokens
		}
		rewrite(&req.Header, requestApart, &ps.filter, &ps)
		var got []string
		for k, v := range req.Header.All() {
			if hop(string(k)) {
				t.Fatalf("head %q: %q left after the rewrite", head, k)
			}
			got = append(got, string(k)+": "+string(v))
		}
		if strings.Join(got, "\n") != strings.Join(kept, "\n") {
			t.Fatalf("head %q: after the rewrite\n%s\nwant\n%s", head, strings.Join(got, "\n"), strings.Join(kept, "\n"))
		}
	})
}

func TestPickSharesEvenly(t *testing.T) {
	p := &upstreamPool{}
	for i := 0; i < 4; i++ {
		u := &upstream{}
		u.healthy.Store(i != 1)
		p.ups = append(p.ups, u)
	}
	count := make([]int, 4)
	for i := 0; i < 300; i++ {
		count[p.pick(p.turn(), 0)]++
	}
	if count[0] != 100 || count[1] != 0 || count[2] != 100 || count[3] != 100 {
		t.Errorf("300 picks over 3 healthy of 4: %v, want [100 0 100 100]", count)
	}
	// A retry goes to an upstream the request has not tried, while one is
	// healthy; then to a healthy one again.
	for k := uint32(0); k < 10; k++ {
		if got := p.pick(k, 1<<0|1<<2); got != 3 {
			t.Errorf("pick(%d, tried 0 and 2) = %d, want 3", k, got)
		}
		if got := p.pick(k, 1<<0|1<<2|1<<3); got == 1 {
			t.Errorf("pick(%d, every healthy one tried) = the unhealthy one", k)
		}
	}
	for _, u := range p.ups {
		u.healthy.Store(false)
	}
	if got := p.pick(0, 1<<0|1<<1|1<<2); got != 3 {
		t.Errorf("none healthy, 0-2 tried: pick = %d, want 3", got)
	}
}

// FuzzAmbiguousPath: a path is refused exactly when it holds a backslash
// or %5C (any case) or starts with "//"; a path let through decodes, as
// the edge matches it, to one without a backslash, so the WHATWG reading
// of a backslash as "/" cannot differ from the edge's.
func FuzzAmbiguousPath(f *testing.F) {
	for _, s := range []string{`/x/..\login`, `/x/..%5Clogin`, `/x/..%5clogin`, "//evil/login", "/a//b", "/%", "/%5", "/%5%5c",
		"/%255C", "/login", `/\`, "/x?q=\\", "/%%5C"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		want := strings.Contains(raw, `\`) || strings.Contains(strings.ToLower(raw), "%5c") || strings.HasPrefix(raw, "//")
		if got := ambiguousPath([]byte(raw)); got != want {
			t.Fatalf("ambiguousPath(%q) = %v, want %v", raw, got, want)
		}
		if want {
			return
		}
		var u fasthttp.URI
		u.SetPath(raw)
		if bytes.IndexByte(u.Path(), '\\') >= 0 {
			t.Fatalf("%q passes but is matched as %q, with a backslash", raw, u.Path())
		}
	})
}
