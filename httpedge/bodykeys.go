package httpedge

import (
	"bytes"
	"io"
	"slices"
	"sync"

	"github.com/valyala/fasthttp"
)

// Keys from the body (form: and json: key parts). For a request that such
// a rule matches (decision.Core.WantsBody), the edge holds at most the
// core's BodyKeyBytes of the body before the decision:
//
//   - a body already in memory (decision mode, or a fasthttp server that
//     does not stream request bodies) is read where it is;
//   - a streamed body with a Content-Length within the bound is read
//     whole and kept as the request's body, so proxy mode forwards exactly
//     those bytes with that Content-Length;
//   - a streamed body with a larger Content-Length is not read at all: it
//     is over the bound, and streams on untouched;
//   - a chunked body (proxy mode prefetched up to 64 KiB of it, see
//     checkFraming) that ends within the bound is kept whole; a longer one
//     has its first bytes put back in front of the rest of the stream, so
//     the handler or the upstream reads it all, in order.
//
// In decision mode, Envoy's ext_authz filter with with_request_body sends
// the body of the request it asks about (at most max_request_bytes; with
// allow_partial_message, a cut body is marked by x-envoy-auth-partial-body:
// true, read as over the bound); nginx auth_request and Caddy forward_auth
// send no body.

// heldPool holds the buffers a body within the bound is read into before
// fasthttp copies it into the request.
var heldPool = sync.Pool{New: func() any { return new([]byte) }}

// partialBodyHeader marks a body that Envoy's ext_authz filter cut at its
// max_request_bytes (allow_partial_message).
const partialBodyHeader = "X-Envoy-Auth-Partial-Body"

// holdBody makes the first BodyKeyBytes of ctx's request body readable
// from memory when the body streams, as described above. It reports false,
// having answered 400, when the body ends before its Content-Length.
func (s *Server) holdBody(ctx *fasthttp.RequestCtx) bool {
	req := &ctx.Request
	if !req.IsBodyStream() {
		return true
	}
	bound := s.core.BodyKeyBytes()
	n := req.Header.ContentLength()
	switch {
	case n > bound:
		return true // over the bound: streams on unread
	case n >= 0:
		bp := heldPool.Get().(*[]byte)
		defer heldPool.Put(bp)
		buf := slices.Grow((*bp)[:0], n)[:n]
		*bp = buf
		if _, err := io.ReadFull(req.BodyStream(), buf); err != nil {
			ctx.SetConnectionClose()
			writeProblem(ctx, fasthttp.StatusBadRequest, "the request body ended before its Content-Length")
			return false
		}
		req.SetBody(buf) // copied into the request's own buffer
		return true
	}
	// Chunked, or read until the connection closes: up to bound+1 bytes.
	stream := req.BodyStream()
	buf := make([]byte, 0, min(bound+1, 4<<10))
	for len(buf) <= bound {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		k, err := stream.Read(buf[len(buf):min(cap(buf), bound+1)])
		buf = buf[:len(buf)+k]
		if err == io.EOF {
			req.SetBody(buf)
			return true
		}
		if err != nil {
			ctx.SetConnectionClose()
			writeProblem(ctx, fasthttp.StatusBadRequest, "the request body is malformed or ended early")
			return false
		}
	}
	req.SetBodyStream(io.MultiReader(bytes.NewReader(buf), stream), -1)
	return true
}

// Body gives the core the request body when it is in memory (whole), and
// nothing when it streams (over the bound; see holdBody) (decision.Body).
func (f fastFields) Body() ([]byte, bool) {
	if f.r.IsBodyStream() {
		return nil, false
	}
	return f.r.Body(), true
}

// checkFields are the Fields of a check in decision mode: the body is the
// one the proxy sent, which Envoy's ext_authz filter marks when it cut it.
// (Elsewhere the header is the client's, and means nothing.) One pointer
// wide, it converts to Fields without allocating.
type checkFields struct{ fastFields }

func (f checkFields) Body() ([]byte, bool) {
	if v := f.r.Header.Peek(partialBodyHeader); len(v) > 0 && !bytes.EqualFold(bytes.TrimSpace(v), []byte("false")) {
		return nil, false
	}
	return f.fastFields.Body()
}
