package httpedge

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// A path the edge matches one way and an origin reads another would let a
// request dodge a path rule. The edge matches the path percent-decoded,
// with dot segments resolved and "//" merged (RFC 3986 §5.2.4), and
// forwards it as the client sent it; origins agree on all of that but for
// two spellings:
//
//   - a backslash, raw or %5C: the WHATWG URL standard (browsers, Node's
//     new URL) reads it as "/" in http and https URLs, so /x/..\login is
//     /login there, while Go's net/http and nginx on Linux read it as a
//     byte of a segment;
//   - a path that starts with "//": the WHATWG parser reads //evil/login
//     as the authority "evil" and the path /login, where nginx merges the
//     slashes and Go's ServeMux redirects to /evil/login.
//
// Rewriting either would change bytes the origin routes by, and whichever
// reading the edge chose some origin would read otherwise; so the edge
// refuses such a path with 400 before any decision, in both modes, and
// counts it (poplimit_edge_bad_requests_total{reason="ambiguous_path"}).
// In decision mode the same holds for the path after the check prefix, and
// for X-Original-URI and X-Forwarded-Uri, where auth-request proxies say
// which target the origin will see. A backslash in the query is left
// alone: no parser reads the query as a path.

// ambiguousPathDetail is the problem detail of such a refusal; it needs
// no JSON escaping.
const ambiguousPathDetail = "the path holds a backslash (or %5C) or starts with two slashes, which origins read in different ways; send it with forward slashes only"

// forwardedURIHeaders name the original target in an auth subrequest:
// nginx's auth_request idiom (X-Original-URI), Caddy's forward_auth and
// Traefik's ForwardAuth (X-Forwarded-Uri).
var forwardedURIHeaders = [...]string{"X-Original-URI", "X-Forwarded-Uri"}

// ambiguousPath reports whether a raw path (as sent, before the query)
// holds a backslash or %5C in either case, or starts with "//". It does
// not allocate.
func ambiguousPath(raw []byte) bool {
	if len(raw) >= 2 && raw[0] == '/' && raw[1] == '/' {
		return true
	}
	if bytes.IndexByte(raw, '\\') >= 0 {
		return true
	}
	for i := bytes.IndexByte(raw, '%'); i >= 0 && i+2 < len(raw); {
		if raw[i+1] == '5' && raw[i+2]|0x20 == 'c' {
			return true
		}
		j := bytes.IndexByte(raw[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// ambiguousTarget reports whether a request target's path (what precedes
// '?' or '#') is ambiguous.
func ambiguousTarget(target []byte) bool {
	if i := bytes.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	return ambiguousPath(target)
}

// refusesPath reports whether the request's path, as the mode reads it,
// is ambiguous; it has then answered 400 and counted it.
func (s *Server) refusesPath(ctx *fasthttp.RequestCtx, checking bool) bool {
	if !AmbiguousRequest(&ctx.Request, s.cfg.CheckPrefix, checking) {
		return false
	}
	s.core.RefusedPath()
	writeProblem(ctx, fasthttp.StatusBadRequest, ambiguousPathDetail)
	return true
}

// AmbiguousRequest reports whether the edge refuses req for a path that
// origins read differently (see above): its path as sent, or, for a check
// (decision mode: checking), its path after checkPrefix and the targets
// in X-Original-URI and X-Forwarded-Uri. The offline simulator asks it as
// the server does. It does not allocate.
func AmbiguousRequest(req *fasthttp.Request, checkPrefix string, checking bool) bool {
	raw := req.URI().PathOriginal()
	if !checking {
		return ambiguousPath(raw)
	}
	if ambiguousPath(StripPrefix(raw, checkPrefix)) {
		return true
	}
	for _, h := range forwardedURIHeaders {
		for _, v := range req.Header.PeekAll(h) {
			if ambiguousTarget(v) {
				return true
			}
		}
	}
	return false
}
