package loadtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/poplimit/poplimit/rules"
)

// TraceRequest is one request of a trace. The zero value is not valid: IP
// is required. A TraceRequest is a plain value; Headers is shared by
// copies.
type TraceRequest struct {
	// At is when the request is due, as an offset from the trace's origin
	// (the instant of offset 0). Replays send it at start + At/speed.
	At time.Duration
	// Time is the request's absolute time when the trace carries one (an
	// imported access log does); the zero Time otherwise.
	Time time.Time
	// IP is the client's address, the key material of per-client rules. A
	// replay sends it in X-Forwarded-For (see ReplayConfig.ClientIPHeader).
	IP netip.Addr
	// Method is the HTTP method; "" means GET.
	Method string
	// Host is the Host header without scheme; "" means the target's address.
	Host string
	// Path is the request target: path and query, printable ASCII, starting
	// with "/"; "" means "/".
	Path string
	// Headers are extra request headers (API keys, cookies, user agents).
	Headers map[string]string
	// Count is how many identical requests are due at At; 0 means 1.
	Count int
	// Duration is how long the request took to answer, when the trace
	// knows (0: unknown): the offline simulator holds its concurrency
	// slots that long, and settles a rule that counts by response that
	// long after the request.
	Duration time.Duration
	// Body is the request body, sent as it is (at most maxBody bytes of
	// UTF-8 text in a trace line); "" sends none. Rules keyed on a body
	// field (form:, json:) read it.
	Body string
	// ContentType is the body's media type, sent in Content-Type; "" sends
	// none (the headers may not carry one as well).
	ContentType string
	// Status is what the origin answered, when the trace knows (an
	// imported access log's status; 0: unknown): the offline simulator
	// settles a rule that counts by response with it.
	Status int
}

// count returns r.Count with 0 as 1.
func (r *TraceRequest) count() int { return max(r.Count, 1) }

// Limits of the trace format, so that a hostile trace costs bounded memory.
const (
	maxMethod      = 32
	maxPath        = 8192
	maxHost        = 255
	maxHeaders     = 64
	maxHeaderName  = 256
	maxHeaderValue = 8192
	maxCount       = 1_000_000
	maxBody        = 64 << 10
	maxOffset      = 10 * 365 * 24 * time.Hour
)

// Trace is a stream of requests in time order, read lazily: a trace file, an
// imported access log, or a generator. Ranging over it again starts it again
// (a generator yields the same requests; a file is reopened).
//
// An iteration yields either a request and a nil error, or an error: a
// *LineError is a bad line that was skipped, and the iteration goes on if
// the consumer continues; any other error is the last thing yielded.
type Trace iter.Seq2[TraceRequest, error]

// LineError is a bad line of a trace or of an access log, skipped.
type LineError struct {
	Line   int    // 1-based line number
	Reason string // one of a small fixed set (see the Reason constants)
	Detail string // what was wrong, quoting the offending field
}

func (e *LineError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("line %d: %s", e.Line, e.Reason)
	}
	return fmt.Sprintf("line %d: %s: %s", e.Line, e.Reason, e.Detail)
}

// The reasons of a LineError. Each bad line has exactly one, so an import
// summary's counts by reason add up to its bad lines.
const (
	ReasonTooLong     = "line too long"
	ReasonEmpty       = "empty line"
	ReasonJSON        = "not a JSON trace object"
	ReasonTime        = "bad time"
	ReasonClient      = "bad client address"
	ReasonDate        = "bad date"
	ReasonQuote       = "unterminated quoted field"
	ReasonNoRequest   = "no request line"
	ReasonRequestLine = "malformed request line"
	ReasonTarget      = "unsupported request target"
	ReasonStatus      = "bad status"
	ReasonSize        = "bad response size"
	ReasonField       = "bad field"
	ReasonLayout      = "not a Common or Combined Log Format line"
)

// fieldError is a parse failure of one line, before its number is known.
type fieldError struct{ reason, detail string }

func badf(reason, format string, args ...any) *fieldError {
	return &fieldError{reason, fmt.Sprintf(format, args...)}
}

// quoteShort quotes s for an error message, cut to 64 bytes.
func quoteShort[T string | []byte](s T) string {
	if len(s) > 64 {
		return strconv.Quote(string(s[:64])) + "…"
	}
	return strconv.Quote(string(s))
}

// lineJSON is the JSON form of a trace line.
type lineJSON struct {
	OffsetMillis json.Number       `json:"offset_ms"`
	TS           string            `json:"ts"`
	IP           string            `json:"ip"`
	Method       string            `json:"method"`
	Host         string            `json:"host"`
	Path         string            `json:"path"`
	Headers      map[string]string `json:"headers"`
	Count        *int64            `json:"count"`
	DurationMs   json.Number       `json:"duration_ms"`
	Body         string            `json:"body"`
	ContentType  string            `json:"content_type"`
	Status       *int64            `json:"status"`
}

