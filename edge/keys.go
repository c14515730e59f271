package edge

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/poplimit/poplimit/rules"
	"github.com/valyala/fasthttp"
)

// clientIP returns the client's address (see clientAddr): the TCP peer, or,
// when the peer is a trusted proxy, what the proxies say in every line of
// the configured forwarding header, read from the header section only (a
// client writes the trailers, and a request that announces a forwarding
// header as a trailer is keyed by its peer). It does not allocate.
func (s *Server) clientIP(ctx *fasthttp.RequestCtx, h *Hops) netip.Addr {
	a, _ := s.client(ctx, h)
	return a
}

// client returns the client's address (see clientIP) and whether the TCP
// peer is a trusted proxy.
func (s *Server) client(ctx *fasthttp.RequestCtx, h *Hops) (netip.Addr, bool) {
	peer := peerAddr(ctx)
	if !s.addr.isTrusted(peer) {
		return peer, false
	}
	return s.fromProxies(ctx, peer, h), true
}

func (s *Server) fromProxies(ctx *fasthttp.RequestCtx, peer netip.Addr, h *Hops) netip.Addr {
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
func keyAddr(r *rules.Rule, ip netip.Addr) netip.Addr {
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
func AppendFallbackKey(dst []byte, r *rules.Rule, ip netip.Addr) []byte {
	return keyAddr(r, ip).AppendTo(append(dst, FallbackKeyTag...))
}

// AppendKey appends the key of a request with fields f (nil: none) from
// client ip under rule r to dst. ok is false when a part of the recipe is missing. It does
// not allocate once dst has room.
//
// The encoding is injective, because a query value is percent-decoded and
// may hold any byte: a key of one part is the value itself (so overrides
// name API keys as they are), with a 0x01 put before a value that starts
// with 0x00 or 0x01, so that no key starts with the NUL of FallbackKeyTag;
// a key of several parts is each part preceded by its length (uvarint), so
// no two splits of the same bytes meet.
func AppendKey(dst []byte, f Fields, r *rules.Rule, ip netip.Addr) (_ []byte, ok bool) {
	single := len(r.Key) == 1
	for _, p := range r.Key {
		var v []byte
		switch p.Source {
		case rules.KeyIP:
			if single {
				return keyAddr(r, ip).AppendTo(dst), true
			}
			var a [64]byte
			v = keyAddr(r, ip).AppendTo(a[:0])
		case rules.KeyHeader:
			if f != nil {
				v = f.Header(p.Name)
			}
		case rules.KeyQuery:
			if f != nil {
				v = f.Query(p.Name)
			}
		case rules.KeyCookie:
			if f != nil {
				v = f.Cookie(p.Name)
			}
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

// FastFields returns the Fields of a fasthttp request, as the edge reads
// them: the first header line, the first query parameter, the cookie.
func FastFields(req *fasthttp.Request) Fields { return fastFields{req} }

// fastFields reads a fasthttp request's fields for the core. One pointer
// wide, it converts to Fields without allocating.
type fastFields struct{ r *fasthttp.Request }

func (f fastFields) Header(name string) []byte { return f.r.Header.Peek(name) }
func (f fastFields) Query(name string) []byte  { return f.r.URI().QueryArgs().Peek(name) }
func (f fastFields) Cookie(name string) []byte { return f.r.Header.Cookie(name) }
