package httpedge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

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
