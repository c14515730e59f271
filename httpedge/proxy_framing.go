package httpedge

import (
	"bytes"
	"io"

	"github.com/valyala/fasthttp"
)

// framingReason says why a request's framing is refused in proxy mode.
type framingReason uint8

const (
	framingOK framingReason = iota
	// framingCLTE: both Content-Length and Transfer-Encoding (RFC 9112
	// §6.3: "ought to be handled as an error"; the classic CL.TE and
	// TE.CL smuggling).
	framingCLTE
	// framingContentLength: Content-Length lines that disagree.
	framingContentLength
	// framingTransferEncoding: a Transfer-Encoding other than chunked
	// alone (RFC 9112 §6.1: a server that does not understand it answers
	// 501 or, for a request, must not guess the length; 400 here).
	framingTransferEncoding
	// framingObsFold: a header line starting with a space or tab (RFC
	// 9112 §5.2 lets a server reject obs-fold with 400).
	framingObsFold
	// framingChunk: a chunk size, extension or trailer that does not
	// parse, in the part of a chunked body read before the decision.
	framingChunk
	numFramingReasons
)

var framingNames = [numFramingReasons]string{"", "content_length_and_transfer_encoding", "content_length",
	"transfer_encoding", "obs_fold", "chunk"}

func (r framingReason) String() string { return framingNames[r] }

var framingDetails = [numFramingReasons]string{"",
	"the request has both Content-Length and Transfer-Encoding",
	"the request has Content-Length lines that disagree",
	"the request has a Transfer-Encoding other than chunked",
	"the request folds a header line (obs-fold)",
	"the request's chunked body is malformed"}

// chunkedPrefetch is how much of a chunked request body is read, and so
// validated, before the decision. A body that ends within it is forwarded
// with a Content-Length (and can be sent again on a retry); a longer one
// streams on, its later chunks validated as they arrive.
const chunkedPrefetch = 64 << 10

// headFraming checks the request head as it came on the wire (raw: the
// header lines after the request line, as fasthttp's RawHeaders keeps
// them) for what fasthttp itself accepts but a server behind the edge
// could frame differently: obs-fold, Content-Length with
// Transfer-Encoding, Content-Length lines that disagree, and a
// Transfer-Encoding other than chunked (fasthttp takes "identity"). It
// does not allocate.
func headFraming(raw []byte) framingReason {
	var cl, te bool
	var clValue []byte
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(line) == 0 {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return framingObsFold
		}
		name, value, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		value = bytes.Trim(value, " \t")
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if cl && !bytes.Equal(value, clValue) {
				return framingContentLength
			}
			cl, clValue = true, value
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(value, []byte("chunked")) {
				return framingTransferEncoding
			}
			te = true
		}
	}
	if cl && te {
		return framingCLTE
	}
	return framingOK
}

// checkFraming refuses, with 400 and a closed connection, a request of
// proxy mode whose framing could smuggle a second request past the edge:
// it runs before any decision, so such a request spends no quota and
// reaches no upstream. For a chunked body it reads up to chunkedPrefetch
// bytes first (see prefetchChunked). It reports whether the request may
// go on.
func (s *Server) checkFraming(ctx *fasthttp.RequestCtx) bool {
	r := headFraming(ctx.Request.Header.RawHeaders())
	if r == framingOK && ctx.Request.Header.ContentLength() == -1 && ctx.Request.IsBodyStream() {
		r = prefetchChunked(&ctx.Request)
	}
	if r == framingOK {
		return true
	}
	s.upstream.framing[r].Inc()
	ctx.SetConnectionClose()
	writeProblem(ctx, fasthttp.StatusBadRequest, framingDetails[r])
	return false
}

// prefetchChunked reads the start of req's chunked body: a body that ends
// within chunkedPrefetch bytes becomes req's whole body (forwarded with a
// Content-Length), a longer one is put back in front of the rest of the
// stream. A chunk that does not parse is framingChunk.
func prefetchChunked(req *fasthttp.Request) framingReason {
	stream := req.BodyStream()
	buf := make([]byte, 0, 4<<10)
	for len(buf) <= chunkedPrefetch {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := stream.Read(buf[len(buf):min(cap(buf), chunkedPrefetch+1)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			req.SetBody(buf)
			return framingOK
		}
		if err != nil {
			return framingChunk
		}
	}
	req.SetBodyStream(io.MultiReader(bytes.NewReader(buf), stream), -1)
	return framingOK
}
