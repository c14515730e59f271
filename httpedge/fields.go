package httpedge

import (
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
)

// fromProxies returns the client's address of a request whose TCP peer is
// a trusted proxy (see clientaddr.Resolver): what the proxies say in every
// line of the configured forwarding header, read from the header section
// only (a client writes the trailers, and a request that announces a
// forwarding header as a trailer is keyed by its peer). It does not
// allocate.
func (s *Server) fromProxies(ctx *fasthttp.RequestCtx, peer netip.Addr, h *clientaddr.Hops) netip.Addr {
	r := s.addr
	for k := range ctx.Request.Header.Trailers() {
		if r.Classify(k) != clientaddr.Other {
			return peer
		}
	}
	h.Reset()
	var ipHeader []byte
	for k, v := range ctx.Request.Header.All() {
		switch r.Classify(k) {
		case clientaddr.ForwardingLine:
			h.AddLine(r.Forwarding(), v)
		case clientaddr.ClientIPLine:
			ipHeader = v
		}
	}
	return r.Resolve(peer, ipHeader, h)
}

func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.IPv4Unspecified()
}

// FastFields returns the Fields of a fasthttp request, as the edge reads
// them.
func FastFields(req *fasthttp.Request) decision.Fields { return fastFields{req} }

// fastFields reads a fasthttp request's fields for the core. One pointer
// wide, it converts to Fields without allocating.
type fastFields struct{ r *fasthttp.Request }

// Header counts the lines called name that fasthttp holds, header and
// trailer sections alike (Peek would answer from a trailer too).
func (f fastFields) Header(name string) (first, last []byte, n int) {
	vs := f.r.Header.PeekAll(name)
	if len(vs) == 0 {
		return nil, nil, 0
	}
	return vs[0], vs[len(vs)-1], len(vs)
}

// Query counts the pairs of the query that fasthttp parsed (percent- and
// plus-decoded, names and values).
func (f fastFields) Query(name string) (first, last []byte, n int) {
	for k, v := range f.r.URI().QueryArgs().All() {
		if string(k) == name {
			if n == 0 {
				first = v
			}
			last, n = v, n+1
		}
	}
	return first, last, n
}

// RawQuery returns the query as the client sent it, for rules that split
// it on ';' too (decision.RawQuery).
func (f fastFields) RawQuery() []byte { return f.r.URI().QueryString() }

// Cookie counts the cookies fasthttp parsed from every Cookie line.
func (f fastFields) Cookie(name string) (first, last []byte, n int) {
	for k, v := range f.r.Header.Cookies() {
		if string(k) == name {
			if n == 0 {
				first = v
			}
			last, n = v, n+1
		}
	}
	return first, last, n
}
