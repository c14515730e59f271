package httpedge_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

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
	certFile, keyFile, cert := testenv.WriteCert(t, t.TempDir(), "edge")
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
