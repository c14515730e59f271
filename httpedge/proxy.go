package httpedge

import (
	"bytes"
	"errors"
	"io"
	"iter"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/rules"
)

// Proxy mode is a reverse proxy in the sense of RFC 9110 §7.6:
//
//   - Hop-by-hop fields (§7.6.1) are removed in both directions:
//     Connection and every field it names, Keep-Alive, Proxy-Connection,
//     Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
//     Transfer-Encoding and Upgrade. The edge frames each message itself
//     (Content-Length, or chunked when the length is unknown), so a
//     message's framing never crosses it; Content-Length and Host are kept
//     even when Connection names them.
//   - X-Forwarded-For gets this hop: the address of the edge's TCP peer,
//     appended to the lines a trusted proxy sent (joined into one line, in
//     order), or replacing what an untrusted client sent (whose address is
//     then the whole chain, so nothing it forged travels on). An origin
//     that trusts the edge walks the chain from the right as the edge
//     does (Config.TrustedProxies). X-Forwarded-Proto (http, or https
//     when the edge serves TLS) and X-Forwarded-Host (the request's host)
//     are set, or kept when a trusted proxy sent them (it saw the client's
//     scheme and host; the edge did not). With Forwarding set to Forwarded,
//     an RFC 7239 element for=…;host=…;proto=… is added the same way. From
//     an untrusted client, Forwarded and ClientIPHeader are removed.
//   - Via (§7.6.3) gets "1.1 poplimit" (the received version) appended,
//     in requests and in responses.
//   - Bodies stream in both directions: nothing is buffered but a request
//     body of at most 64 KiB (so that it can be sent again on a retry), and
//     a chunked body's first 64 KiB (validated before the decision).
//   - Requests whose framing could smuggle a second request are refused
//     with 400 before any decision (see checkFraming).
//   - Upstreams are picked round-robin among the healthy ones; idempotent
//     requests are retried on the next one after a connection error,
//     never after a response.

// hopHeaders are the hop-by-hop fields removed in both directions.
var hopHeaders = [...]string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade"}

// endToEnd are the fields kept even when Connection names them: removing
// Content-Length would drop the body, and Host routes the request.
var endToEnd = [...]string{"Content-Length", "Host"}

// requestApart and responseApart are the fields fasthttp keeps apart from
// its list of a header's lines (and Date, which a response header will
// not take back once deleted): rewrite deletes them when dropped, and
// otherwise leaves them be.
var (
	requestApart  = []string{"Host", "Content-Type", "Content-Length", "User-Agent", "Cookie", "Trailer"}
	responseApart = []string{"Content-Type", "Content-Length", "Content-Encoding", "Server", "Set-Cookie", "Trailer", "Date"}
)

const (
	hXForwardedFor   = "X-Forwarded-For"
	hXForwardedProto = "X-Forwarded-Proto"
	hXForwardedHost  = "X-Forwarded-Host"
	hForwarded       = "Forwarded"
	hVia             = "Via"
	viaPseudonym     = " poplimit"
)

// bufferedBody is the largest request body read whole before it is
// forwarded, so that a retry can send it again.
const bufferedBody = 64 << 10

// maxConnectionTokens bounds the fields one message's Connection may name;
// a request naming more is answered 400, a response 502.
const maxConnectionTokens = 64

// proxyScratch is one proxied request's working space, pooled.
type proxyScratch struct {
	filter        fieldFilter
	names, values []byte      // the header's lines, copied out of it by rewrite
	lines         []fieldLine // and where each ends in names and values
	xff, fwd, via []byte      // field values being built
	host          []byte
	body          []byte   // a buffered request body
	stream        bodyRead // a streamed request body
}

// fieldLine is one header line copied by rewrite.
type fieldLine struct {
	nameEnd, valueEnd int
	drop, apart       bool
}

var proxyScratchPool = sync.Pool{New: func() any { return new(proxyScratch) }}

// bodyRead wraps a streamed request body: it records whether it was read
// at all (a body not yet read can still go to another upstream) and the
// first error reading it (the client's, not the upstream's).
type bodyRead struct {
	r       io.Reader
	touched bool
	err     error
}