// ParseTraceLine parses one line of a JSON-lines trace (see the package
// doc for the schema). A line with ts and no offset_ms has At 0: a Reader
// places it by its ts. The error, if any, is a *LineError with Line 0. It
// never panics.
func ParseTraceLine(line []byte) (TraceRequest, error) {
	r, _, err := parseTraceLine(line)
	if err != nil {
		return TraceRequest{}, &LineError{Reason: err.reason, Detail: err.detail}
	}
	return r, nil
}

func parseTraceLine(line []byte) (TraceRequest, bool, *fieldError) {
	var j lineJSON
	if err := json.Unmarshal(line, &j); err != nil {
		return TraceRequest{}, false, badf(ReasonJSON, "%v", err)
	}
	var r TraceRequest
	hasOffset := j.OffsetMillis != ""
	if hasOffset {
		d, ok := parseMillis(string(j.OffsetMillis))
		if !ok {
			return TraceRequest{}, false, badf(ReasonTime, "offset_ms %s: must be a number of milliseconds from 0 to 10 years", quoteShort(string(j.OffsetMillis)))
		}
		r.At = d
	}
	if j.TS != "" {
		t, err := time.Parse(time.RFC3339Nano, j.TS)
		if err != nil {
			return TraceRequest{}, false, badf(ReasonTime, "ts %s: not an RFC 3339 timestamp", quoteShort(j.TS))
		}
		r.Time = t
	} else if !hasOffset {
		return TraceRequest{}, false, badf(ReasonTime, "the line has neither offset_ms nor ts")
	}
	ip, err := netip.ParseAddr(j.IP)
	if err != nil || ip.Zone() != "" {
		return TraceRequest{}, false, badf(ReasonClient, "ip %s: not an IP address", quoteShort(j.IP))
	}
	r.IP = ip.Unmap()
	r.Method, r.Host, r.Path, r.Headers = j.Method, j.Host, j.Path, j.Headers
	if j.Count != nil {
		if *j.Count < 1 || *j.Count > maxCount {
			return TraceRequest{}, false, badf(ReasonField, "count %d: must be between 1 and %d", *j.Count, maxCount)
		}
		r.Count = int(*j.Count)
	}
	if j.DurationMs != "" {
		d, ok := parseMillis(string(j.DurationMs))
		if !ok {
			return TraceRequest{}, false, badf(ReasonField, "duration_ms %s: must be a number of milliseconds from 0 to 10 years", quoteShort(string(j.DurationMs)))
		}
		r.Duration = d
	}
	r.Body, r.ContentType = j.Body, j.ContentType
	if j.Status != nil {
		if *j.Status < 100 || *j.Status > 599 {
			return TraceRequest{}, false, badf(ReasonStatus, "status %d: must be an HTTP status from 100 to 599", *j.Status)
		}
		r.Status = int(*j.Status)
	}
	if fe := checkRequest(&r); fe != nil {
		return TraceRequest{}, false, fe
	}
	return r, hasOffset, nil
}

// checkRequest validates the fields that every trace source must get right.
func checkRequest(r *TraceRequest) *fieldError {
	if r.Method != "" && (len(r.Method) > maxMethod || !rules.IsToken(r.Method)) {
		return badf(ReasonField, "method %s: not an HTTP method token", quoteShort(r.Method))
	}
	if r.Path != "" && (len(r.Path) > maxPath || r.Path[0] != '/' || !printableASCII(r.Path)) {
		return badf(ReasonField, "path %s: must start with / and be at most %d bytes of printable ASCII (percent-encode the rest)", quoteShort(r.Path), maxPath)
	}
	if len(r.Host) > maxHost || !printableASCII(r.Host) || strings.ContainsAny(r.Host, "/?#@") {
		return badf(ReasonField, "host %s: not a host[:port]", quoteShort(r.Host))
	}
	if len(r.Body) > maxBody {
		return badf(ReasonField, "body of %d bytes: at most %d", len(r.Body), maxBody)
	}
	if len(r.ContentType) > maxHeaderValue || !printableText(r.ContentType) {
		return badf(ReasonField, "content_type %s: at most %d bytes of printable ASCII", quoteShort(r.ContentType), maxHeaderValue)
	}
	if r.Status != 0 && (r.Status < 100 || r.Status > 599) {
		return badf(ReasonStatus, "status %d: must be an HTTP status from 100 to 599", r.Status)
	}
	if len(r.Headers) > maxHeaders {
		return badf(ReasonField, "%d headers: at most %d", len(r.Headers), maxHeaders)
	}
	for k, v := range r.Headers {
		if len(k) > maxHeaderName || !rules.IsToken(k) {
			return badf(ReasonField, "header name %s: not a token", quoteShort(k))
		}
		if replayerHeader(k) {
			return badf(ReasonField, "header %s: set by the replayer, not by the trace", quoteShort(k))
		}
		if r.ContentType != "" && strings.EqualFold(k, "Content-Type") {
			return badf(ReasonField, "header %s: the line has content_type too", quoteShort(k))
		}
		if len(v) > maxHeaderValue || strings.ContainsAny(v, "\r\n\x00") {
			return badf(ReasonField, "header %s value %s: at most %d bytes, without CR, LF or NUL", k, quoteShort(v), maxHeaderValue)
		}
	}
	return nil
}

