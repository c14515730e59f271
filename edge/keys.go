package edge

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/poplimit/poplimit/window"
	"github.com/valyala/fasthttp"
)

// clientIP returns the client's address (see clientAddr): the TCP peer, or,
// when the peer is a trusted proxy, what the proxies say in every line of
// the configured forwarding header, read from the header section only (a
// client writes the trailers, and a request that announces a forwarding
// header as a trailer is keyed by its peer). It does not allocate.
func (s *Server) clientIP(ctx *fasthttp.RequestCtx, h *Hops) netip.Addr {
	peer := peerAddr(ctx)
	if !s.addr.isTrusted(peer) {
		return peer
	}
	a := &s.addr
	for k := range ctx.Request.Header.Trailers() {
		if a.isAddressHeader(k) {
			return peer
		}
	}
	h.Reset()
	var ipHeader []byte
	for k, v := range ctx.Request.Header.All() {
		switch {
		case bytes.EqualFold(k, a.fwdName):
			h.AddLine(a.forwarding, v)
		case len(a.ipHeader) > 0 && bytes.EqualFold(k, a.ipHeader):
			ipHeader = v
		}
	}
	return s.addr.resolve(peer, ipHeader, h)
}

func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.IPv4Unspecified()
}

// keyAddr is the part of ip that a rule keys on: the address itself for
// IPv4, its network of the rule's IPv6Prefix bits for IPv6 (a subscriber
// holds a whole /64 and can rotate addresses inside it).
func keyAddr(r *window.Rule, ip netip.Addr) netip.Addr {
	if ip.Is6() && r.IPv6Prefix > 0 && r.IPv6Prefix < 128 {
		if p, err := ip.Prefix(r.IPv6Prefix); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// FallbackKeyTag starts a key built from the client IP because the rule's
// own key was missing. No key built from the request itself starts with a
// NUL byte (see AppendKey), so a fallback key never equals one.
const FallbackKeyTag = "\x00ip\x00"

// AppendFallbackKey appends the key of a request whose rule's key is
// missing and whose rule falls back to the client IP (or, for IPv6, its
// network of the rule's IPv6Prefix).
func AppendFallbackKey(dst []byte, r *window.Rule, ip netip.Addr) []byte {
	return keyAddr(r, ip).AppendTo(append(dst, FallbackKeyTag...))
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
				return keyAddr(r, ip).AppendTo(dst), true
			}
			var a [64]byte
			v = keyAddr(r, ip).AppendTo(a[:0])
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