func (b *bodyRead) Read(p []byte) (int, error) {
	b.touched = true
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// headerFields is what the proxy needs of a request or response header.
type headerFields interface {
	All() iter.Seq2[[]byte, []byte]
	DelBytes(key []byte)
	AddBytesKV(key, value []byte)
	DisableNormalizing() bool
	EnableNormalizing() bool
}

// fieldFilter says which fields of a message the proxy drops: the
// hop-by-hop ones and those it replaces.
type fieldFilter struct {
	tokens []byte // Connection's values, copied, comma-separated
	ntok   int
	names  [8]string // fields replaced or removed besides
	n      int
}

// reset makes f drop the hop-by-hop fields of h, and reports false when
// h's Connection names more than maxConnectionTokens fields.
func (f *fieldFilter) reset(h headerFields) bool {
	f.tokens, f.ntok, f.n = f.tokens[:0], 0, 0
	for k, v := range h.All() {
		if rules.EqualFold(k, hopHeaders[0]) {
			f.tokens = append(append(f.tokens, v...), ',')
			f.ntok += bytes.Count(v, []byte{','}) + 1
		}
	}
	return f.ntok <= maxConnectionTokens
}

// also makes f drop the field name too.
func (f *fieldFilter) also(name string) {
	f.names[f.n] = name
	f.n++
}

func (f *fieldFilter) drops(name []byte) bool {
	if isHop(name, f.tokens) {
		return true
	}
	for _, n := range f.names[:f.n] {
		if rules.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// forward sends the request to an upstream and leaves its response in ctx
// (its body streaming from the upstream while the server writes it): 504
// when the upstream does not answer within UpstreamTimeout, 502 when it
// cannot be reached, 400 when the client's body is malformed or ends early.
// It reports whether the response is the upstream's.
func (s *Server) forward(ctx *fasthttp.RequestCtx) (upstreamAnswered bool) {
	p := s.upstream
	ps := proxyScratchPool.Get().(*proxyScratch)
	defer proxyScratchPool.Put(ps)
	req := &ctx.Request
	if !s.rewriteRequest(ctx, ps) {
		writeProblem(ctx, fasthttp.StatusBadRequest, "the request's Connection field names too many fields")
		return false
	}
	if ctx.IsTLS() {
		req.URI().SetScheme("http") // the upstream is plain HTTP
	}

	replayable := true
	ps.stream = bodyRead{}
	if req.IsBodyStream() {
		if n := req.Header.ContentLength(); n >= 0 && n <= bufferedBody {
			ps.body = slices.Grow(ps.body[:0], n)[:n]
			if _, err := io.ReadFull(req.BodyStream(), ps.body); err != nil {
				writeProblem(ctx, fasthttp.StatusBadRequest, "the request body ended before its Content-Length")
				return false
			}
			req.SetBody(ps.body)
		} else {
			ps.stream.r = req.BodyStream()
			req.SetBodyStream(&ps.stream, n)
			replayable = false
			defer req.CloseBodyStream() // ps goes back to the pool: nothing may read it later
		}
	}
	retryable := p.retries > 0 && p.idempotent(req)

	deadline := time.Now().Add(s.cfg.UpstreamTimeout)
	begin := s.core.BeginUpstream()
	var err error
	var tried uint64
	turn := p.turn()
	for attempt := 0; ; attempt++ {
		i := p.pick(turn, tried)
		tried |= 1 << i
		if len(req.Header.Host()) == 0 {
			req.Header.SetHost(p.ups[i].addr)
		}
		timeout := time.Until(deadline)
		if timeout <= 0 {
			err = fasthttp.ErrTimeout
			break
		}
		err = p.ups[i].client.DoTimeout(req, &ctx.Response, timeout)
		resendable := replayable || !ps.stream.touched
		if err == nil || !retryable || attempt >= p.retries || ps.stream.err != nil || !resendable || !connectionError(err) {
			break
		}
		p.retried.Inc()
	}
	s.core.EndUpstream(begin)
	if err == nil {
		if !rewriteResponse(&ctx.Response, ps) {
			ctx.Response.Reset()
			s.m.upstreamError.Inc()
			writeProblem(ctx, fasthttp.StatusBadGateway, "the upstream's Connection field names too many fields")
			return false
		}
		return true
	}
	ctx.Response.Reset()
	switch {
	case ps.stream.err != nil:
		ctx.SetConnectionClose()
		writeProblem(ctx, fasthttp.StatusBadRequest, "the request body is malformed or ended early")
	case isTimeout(err):
		s.m.upstreamTimeout.Inc()
		writeProblem(ctx, fasthttp.StatusGatewayTimeout, "the upstream did not answer in time")
	default:
		s.m.upstreamError.Inc()
		writeProblem(ctx, fasthttp.StatusBadGateway, "the upstream could not be reached")
	}
	return false
}

// rewriteRequest makes the request's header the one to forward: no
// hop-by-hop fields, the forwarding fields and Via of this hop. It
// reports false when Connection names too many fields.
func (s *Server) rewriteRequest(ctx *fasthttp.RequestCtx, ps *proxyScratch) bool {
	h := &ctx.Request.Header
	f := &ps.filter
	if !f.reset(h) {
		return false
	}
	addr := peerAddr(ctx) // this hop: the node that connected to the edge
	trusted := s.addr.Trusted(addr)
	proto := "http"
	if ctx.IsTLS() {
		proto = "https"
	}
	ps.host = append(ps.host[:0], ctx.Host()...)

	// The new values, from the old lines, before any is dropped.
	ps.xff = ps.xff[:0]
	if trusted {
		ps.xff = appendLines(ps.xff, h, hXForwardedFor)
	}
	ps.xff = addr.AppendTo(appendSep(ps.xff))
	f.also(hXForwardedFor)
	keepProto := trusted && has(h, hXForwardedProto)
	if !keepProto {
		f.also(hXForwardedProto)
	}
	keepHost := len(ps.host) == 0 || trusted && has(h, hXForwardedHost)
	if !keepHost {
		f.also(hXForwardedHost)
	}
	fwd := s.cfg.Forwarding == clientaddr.Forwarded
	if fwd || !trusted {
		f.also(hForwarded)
	}
	if fwd {
		ps.fwd = ps.fwd[:0]
		if trusted {
			ps.fwd = appendLines(ps.fwd, h, hForwarded)
		}
		ps.fwd = appendForwardedElement(appendSep(ps.fwd), addr, ps.host, proto)
	}
	if !trusted && s.cfg.ClientIPHeader != "" {
		f.also(s.cfg.ClientIPHeader)
	}
	ps.via = appendVia(ps.via[:0], h, h.Protocol())
	f.also(hVia)

	rewrite(h, requestApart, f, ps)
	h.ResetConnectionClose()
	h.AddBytesKV([]byte(hXForwardedFor), ps.xff)
	if !keepProto {
		h.AddBytesKV([]byte(hXForwardedProto), []byte(proto))
	}
	if !keepHost {
		h.AddBytesKV([]byte(hXForwardedHost), ps.host)
	}
	if fwd {
		h.AddBytesKV([]byte(hForwarded), ps.fwd)
	}
	h.AddBytesKV([]byte(hVia), ps.via)
	return true
}

// rewriteResponse makes the upstream's response header the one to send
// on: no hop-by-hop fields, and Via of this hop. It reports false when
// Connection names too many fields.
func rewriteResponse(resp *fasthttp.Response, ps *proxyScratch) bool {
	h := &resp.Header
	f := &ps.filter
	if !f.reset(h) {
		return false
	}
	ps.via = appendVia(ps.via[:0], h, h.Protocol())
	f.also(hVia)
	rewrite(h, responseApart, f, ps)
	h.ResetConnectionClose() // the upstream's connection is not the client's
	h.AddBytesKV([]byte(hVia), ps.via)
	return true
}

// rewrite deletes from h every field f drops, keeping the order of the
// lines left, as RFC 9110 §5.3 requires of a proxy for the lines of one
// field. fasthttp's Del moves the last line into the place of the one it
// deletes, so when any line of its list is dropped, every line of the list
// is deleted and the kept ones added back in order. Fields kept apart
// (apart) are only deleted, when dropped.
func rewrite(h headerFields, apart []string, f *fieldFilter, ps *proxyScratch) {
	ps.names, ps.values, ps.lines = ps.names[:0], ps.values[:0], ps.lines[:0]
	listDropped := false
	for k, v := range h.All() {
		l := fieldLine{drop: f.drops(k), apart: isOneOf(k, apart)}
		if !l.drop && l.apart {
			continue
		}
		listDropped = listDropped || l.drop && !l.apart
		ps.names, ps.values = append(ps.names, k...), append(ps.values, v...)
		l.nameEnd, l.valueEnd = len(ps.names), len(ps.values)
		ps.lines = append(ps.lines, l)
	}
	if len(ps.lines) == 0 {
		return
	}
	normalizing := !h.DisableNormalizing() // the names are as stored
	n, v := 0, 0
	for _, l := range ps.lines {
		if l.drop || listDropped {
			h.DelBytes(ps.names[n:l.nameEnd])
		}
		n, v = l.nameEnd, l.valueEnd
	}
	if listDropped {
		n, v = 0, 0
		for _, l := range ps.lines {
			if !l.drop {
				h.AddBytesKV(ps.names[n:l.nameEnd], ps.values[v:l.valueEnd])
			}
			n, v = l.nameEnd, l.valueEnd
		}
	}
	if normalizing {
		h.EnableNormalizing()
	}
}

func isOneOf(name []byte, names []string) bool {
	for _, n := range names {
		if rules.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// idempotent reports whether req may be sent again after a connection
// error: GET, HEAD, OPTIONS, PUT, DELETE and TRACE (RFC 9110 §9.2.2), and
// POST or PATCH carrying the idempotency header
// (draft-ietf-httpapi-idempotency-key-header).
func (p *upstreamPool) idempotent(req *fasthttp.Request) bool {
	h := &req.Header
	switch {
	case h.IsGet(), h.IsHead(), h.IsOptions(), h.IsPut(), h.IsDelete(), h.IsTrace():
		return true
	case h.IsPost(), h.IsPatch():
		return p.idempotencyHdr != "" && len(h.Peek(p.idempotencyHdr)) > 0
	}
	return false
}

// connectionError reports whether err failed a request before any
// response: the dial failed, the connection broke or closed before the
// response began, or no connection was free (nothing was sent). A timeout
// is not one: the upstream may be working on the request.
func connectionError(err error) bool {
	var de *dialError
	switch {
	case errors.As(err, &de):
		return true
	case isTimeout(err):
		return false
	}
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, fasthttp.ErrNoFreeConns)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// isHop reports whether the field name is hop-by-hop: one of hopHeaders,
// or named in tokens (Connection's values, comma-separated).
func isHop(name, tokens []byte) bool {
	for _, h := range hopHeaders {
		if rules.EqualFold(name, h) {
			return true
		}
	}
	for _, h := range endToEnd {
		if rules.EqualFold(name, h) {
			return false
		}
	}
	for len(tokens) > 0 {
		tok := tokens
		if i := bytes.IndexByte(tokens, ','); i >= 0 {
			tok, tokens = tokens[:i], tokens[i+1:]
		} else {
			tokens = nil
		}
		if tok = bytes.Trim(tok, " \t"); len(tok) > 0 && bytes.EqualFold(tok, name) {
			return true
		}
	}
	return false
}

// appendLines appends the lines of h's field name (any case) joined by
// ", ", as RFC 9110 §5.3 combines them.
func appendLines(dst []byte, h headerFields, name string) []byte {
	n := len(dst)
	for k, v := range h.All() {
		if rules.EqualFold(k, name) && len(bytes.Trim(v, " \t")) > 0 {
			if len(dst) > n {
				dst = append(dst, ", "...)
			}
			dst = append(dst, bytes.Trim(v, " \t")...)
		}
	}
	return dst
}

// has reports whether h has a non-empty field name.
func has(h headerFields, name string) bool {
	for k, v := range h.All() {
		if rules.EqualFold(k, name) && len(bytes.Trim(v, " \t")) > 0 {
			return true
		}
	}
	return false
}

// appendSep appends ", " to a non-empty list.
func appendSep(dst []byte) []byte {
	if len(dst) > 0 {
		dst = append(dst, ", "...)
	}
	return dst
}

// appendVia appends h's Via lines and this hop's entry, for a message
// received with protocol (e.g. "HTTP/1.1").
func appendVia(dst []byte, h headerFields, protocol []byte) []byte {
	dst = appendSep(appendLines(dst, h, hVia))
	if v, ok := bytes.CutPrefix(protocol, []byte("HTTP/")); ok && len(v) > 0 {
		dst = append(dst, v...)
	} else {
		dst = append(dst, "1.1"...)
	}
	return append(dst, viaPseudonym...)
}

// appendForwardedElement appends an RFC 7239 forwarded-element for the
// client addr, the host it asked for, and the scheme it used.
func appendForwardedElement(dst []byte, addr netip.Addr, host []byte, proto string) []byte {
	dst = append(dst, "for="...)
	if addr.Is6() {
		dst = append(dst, `"[`...)
		dst = addr.AppendTo(dst)
		dst = append(dst, `]"`...)
	} else {
		dst = addr.AppendTo(dst)
	}
	if len(host) > 0 {
		dst = append(dst, `;host="`...)
		for _, c := range host {
			if c == '"' || c == '\\' {
				dst = append(dst, '\\')
			}
			dst = append(dst, c)
		}
		dst = append(dst, '"')
	}
	return append(append(dst, ";proto="...), proto...)
}
