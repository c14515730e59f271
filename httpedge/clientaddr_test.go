package httpedge

import (
	"bufio"
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
)

// addrServer is a Server with only what clientIP reads.
func addrServer(t testing.TB, trusted string, f clientaddr.Forwarding, ipHeader string) *Server {
	t.Helper()
	p, err := clientaddr.ParsePrefixes(trusted)
	if err != nil {
		t.Fatal(err)
	}
	return &Server{addr: clientaddr.New(p, f, ipHeader)}
}

// clientIP is the client address the fasthttp front end resolves for ctx.
func (s *Server) clientIP(ctx *fasthttp.RequestCtx, h *clientaddr.Hops) netip.Addr {
	peer := peerAddr(ctx)
	if !s.addr.Trusted(peer) {
		return peer
	}
	return s.fromProxies(ctx, peer, h)
}

// rawCtx parses a raw request head (lines joined by \n, CRLF added) as the
// server would, from peer.
func rawCtx(t testing.TB, peer string, head string) *fasthttp.RequestCtx {
	t.Helper()
	raw := strings.ReplaceAll(head, "\n", "\r\n")
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("reading %q: %v", raw, err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(peer), Port: 1234}, nil)
	return &ctx
}

func TestClientIP(t *testing.T) {
	const trusted = "10.0.0.0/8, 192.0.2.1, 2001:db8:ffff::/48"
	tests := []struct {
		name    string
		fwd     clientaddr.Forwarding
		peer    string
		headers string // header lines, each ending in \n
		want    string
	}{
		{"untrusted peer ignores XFF", "", "198.51.100.9", "X-Forwarded-For: 203.0.113.5\n", "198.51.100.9"},
		{"untrusted peer ignores CF header", "", "198.51.100.9", "CF-Connecting-IP: 203.0.113.5\n", "198.51.100.9"},
		{"trusted peer, XFF believed", "", "10.1.2.3", "X-Forwarded-For: 203.0.113.5\n", "203.0.113.5"},
		{"rightmost untrusted hop", "", "10.1.2.3", "X-Forwarded-For: 1.1.1.1, 203.0.113.5, 10.9.9.9\n", "203.0.113.5"},
		{"spoofed leftmost entry ignored", "", "192.0.2.1", "X-Forwarded-For: 6.6.6.6, 203.0.113.7\n", "203.0.113.7"},
		// A proxy that adds its own line: the client's forged line comes
		// first. Reading only the first line chose the forged address.
		{"two lines, forged first", "", "10.1.2.3", "X-Forwarded-For: 6.6.6.1\nX-Forwarded-For: 203.0.113.5\n", "203.0.113.5"},
		{"two lines equal one joined line", "", "10.1.2.3", "X-Forwarded-For: 6.6.6.1, 203.0.113.5\n", "203.0.113.5"},
		{"lines walked right to left", "", "10.1.2.3", "X-Forwarded-For: 6.6.6.1, 203.0.113.9\nX-Forwarded-For: 10.4.4.4\nx-forwarded-for: 10.5.5.5\n", "203.0.113.9"},
		{"other headers between lines", "", "10.1.2.3", "X-Forwarded-For: 6.6.6.1\nAccept: */*\nX-Forwarded-For: 203.0.113.5, 10.2.2.2\n", "203.0.113.5"},
		{"header first", "", "10.1.2.3", "X-Forwarded-For: 203.0.113.5\nCF-Connecting-IP: 2001:db8::1\n", "2001:db8::1"},
		{"header's last line", "", "10.1.2.3", "CF-Connecting-IP: 6.6.6.6\nCF-Connecting-IP: 203.0.113.8\n", "203.0.113.8"},
		{"garbled header falls to XFF", "", "10.1.2.3", "CF-Connecting-IP: nope\nX-Forwarded-For: 203.0.113.5\n", "203.0.113.5"},
		{"malformed hop stops at last trusted", "", "10.1.2.3", "X-Forwarded-For: 203.0.113.5, not-an-ip, 10.7.7.7\n", "10.7.7.7"},
		{"malformed hop right of all", "", "10.1.2.3", "X-Forwarded-For: 203.0.113.5, not-an-ip\n", "10.1.2.3"},
		{"empty hop is malformed", "", "10.1.2.3", "X-Forwarded-For: 6.6.6.6,,10.7.7.7\n", "10.7.7.7"},
		{"ipv4-mapped peer", "", "::ffff:198.51.100.9", "", "198.51.100.9"},
		{"ipv4-mapped in XFF", "", "10.1.2.3", "X-Forwarded-For: ::ffff:203.0.113.5\n", "203.0.113.5"},
		{"ipv4 with port", "", "10.1.2.3", "X-Forwarded-For: 203.0.113.5:8080\n", "203.0.113.5"},
		{"bracketed with port", "", "10.1.2.3", "X-Forwarded-For: [2001:db8::2]:443\n", "2001:db8::2"},
		{"bracketed without port", "", "10.1.2.3", "X-Forwarded-For: [2001:db8::2]\n", "2001:db8::2"},
		{"ipv6 zone dropped", "", "10.1.2.3", "X-Forwarded-For: fe80::1%eth0\n", "fe80::1"},
		{"trusted ipv6 hop", "", "10.1.2.3", "X-Forwarded-For: 2001:db8::7, 2001:db8:ffff::1\n", "2001:db8::7"},
		{"all hops trusted", "", "10.1.2.3", "X-Forwarded-For: 10.2.2.2\n", "10.2.2.2"},
		{"no header from trusted peer", "", "10.1.2.3", "", "10.1.2.3"},
		{"Forwarded ignored under XFF", "", "10.1.2.3", "Forwarded: for=6.6.6.6\nX-Forwarded-For: 203.0.113.5\n", "203.0.113.5"},

		{"Forwarded for=", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=203.0.113.5;proto=https\n", "203.0.113.5"},
		{"XFF ignored under Forwarded", clientaddr.Forwarded, "10.1.2.3", "X-Forwarded-For: 6.6.6.6\nForwarded: for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded elements", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6, for=203.0.113.5;by=10.0.0.1, for=10.3.3.3\n", "203.0.113.5"},
		{"Forwarded lines", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6\nForwarded: For=\"203.0.113.5:4711\"\n", "203.0.113.5"},
		{"Forwarded quoted ipv6 with port", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=\"[2001:db8:cafe::17]:4711\"\n", "2001:db8:cafe::17"},
		{"Forwarded pairs in any order", clientaddr.Forwarded, "10.1.2.3", "Forwarded: proto=http; by=10.0.0.9; for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded quoted comma does not split", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6;x=\"a, for=9.9.9.9\", for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded obfuscated stops", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=203.0.113.5, for=_hidden, for=10.6.6.6\n", "10.6.6.6"},
		{"Forwarded unknown stops", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=203.0.113.5, for=unknown\n", "10.1.2.3"},
		{"Forwarded element without for", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=203.0.113.5, proto=https\n", "10.1.2.3"},
		{"Forwarded escaped node", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=\"203.0.113.\\5\"\n", "10.1.2.3"},
		{"Forwarded from untrusted peer", clientaddr.Forwarded, "198.51.100.9", "Forwarded: for=203.0.113.5\n", "198.51.100.9"},
		// A trusted proxy joins its element to the client's line
		// ("$http_forwarded, for=$remote_addr"): a quote the client leaves
		// open must not swallow the proxy's element.
		{"Forwarded open quote before joined element", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6;x=\"a, for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded open quoted node before joined element", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=\"6.6.6.6, for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded quote closed by the proxy's quote", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6;x=\"a, for=\"[2001:db8::9]:80\"\n", "2001:db8::9"},
		{"Forwarded escape at the client's end", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6;x=\"a\\, for=\"203.0.113.5\"\n", "203.0.113.5"},
		{"Forwarded garbage after the pair", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6 junk, for=203.0.113.5\n", "203.0.113.5"},
		{"Forwarded malformed element stops the walk", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=6.6.6.6;x=\"a, for=10.8.8.8\n", "10.8.8.8"},
		{"Forwarded pair named twice", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=203.0.113.5, for=6.6.6.6;for=10.0.0.1, for=10.8.8.8\n", "10.8.8.8"},
		{"Forwarded bare ipv6 node", clientaddr.Forwarded, "10.1.2.3", "Forwarded: for=2001:db8::5\n", "2001:db8::5"},
		{"Forwarded empty pairs", clientaddr.Forwarded, "10.1.2.3", "Forwarded: ;for=203.0.113.5;;proto=https\n", "203.0.113.5"},
		{"Forwarded empty client part joined", clientaddr.Forwarded, "10.1.2.3", "Forwarded: , for=203.0.113.5\n", "203.0.113.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := addrServer(t, trusted, cmpOr(tt.fwd, clientaddr.XForwardedFor), "CF-Connecting-IP")
			ctx := rawCtx(t, tt.peer, "GET / HTTP/1.1\nHost: x\n"+tt.headers+"\n")
			var h clientaddr.Hops
			if got := s.clientIP(ctx, &h).String(); got != tt.want {
				t.Errorf("clientIP = %s, want %s", got, tt.want)
			}
		})
	}
}

func cmpOr(f, def clientaddr.Forwarding) clientaddr.Forwarding {
	if f == "" {
		return def
	}
	return f
}

// A client writes a chunked body's trailers after the proxy's headers; a
// forwarding header there, or one announced as a trailer (which moves the
// proxy's own line out of the header section), must not choose the key.
// fasthttp refuses X-Forwarded-For as a trailer; a header it allows there
// (CF-Connecting-IP) is checked through the same path. Such a request is
// keyed by its peer: the trusted proxy, never an address it chose.
func TestClientIPIgnoresTrailers(t *testing.T) {
	s := addrServer(t, "10.0.0.0/8", clientaddr.XForwardedFor, "CF-Connecting-IP")
	for _, tt := range []struct{ name, raw, want string }{
		{"trailer line", "POST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\nX-Forwarded-For: 203.0.113.5\n\n0\nCF-Connecting-IP: 6.6.6.6\n\n", "10.1.2.3"},
		{"announced", "POST / HTTP/1.1\nHost: x\nTrailer: CF-Connecting-IP\nTransfer-Encoding: chunked\nCF-Connecting-IP: 203.0.113.5\n\n0\nCF-Connecting-IP: 6.6.6.6\n\n", "10.1.2.3"},
	} {
		ctx := rawCtx(t, "10.1.2.3", tt.raw)
		var h clientaddr.Hops
		if got := s.clientIP(ctx, &h).String(); got != tt.want {
			t.Errorf("%s: clientIP = %s, want %s", tt.name, got, tt.want)
		}
	}
}

// A chain longer than the hops kept is walked over its rightmost ones.
func TestClientIPLongChain(t *testing.T) {
	s := addrServer(t, "10.0.0.0/8", clientaddr.XForwardedFor, "")
	var b strings.Builder
	b.WriteString("GET / HTTP/1.1\nHost: x\nX-Forwarded-For: 203.0.113.5")
	for i := 0; i < 300; i++ {
		b.WriteString(", 6.6.6.6")
	}
	b.WriteString("\nX-Forwarded-For: 198.51.100.1, 10.0.0.2\n\n")
	var h clientaddr.Hops
	if got := s.clientIP(rawCtx(t, "10.1.2.3", b.String()), &h).String(); got != "198.51.100.1" {
		t.Errorf("clientIP = %s, want 198.51.100.1", got)
	}
	// Every kept hop trusted: the leftmost kept one, never a dropped one.
	b.Reset()
	b.WriteString("GET / HTTP/1.1\nHost: x\nX-Forwarded-For: 6.6.6.6")
	for i := 0; i < 100; i++ {
		b.WriteString(", 10.0.0.9")
	}
	b.WriteString("\n\n")
	if got := s.clientIP(rawCtx(t, "10.1.2.3", b.String()), &h).String(); got != "10.0.0.9" {
		t.Errorf("clientIP of an all-trusted tail = %s, want 10.0.0.9", got)
	}
}

func TestIPv6KeyPrefix(t *testing.T) {
	rs, err := rules.ParseRules([]byte(`
rules:
  - {name: by-net, limit: 5, window: 1m}
  - {name: by-addr, limit: 5, window: 1m, ipv6_prefix: 128}
  - {name: by-48, limit: 5, window: 1m, ipv6_prefix: 48, key: ["ip", "header:X-K"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("2001:db8:1:2:aaaa::1")
	b := netip.MustParseAddr("2001:db8:1:2:bbbb::2")
	c := netip.MustParseAddr("2001:db8:1:3::1")
	v4 := netip.MustParseAddr("203.0.113.5")
	var req fasthttp.Request
	req.Header.Set("X-K", "k")
	key := func(r *rules.Rule, ip netip.Addr) string {
		k, st := decision.AppendKeyStatus(nil, fastFields{&req}, r, ip)
		if st != decision.KeyBuilt {
			t.Fatalf("AppendKeyStatus(%s, %s): status %d, want %d", r.Name, ip, st, decision.KeyBuilt)
		}
		return string(k)
	}
	net64, addr, net48 := rs.Rules[0], rs.Rules[1], rs.Rules[2]
	if key(net64, a) != key(net64, b) || key(net64, a) == key(net64, c) {
		t.Errorf("/64 keys: %q %q %q; want the first two equal, the third apart", key(net64, a), key(net64, b), key(net64, c))
	}
	if key(net64, a) != "2001:db8:1:2::" {
		t.Errorf("/64 key = %q, want 2001:db8:1:2::", key(net64, a))
	}
	if key(addr, a) == key(addr, b) {
		t.Errorf("/128 keys of two addresses are equal: %q", key(addr, a))
	}
	if key(net48, a) != key(net48, c) {
		t.Errorf("/48 keys differ: %q %q", key(net48, a), key(net48, c))
	}
	if key(net64, v4) != "203.0.113.5" {
		t.Errorf("IPv4 key = %q, want the address", key(net64, v4))
	}
	fa, fb := decision.AppendFallbackKey(nil, net64, a), decision.AppendFallbackKey(nil, net64, b)
	if !bytes.Equal(fa, fb) {
		t.Errorf("fallback keys of one /64 differ: %q %q", fa, fb)
	}
	if _, err := rules.ParseRules([]byte("rules: [{name: x, limit: 1, window: 1s, ipv6_prefix: 200}]")); err == nil || !strings.Contains(err.Error(), "ipv6_prefix") {
		t.Errorf("ipv6_prefix 200: err = %v, want one naming ipv6_prefix", err)
	}
}

// FuzzClientIP checks, for any forwarding and client-IP headers:
//   - from an untrusted peer, the address is the peer, whatever the headers;
//   - from a trusted peer, the address is never left of the rightmost
//     untrusted hop of the proxies' own part of the chain: the fuzzer's
//     bytes stand left of a hop a trusted proxy appended, on a line of
//     their own or joined to the client's line with a comma (RFC 9110
//     §5.3), so the answer is that hop.
func FuzzClientIP(f *testing.F) {
	f.Add("6.6.6.6", "1.2.3.4", false, false)
	f.Add("for=6.6.6.6, for=\"[::1]:80\"", "", true, false)
	f.Add("6.6.6.6\r\nX-Forwarded-For: 7.7.7.7", "x", false, false)
	f.Add(strings.Repeat("1.1.1.1,", 100), "", false, true)
	f.Add("for=\"a,b\";for=1.1.1.1, for=unknown", "::ffff:1.2.3.4", true, false)
	f.Add(`for=6.6.6.6;x="a`, "", true, true)
	f.Add(`for="6.6.6.6`, "", true, true)
	f.Add(`for=6.6.6.6;x="a\`, "", true, true)
	f.Add(`x="`, "", true, true)
	f.Fuzz(func(t *testing.T, forged, cf string, fwd, joined bool) {
		if strings.ContainsAny(forged+cf, "\r\n\x00") {
			return // not one header line
		}
		forwarding, name := clientaddr.XForwardedFor, "X-Forwarded-For"
		real := "203.0.113.77"
		if fwd {
			forwarding, name, real = clientaddr.Forwarded, "Forwarded", "for=203.0.113.77"
		}
		fwdLines := name + ": " + forged + "\n" + name + ": " + real + "\n"
		if joined {
			fwdLines = name + ": " + forged + ", " + real + "\n"
		}
		head := "GET / HTTP/1.1\nHost: x\nCF-Connecting-IP: " + cf + "\n" + fwdLines + "\n"
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(strings.NewReader(strings.ReplaceAll(head, "\n", "\r\n")))); err != nil {
			return // fasthttp refuses the request before any key is chosen
		}
		var h clientaddr.Hops
		for _, peer := range []string{"198.51.100.9", "10.1.2.3"} {
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(peer), Port: 1}, nil)
			got := addrServer(t, "10.0.0.0/8", forwarding, "").clientIP(&ctx, &h)
			want := "203.0.113.77"
			if peer == "198.51.100.9" {
				want = peer
			}
			if got.String() != want {
				t.Fatalf("peer %s, forged %q, joined %v: clientIP = %s, want %s", peer, forged, joined, got, want)
			}
		}
	})
}

// Resolving a trusted proxy's chain of several lines allocates nothing.
func TestClientIPDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	for _, f := range []clientaddr.Forwarding{clientaddr.XForwardedFor, clientaddr.Forwarded} {
		s := addrServer(t, "10.0.0.0/8", f, "CF-Connecting-IP")
		name, v, proxy := "X-Forwarded-For", "6.6.6.6, 203.0.113.5", "10.0.0.7"
		if f == clientaddr.Forwarded {
			name, v, proxy = "Forwarded", `for=6.6.6.6, for="[2001:db8::5]:80";proto=https`, "for=10.0.0.7"
		}
		ctx := rawCtx(t, "10.1.2.3", "GET / HTTP/1.1\nHost: x\nCookie: a=b\n"+name+": "+v+"\n"+name+": "+proxy+"\n\n")
		var h clientaddr.Hops
		want := s.clientIP(ctx, &h)
		if !want.IsValid() || want.String() == "10.1.2.3" {
			t.Fatalf("%s: clientIP = %s, want the client's", f, want)
		}
		if n := testing.AllocsPerRun(1000, func() { s.clientIP(ctx, &h) }); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", f, n)
		}
	}
}

func BenchmarkClientIP(b *testing.B) {
	s := addrServer(b, "10.0.0.0/8", clientaddr.XForwardedFor, "")
	ctx := rawCtx(b, "10.1.2.3", "GET / HTTP/1.1\nHost: x\nUser-Agent: wrk\nAccept: */*\nX-Forwarded-For: 203.0.113.5, 10.0.0.9\n\n")
	var h clientaddr.Hops
	b.ReportAllocs()
	for b.Loop() {
		s.clientIP(ctx, &h)
	}
}