// replayerHeader reports whether the replayer owns header name.
func replayerHeader(name string) bool {
	for _, h := range []string{"Host", "Content-Length", "Transfer-Encoding", "Connection"} {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	return false
}

// printableText reports whether s is printable ASCII, spaces allowed (a
// media type's parameters may have them).
func printableText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// parseMillis parses a JSON number of milliseconds into a Duration, exactly
// to the nanosecond for plain decimals.
func parseMillis(s string) (time.Duration, bool) {
	if s == "" || s[0] == '-' {
		return 0, false
	}
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || f > float64(maxOffset/time.Millisecond) {
			return 0, false
		}
		return time.Duration(f*1e6 + 0.5), true
	}
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(whole) > 12 {
		return 0, false
	}
	ms, err := strconv.ParseUint(whole, 10, 64)
	if err != nil {
		return 0, false
	}
	var ns uint64
	for i := 0; i < len(frac); i++ {
		c := frac[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if i < 6 {
			ns = ns*10 + uint64(c-'0')
		}
	}
	for i := len(frac); i < 6; i++ {
		ns *= 10
	}
	d := time.Duration(ms)*time.Millisecond + time.Duration(ns)
	if d > maxOffset {
		return 0, false
	}
	return d, true
}

// AppendTraceLine appends r as one JSON trace line, with its "\n", to dst.
// Headers are written in sorted order, so equal requests give equal bytes.
// It does not allocate when r has no headers and dst has room.
func AppendTraceLine(dst []byte, r *TraceRequest) []byte {
	dst = append(dst, `{"offset_ms":`...)
	dst = appendMillis(dst, r.At)
	if !r.Time.IsZero() {
		dst = append(dst, `,"ts":"`...)
		dst = r.Time.AppendFormat(dst, time.RFC3339Nano)
		dst = append(dst, '"')
	}
	dst = append(dst, `,"ip":"`...)
	dst = r.IP.AppendTo(dst)
	dst = append(dst, '"')
	if r.Method != "" {
		dst = append(dst, `,"method":`...)
		dst = appendJSONString(dst, r.Method)
	}
	if r.Host != "" {
		dst = append(dst, `,"host":`...)
		dst = appendJSONString(dst, r.Host)
	}
	if r.Path != "" {
		dst = append(dst, `,"path":`...)
		dst = appendJSONString(dst, r.Path)
	}
	if len(r.Headers) > 0 {
		dst = append(dst, `,"headers":{`...)
		for i, k := range slices.Sorted(maps.Keys(r.Headers)) {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			dst = appendJSONString(dst, r.Headers[k])
		}
		dst = append(dst, '}')
	}
	if r.Count > 1 {
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendInt(dst, int64(r.Count), 10)
	}
	if r.Duration > 0 {
		dst = append(dst, `,"duration_ms":`...)
		dst = appendMillis(dst, r.Duration)
	}
	if r.Status > 0 {
		dst = append(dst, `,"status":`...)
		dst = strconv.AppendInt(dst, int64(r.Status), 10)
	}
	if r.ContentType != "" {
		dst = append(dst, `,"content_type":`...)
		dst = appendJSONString(dst, r.ContentType)
	}
	if r.Body != "" {
		dst = append(dst, `,"body":`...)
		dst = appendJSONString(dst, r.Body)
	}
	return append(dst, "}\n"...)
}

// appendMillis writes d in milliseconds with up to six decimals.
func appendMillis(dst []byte, d time.Duration) []byte {
	if d < 0 {
		d = 0
	}
	dst = strconv.AppendInt(dst, int64(d/time.Millisecond), 10)
	ns := int64(d % time.Millisecond)
	if ns == 0 {
		return dst
	}
	var b [7]byte
	b[0] = '.'
	for i := 6; i >= 1; i-- {
		b[i] = byte('0' + ns%10)
		ns /= 10
	}
	n := 7
	for b[n-1] == '0' {
		n--
	}
	return append(dst, b[:n]...)
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD,
// as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// Reader reads a JSON-lines trace. A line with offset_ms is due at that
// offset; a line with only ts is placed at ts minus the trace's origin,
// which is fixed by the first line carrying a ts (its ts minus its offset).
// Blank lines are skipped. A Reader is not safe for concurrent use.
type Reader struct {
	lr        lineReader
	origin    time.Time
	hasOrigin bool
}

// NewReader returns a Reader of r; wrap r in a bufio.Reader only if it is
// not one: Reader buffers MaxLineBytes itself.
func NewReader(r io.Reader) *Reader { return &Reader{lr: newLineReader(r)} }

// Next returns the next request, io.EOF at the end, a *LineError for a bad
// line (call Next again to go on), or the underlying reader's error.
func (rd *Reader) Next() (TraceRequest, error) {
	for {
		line, tooLong, err := rd.lr.next()
		if err != nil {
			if err == io.EOF {
				return TraceRequest{}, io.EOF
			}
			return TraceRequest{}, fmt.Errorf("loadtest: read trace: %w", err)
		}
		if tooLong {
			return TraceRequest{}, &LineError{Line: rd.lr.line, Reason: ReasonTooLong, Detail: fmt.Sprintf("more than %d bytes", MaxLineBytes)}
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		r, hasOffset, fe := parseTraceLine(line)
		if fe != nil {
			return TraceRequest{}, &LineError{Line: rd.lr.line, Reason: fe.reason, Detail: fe.detail}
		}
		switch {
		case hasOffset && !r.Time.IsZero() && !rd.hasOrigin:
			rd.origin, rd.hasOrigin = r.Time.Add(-r.At), true
		case !hasOffset && !rd.hasOrigin:
			rd.origin, rd.hasOrigin = r.Time, true
			r.At = 0
		case !hasOffset:
			r.At = r.Time.Sub(rd.origin)
			if r.At < 0 || r.At > maxOffset {
				return TraceRequest{}, &LineError{Line: rd.lr.line, Reason: ReasonTime,
					Detail: fmt.Sprintf("ts %s is %v from the trace's origin %s", r.Time.Format(time.RFC3339Nano), r.At, rd.origin.Format(time.RFC3339Nano))}
			}
		case r.Time.IsZero() && rd.hasOrigin:
			r.Time = rd.origin.Add(r.At)
		}
		return r, nil
	}
}

// All returns the rest of the trace as a Trace, which can be ranged over once.
func (rd *Reader) All() Trace {
	return func(yield func(TraceRequest, error) bool) {
		for {
			r, err := rd.Next()
			if err == io.EOF {
				return
			}
			var le *LineError
			if !yield(r, err) || err != nil && !errors.As(err, &le) {
				return
			}
		}
	}
}

// ReadFile returns the trace in the file at path ("-" is standard input,
// read once). Each range over it opens the file anew; an open error is
// yielded as the only element.
func ReadFile(path string) Trace {
	return func(yield func(TraceRequest, error) bool) {
		f := os.Stdin
		if path != "-" {
			var err error
			if f, err = os.Open(path); err != nil {
				yield(TraceRequest{}, fmt.Errorf("loadtest: %w", err))
				return
			}
			defer f.Close()
		}
		NewReader(f).All()(yield)
	}
}

// Writer writes a JSON-lines trace. It buffers: call Flush at the end. Not
// safe for concurrent use.
type Writer struct {
	w   io.Writer
	buf []byte
	err error
}

// NewWriter returns a Writer to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, buf: make([]byte, 0, 64<<10)} }

// Write appends r to the trace. Errors are sticky.
func (w *Writer) Write(r *TraceRequest) error {
	if w.err != nil {
		return w.err
	}
	w.buf = AppendTraceLine(w.buf, r)
	if len(w.buf) >= 60<<10 {
		return w.Flush()
	}
	return nil
}

// Flush writes what is buffered.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) > 0 {
		if _, err := w.w.Write(w.buf); err != nil {
			w.err = fmt.Errorf("loadtest: write trace: %w", err)
		}
		w.buf = w.buf[:0]
	}
	return w.err
}

// WriteTrace writes every request of t to w as JSON lines and returns how
// many it wrote and the bad lines it skipped (LineErrors of t).
func WriteTrace(w io.Writer, t Trace) (written, skipped int64, err error) {
	tw := NewWriter(w)
	for r, err := range t {
		if err != nil {
			var le *LineError
			if errors.As(err, &le) {
				skipped++
				continue
			}
			tw.Flush()
			return written, skipped, err
		}
		if err := tw.Write(&r); err != nil {
			return written, skipped, err
		}
		written++
	}
	return written, skipped, tw.Flush()
}
