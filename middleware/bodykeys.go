package middleware

import (
	"bytes"
	"io"
	"net/http"
)

// holdBody reads at most bound bytes of r's body, for the rules keyed by
// it (form: and json: key parts; decision.Core.WantsBody), and puts them
// back: r.Body becomes what was read followed by the rest, so the handler
// reads the whole body as the client sent it, and closing it closes the
// original. A body announced longer than bound is not read (over the
// bound, it falls back as the rule's missing_key says). It reports the
// bytes read and whether they are the whole body.
func holdBody(r *http.Request, bound int) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	if r.ContentLength > int64(bound) {
		return nil, false
	}
	buf := make([]byte, 0, min(bound+1, max(int(r.ContentLength)+1, 512)))
	var err error
	for len(buf) <= bound && err == nil {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		var n int
		n, err = r.Body.Read(buf[len(buf):min(cap(buf), bound+1)])
		buf = buf[:len(buf)+n]
	}
	whole := err == io.EOF && len(buf) <= bound
	rest := io.Reader(r.Body)
	if err != nil && err != io.EOF {
		rest = errReader{err} // the handler meets the client's error where the reading stopped
	}
	r.Body = heldBody{io.MultiReader(bytes.NewReader(buf), rest), r.Body}
	return buf, whole
}

// heldBody is a request body read from its held prefix, then the rest.
type heldBody struct {
	io.Reader
	io.Closer
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// Body gives the core the body's prefix held for it (decision.Body).
func (f *fields) Body() ([]byte, bool) { return f.body, f.whole }
