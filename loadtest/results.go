package loadtest

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// ResultsHeader is the first line of a results file (ReplayConfig.Results):
// the names of its tab-separated columns. RESULTS.md describes each.
const ResultsHeader = "index\tedge\tscheduled_ns\tsent_ns\tanswered_ns\tclient\tmethod\thost\ttarget\tstatus\toutcome\trule\tlimit\tremaining\treset_s\twindow_s\tretry_after_s\n"

// Outcomes of a results line, the outcome column.
const (
	OutcomeAnswered = "answered" // the edge answered with an HTTP status
	OutcomeNotSent  = "not-sent" // due while MaxOutstanding requests were outstanding
	// A transport error is its kind: "timeout", "no-free-connection",
	// "connection-refused", "connection-closed" or "error".
)

// outcomeOfErr is errKinds as results-file words (no spaces).
var outcomeOfErr = [len(errKinds)]string{"timeout", "no-free-connection", "connection-refused", "connection-closed", "error"}

// ResponseQuota is what a response's headers said of the quota of the rule
// that decided it. A field is -1 when the response did not say.
type ResponseQuota struct {
	// Limit is the policy's quota: RateLimit-Policy's q, else
	// X-RateLimit-Limit.
	Limit int64
	// Remaining is what is left: RateLimit's r, else X-RateLimit-Remaining.
	Remaining int64
	// ResetSeconds is the time until the quota resets: RateLimit's t, else
	// X-RateLimit-Reset (Unix seconds) minus the answer's time, at least 0.
	ResetSeconds int64
	// WindowSeconds is RateLimit-Policy's w.
	WindowSeconds int64
	// RetryAfter is Retry-After in seconds (an HTTP-date is not read).
	RetryAfter int64
}

var noQuota = ResponseQuota{-1, -1, -1, -1, -1}

var (
	hRateLimitPolicy = []byte("RateLimit-Policy")
	hXLimit          = []byte("X-RateLimit-Limit")
	hXRemaining      = []byte("X-RateLimit-Remaining")
	hXReset          = []byte("X-RateLimit-Reset")
	hRetryAfter      = []byte("Retry-After")
)

// quotaOf reads the quota headers of resp, answered at done.
func quotaOf(resp *fasthttp.Response, done time.Time) ResponseQuota {
	q := noQuota
	h := &resp.Header
	if v := h.PeekBytes(hRateLimit); len(v) > 0 {
		q.Remaining, q.ResetSeconds = sfParam(v, "r"), sfParam(v, "t")
	}
	if v := h.PeekBytes(hRateLimitPolicy); len(v) > 0 {
		q.Limit, q.WindowSeconds = sfParam(v, "q"), sfParam(v, "w")
	}
	if q.Limit < 0 {
		q.Limit = atoiOr(h.PeekBytes(hXLimit))
	}
	if q.Remaining < 0 {
		q.Remaining = atoiOr(h.PeekBytes(hXRemaining))
	}
	if q.ResetSeconds < 0 {
		if at := atoiOr(h.PeekBytes(hXReset)); at >= 0 {
			q.ResetSeconds = max(0, at-done.Unix())
		}
	}
	q.RetryAfter = atoiOr(h.PeekBytes(hRetryAfter))
	return q
}

// atoiOr parses a non-negative decimal integer, or returns -1.
func atoiOr(b []byte) int64 {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || len(b) > 18 || !isDigits(b) {
		return -1
	}
	n, _ := strconv.ParseInt(string(b), 10, 64)
	return n
}

// sfParam returns the integer parameter key of the first member of the
// structured-field list v (`"name";r=3;t=60, ...`), or -1.
func sfParam(v []byte, key string) int64 {
	v = bytes.TrimLeft(v, " ")
	i := 0
	if len(v) > 0 && v[0] == '"' { // skip the sf-string
		for i = 1; i < len(v) && v[i] != '"'; i++ {
			if v[i] == '\\' {
				i++
			}
		}
		i++
	}
	for i < len(v) && v[i] != ';' && v[i] != ',' { // a token member
		i++
	}
	for i < len(v) && v[i] == ';' {
		i++
		j := i
		for j < len(v) && v[j] != ';' && v[j] != ',' {
			j++
		}
		k, val, _ := bytes.Cut(v[i:j], []byte("="))
		if string(bytes.TrimSpace(k)) == key {
			return atoiOr(val)
		}
		i = j
	}
	return -1
}

