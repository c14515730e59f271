package httpedge

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
)

func keyRules(t testing.TB, yaml string) *rules.Rules {
	t.Helper()
	rs, err := rules.ParseRules([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// An IPv6 address that stands for an IPv4 client keys as that client, not
// as the translator's /64 that every IPv4 client shares.
func TestKeyAddrTranslated(t *testing.T) {
	rs := keyRules(t, `
rules:
  - {name: net64, limit: 1, window: 1m}
  - {name: addr, limit: 1, window: 1m, ipv6_prefix: 128}
  - {name: net48, limit: 1, window: 1m, ipv6_prefix: 48}
`)
	tests := []struct {
		addr string
		want string // the key under every rule
	}{
		{"64:ff9b::192.0.2.1", "192.0.2.1"},                      // RFC 6052 well-known prefix
		{"64:ff9b::c000:202", "192.0.2.2"},                       // the same, written in hex
		{"::ffff:0:198.51.100.7", "198.51.100.7"},                // IPv4-translated (RFC 2765)
		{"::203.0.113.9", "203.0.113.9"},                         // IPv4-compatible
		{"::ffff:203.0.113.9", "203.0.113.9"},                    // IPv4-mapped, should a front end not unmap
		{"64:ff9b:1:abcd::c000:201", "64:ff9b:1:abcd::c000:201"}, // RFC 8215 local use: the whole address
		{"64:ff9b:1:c000:2:100::", "64:ff9b:1:c000:2:100::"},     // 192.0.2.1 at a /48 (RFC 6052 §2.2)
		{"203.0.113.9", "203.0.113.9"},
	}
	for _, tt := range tests {
		for _, r := range rs.Rules {
			got, st := decision.AppendKeyStatus(nil, nil, r, netip.MustParseAddr(tt.addr))
			if st != decision.KeyBuilt || string(got) != tt.want {
				t.Errorf("rule %s, client %s: key %q, status %d; want %q, %d", r.Name, tt.addr, got, st, tt.want, decision.KeyBuilt)
			}
			if fb := decision.AppendFallbackKey(nil, r, netip.MustParseAddr(tt.addr)); string(fb) != decision.FallbackKeyTag+tt.want {
				t.Errorf("rule %s, client %s: fallback key %q, want %q", r.Name, tt.addr, fb, decision.FallbackKeyTag+tt.want)
			}
		}
	}
	// Native IPv6 keeps its network; :: and ::1 stay IPv6 (0.0.0.0/8 is
	// never a client); the next /96 after the well-known prefix is a
	// network like any other.
	for _, tt := range []struct{ addr, want string }{
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::"},
		{"::1", "::"},
		{"::", "::"},
		{"64:ff9b::1:c000:201", "64:ff9b::"},
		{"64:ff9b:2::c000:201", "64:ff9b:2::"},
	} {
		got, _ := decision.AppendKeyStatus(nil, nil, rs.Rules[0], netip.MustParseAddr(tt.addr))
		if string(got) != tt.want {
			t.Errorf("client %s: key %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// FuzzKeyAddr: every IPv4 client behind a translator keys as itself, apart
// from every other; keyAddr never panics on any address and keys native
// IPv6 by its /64.
func FuzzKeyAddr(f *testing.F) {
	f.Add([]byte{192, 0, 2, 1}, []byte{192, 0, 2, 2}, []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0, 0, 0, 1}, []byte{255, 255, 255, 255}, []byte{0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4})
	f.Add([]byte{10, 0, 0, 1}, []byte{10, 0, 0, 1}, []byte{0, 0x64, 0xff, 0x9b, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4})
	rs := keyRules(f, "rules: [{name: net64, limit: 1, window: 1m}]")
	r := rs.Rules[0]
	key := func(a netip.Addr) string {
		k, _ := decision.AppendKeyStatus(nil, nil, r, a)
		return string(k)
	}
	f.Fuzz(func(t *testing.T, a4, b4, raw []byte) {
		if len(a4) != 4 || len(b4) != 4 || len(raw) != 16 {
			return
		}
		a, b := netip.AddrFrom4([4]byte(a4)), netip.AddrFrom4([4]byte(b4))
		wkp := func(v4 netip.Addr) netip.Addr {
			x := [16]byte{0, 0x64, 0xff, 0x9b}
			copy(x[12:], v4.AsSlice())
			return netip.AddrFrom16(x)
		}
		if key(wkp(a)) != a.String() {
			t.Fatalf("%s keys as %q, want %s", wkp(a), key(wkp(a)), a)
		}
		if a != b && key(wkp(a)) == key(wkp(b)) {
			t.Fatalf("%s and %s share the key %q", wkp(a), wkp(b), key(wkp(a)))
		}
		ip := netip.AddrFrom16([16]byte(raw))
		k := key(ip)
		hi := binary.BigEndian.Uint64(raw[:8])
		translated := hi == 0 || hi == 0x0064_ff9b_0000_0000 || hi>>16 == 0x0064_ff9b_0001
		if !translated {
			if p, _ := ip.Prefix(64); k != p.Addr().String() {
				t.Fatalf("native %s keys as %q, want its /64 %s", ip, k, p.Addr())
			}
		}
	})
}

// reqFields reads a raw request as the edge does.
func reqFields(t testing.TB, head string) decision.Fields {
	t.Helper()
	return fastFields{&rawCtx(t, "192.0.2.1", head).Request}
}

// A key field that appears more than once is refused, or keyed by its
// first or last value, as the rule says; a second Cookie line is the same
// cookie list.
func TestAppendKeyDuplicateFields(t *testing.T) {
	rs := keyRules(t, `
rules:
  - {name: refuse, key: ["header:X-API-Key"], limit: 1, window: 1m}
  - {name: first, key: ["header:X-API-Key"], duplicate_key: first, limit: 1, window: 1m}
  - {name: last, key: ["header:X-API-Key"], duplicate_key: last, limit: 1, window: 1m}
  - {name: q-refuse, key: ["query:key"], limit: 1, window: 1m}
  - {name: q-last, key: ["query:key"], duplicate_key: last, limit: 1, window: 1m}
  - {name: c-refuse, key: ["cookie:sid"], limit: 1, window: 1m}
  - {name: c-last, key: ["cookie:sid"], duplicate_key: last, limit: 1, window: 1m}
  - {name: parts, key: ["header:X-Missing", "query:key"], limit: 1, window: 1m}
`)
	const hdr = "GET / HTTP/1.1\nHost: x\nX-API-Key: r1\nx-api-key: real\n\n"
	const query = "GET /?key=r1&k%65y=real HTTP/1.1\nHost: x\n\n"
	const cookie = "GET / HTTP/1.1\nHost: x\nCookie: sid=r1; a=b\nCookie: sid=\"real\"\n\n"
	tests := []struct {
		rule, head string
		want       string
		st         decision.KeyStatus
	}{
		{"refuse", hdr, "", decision.KeyDuplicate},
		{"first", hdr, "r1", decision.KeyBuilt},
		{"last", hdr, "real", decision.KeyBuilt},
		{"refuse", "GET / HTTP/1.1\nHost: x\nX-API-Key: real\n\n", "real", decision.KeyBuilt},
		{"refuse", "GET / HTTP/1.1\nHost: x\nX-API-Key:\nX-API-Key: real\n\n", "", decision.KeyDuplicate},
		{"q-refuse", query, "", decision.KeyDuplicate},
		{"q-refuse", "GET /?key&key=real HTTP/1.1\nHost: x\n\n", "", decision.KeyDuplicate},
		{"q-last", query, "real", decision.KeyBuilt},
		{"q-refuse", "GET /?key=%72eal HTTP/1.1\nHost: x\n\n", "real", decision.KeyBuilt}, // query: percent-decoded
		{"c-refuse", cookie, "", decision.KeyDuplicate},
		{"c-last", cookie, "real", decision.KeyBuilt},
		{"c-refuse", "GET / HTTP/1.1\nHost: x\nCookie: sid=%72eal\n\n", "%72eal", decision.KeyBuilt}, // cookie: as written
		{"parts", "GET /?key=a&key=b HTTP/1.1\nHost: x\n\n", "", decision.KeyDuplicate},              // outranks the missing part
		{"parts", "GET /?key=a HTTP/1.1\nHost: x\n\n", "", decision.KeyMissing},
	}
	for _, tt := range tests {
		r := rs.Lookup(tt.rule)
		got, st := decision.AppendKeyStatus(nil, reqFields(t, tt.head), r, netip.MustParseAddr("192.0.2.1"))
		if st != tt.st || st == decision.KeyBuilt && string(got) != tt.want {
			t.Errorf("rule %s, %q: key %q, status %d; want %q, %d", tt.rule, tt.head, got, st, tt.want, tt.st)
		}
	}
}

// Counting every occurrence of a key field allocates nothing on the
// fasthttp path.
func TestKeyFieldsDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	rs := keyRules(t, `
rules:
  - {name: all, key: ["header:X-API-Key", "query:key", "cookie:sid", ip], duplicate_key: last, limit: 1, window: 1m}
`)
	f := reqFields(t, "GET /a?key=r1&key=real&z=1 HTTP/1.1\nHost: x\nX-API-Key: a\nX-API-Key: b\nCookie: sid=1; q=2\nCookie: sid=2\n\n")
	ip := netip.MustParseAddr("2001:db8::1")
	dst := make([]byte, 0, 256)
	var got []byte
	n := testing.AllocsPerRun(1000, func() {
		var st decision.KeyStatus
		got, st = decision.AppendKeyStatus(dst[:0], f, rs.Rules[0], ip)
		if st != decision.KeyBuilt {
			t.Fatalf("status %d", st)
		}
	})
	if n != 0 {
		t.Errorf("AppendKeyStatus: %v allocs/op, want 0", n)
	}
	for _, part := range []string{"b", "real", "2", "2001:db8::"} {
		if !bytes.Contains(got, []byte(part)) {
			t.Errorf("key %q lacks %q", got, part)
		}
	}
	wkp := netip.MustParseAddr("64:ff9b::192.0.2.1")
	if n := testing.AllocsPerRun(1000, func() { decision.KeyAddr(rs.Rules[0], wkp) }); n != 0 {
		t.Errorf("keyAddr: %v allocs/op, want 0", n)
	}
	if !strings.Contains(string(got), "real") {
		t.Errorf("key %q: the last query value is real", got)
	}
}
