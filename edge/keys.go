package edge

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"unsafe"

	"github.com/poplimit/poplimit/window"
	"github.com/valyala/fasthttp"
)

// clientIP returns the client's address: the TCP peer, or, when the peer is
// a trusted proxy, what it says: ClientIPHeader first, else the rightmost
// X-Forwarded-For entry that is not itself a trusted proxy. IPv4-mapped IPv6
// addresses are unmapped, so one client is one key whichever form it
// arrives in. It does not allocate.
func (s *Server) clientIP(ctx *fasthttp.RequestCtx) netip.Addr {
	peer := peerAddr(ctx)
	if !s.trusted(peer) {
		return peer
	}
	if s.cfg.ClientIPHeader != "" {
		if v := ctx.Request.Header.Peek(s.cfg.ClientIPHeader); len(v) > 0 {
			if a, ok := parseIP(bytes.TrimSpace(v)); ok {
				return a
			}
		}
	}
	xff := ctx.Request.Header.Peek(fasthttp.HeaderXForwardedFor)
	for len(xff) > 0 {
		i := bytes.LastIndexByte(xff, ',')
		hop := bytes.TrimSpace(xff[i+1:])
		xff = xff[:max(i, 0)]
		a, ok := parseIP(hop)
		if !ok {
			return peer // a malformed chain: believe only what we saw
		}
		if !s.trusted(a) {
			return a
		}
		peer = a
	}
	return peer
}

func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.IPv4Unspecified()
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseIP parses an address from bytes without allocating. It accepts an
// IPv6 address in brackets, and an address with a port.
func parseIP(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	s := unsafe.String(&b[0], len(b)) // ParseAddr does not keep s
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// FallbackKeyTag starts a key built from the client IP because the rule's
// own key was missing. No key built from the request itself starts with a
// NUL byte (see AppendKey), so a fallback key never equals one.
const FallbackKeyTag = "\x00ip\x00"

// AppendFallbackKey appends the key of a request whose rule's key is
// missing and whose rule falls back to the client IP.
func AppendFallbackKey(dst []byte, ip netip.Addr) []byte {
	return ip.AppendTo(append(dst, FallbackKeyTag...))
}

// AppendKey appends the key of req from client ip under rule r to dst, as
// the edge builds it (the offline simulator builds it with this too, so the
// hashes agree). ok is false when a part of the recipe is missing. It does
// not allocate once dst has room.
//
// The encoding is injective, because a query value is percent-decoded and
// may hold any byte: a key of one part is the value itself (so overrides
// name API keys as they are), with a 0x01 put before a value that starts
// with 0x00 or 0x01, so that no key starts with the NUL of FallbackKeyTag;
// a key of several parts is each part preceded by its length (uvarint), so
// no two splits of the same bytes meet.
func AppendKey(dst []byte, req *fasthttp.Request, r *window.Rule, ip netip.Addr) (_ []byte, ok bool) {
	single := len(r.Key) == 1
	for _, p := range r.Key {
		var v []byte
		switch p.Source {
		case window.KeyIP:
			if single {
				return ip.AppendTo(dst), true
			}
			var a [64]byte
			v = ip.AppendTo(a[:0])
		case window.KeyHeader:
			v = req.Header.Peek(p.Name)
		case window.KeyQuery:
			v = req.URI().QueryArgs().Peek(p.Name)
		case window.KeyCookie:
			v = req.Header.Cookie(p.Name)
		}
		if len(v) == 0 {
			return dst, false
		}
		if single {
			if v[0] <= 0x01 {
				dst = append(dst, 0x01)
			}
			return append(dst, v...), true
		}
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst, true
}