// appendResultLine appends r's results line, edge being its target's
// address.
func appendResultLine(b []byte, r *Result, edge string) []byte {
	dash := func(b []byte) []byte { return append(b, '-') }
	num := func(b []byte, n int64) []byte {
		if n < 0 {
			return dash(b)
		}
		return strconv.AppendInt(b, n, 10)
	}
	str := func(b []byte, s string) []byte {
		if s == "" {
			return dash(b)
		}
		return appendEscaped(b, s)
	}
	ns := func(b []byte, t time.Time) []byte {
		if t.IsZero() {
			return dash(b)
		}
		return strconv.AppendInt(b, t.UnixNano(), 10)
	}
	b = strconv.AppendInt(b, r.Index, 10)
	b = append(b, '\t')
	b = str(b, edge)
	b = append(b, '\t')
	b = ns(b, r.Scheduled)
	b = append(b, '\t')
	b = ns(b, r.Sent)
	b = append(b, '\t')
	b = ns(b, r.Done)
	b = append(b, '\t')
	if r.Client.IsValid() {
		b = r.Client.AppendTo(b)
	} else {
		b = dash(b)
	}
	b = append(b, '\t')
	b = str(b, r.Method)
	b = append(b, '\t')
	b = str(b, r.Host)
	b = append(b, '\t')
	b = str(b, r.Path)
	b = append(b, '\t')
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, '\t')
	switch {
	case r.NotSent:
		b = append(b, OutcomeNotSent...)
	case r.Err != nil:
		b = append(b, outcomeOfErr[errKind(r.Err)]...)
	default:
		b = append(b, OutcomeAnswered...)
	}
	b = append(b, '\t')
	b = str(b, r.Rule)
	q := &r.Quota
	for _, n := range [...]int64{q.Limit, q.Remaining, q.ResetSeconds, q.WindowSeconds, q.RetryAfter} {
		b = append(b, '\t')
		b = num(b, n)
	}
	return append(b, '\n')
}

// appendEscaped appends s with every byte that is not printable ASCII
// percent-encoded, so that no field holds a space, a tab or a newline.
// What a replay sends (methods, hosts, targets) and the rule names an edge
// answers with are printable ASCII already: they are written as they are.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		} else {
			b = append(b, c)
		}
	}
	return b
}

// resultsChunk is how many bytes of lines a shard gathers before handing
// them to the writer goroutine.
const resultsChunk = 64 << 10

// resultsWriter writes the results file off the request path: each request
// appends its line to one of histShards buffers (under that shard's lock,
// which it takes anyway for the histograms); a full buffer goes to one
// goroutine that writes it. Only a writer slower than the replay (more than
// resultsQueue chunks behind) makes requests wait.
type resultsWriter struct {
	w     io.Writer
	bufs  [histShards][]byte // each guarded by rp.shards[i].mu
	ch    chan []byte
	free  chan []byte
	done  chan struct{}
	lines atomic.Int64
	err   error // set by the writer goroutine; read after done
}

const resultsQueue = 256 // chunks waiting to be written: 16 MiB

func newResultsWriter(w io.Writer) (*resultsWriter, error) {
	rw := &resultsWriter{w: w, ch: make(chan []byte, resultsQueue), free: make(chan []byte, resultsQueue+histShards), done: make(chan struct{})}
	if _, err := io.WriteString(w, ResultsHeader); err != nil {
		return nil, err
	}
	for i := range rw.bufs {
		rw.bufs[i] = make([]byte, 0, resultsChunk+1024)
	}
	go rw.loop()
	return rw, nil
}

func (rw *resultsWriter) loop() {
	defer close(rw.done)
	for chunk := range rw.ch {
		if rw.err == nil {
			if _, err := rw.w.Write(chunk); err != nil {
				rw.err = err
			}
		}
		select {
		case rw.free <- chunk[:0]:
		default:
		}
	}
	if f, ok := rw.w.(interface{ Flush() error }); ok && rw.err == nil {
		rw.err = f.Flush()
	}
}

// add appends line to shard i's buffer; the caller holds that shard's lock.
func (rw *resultsWriter) add(i int, line []byte) {
	rw.lines.Add(1)
	b := append(rw.bufs[i], line...)
	if len(b) >= resultsChunk {
		rw.ch <- b
		select {
		case b = <-rw.free:
		default:
			b = make([]byte, 0, resultsChunk+1024)
		}
	}
	rw.bufs[i] = b
}

// close writes what the shards hold and waits for the writer; no add may
// run any more.
func (rw *resultsWriter) close() (lines int64, err error) {
	for i, b := range rw.bufs {
		if len(b) > 0 {
			rw.ch <- b
		}
		rw.bufs[i] = nil
	}
	close(rw.ch)
	<-rw.done
	if rw.err != nil {
		err = fmt.Errorf("loadtest: write results: %w", rw.err)
	}
	return rw.lines.Load(), err
}
