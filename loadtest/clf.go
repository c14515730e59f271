package loadtest

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/poplimit/poplimit/rules"
)

// ParseCLF parses one access-log line in the Common Log Format
//
//	host ident authuser [day/Mon/year:hh:mm:ss zone] "request" status bytes
//
// or the Combined Log Format, which adds "referer" "user-agent". It is
// tolerant of what real Apache and nginx logs hold: IPv6 and IPv4-mapped
// clients, Apache's vhost_combined prefix ("vhost:port client ..."), quoted
// fields with escapes (\" \\ \xHH) and with unescaped quotes inside, "-" for
// empty fields, single-digit days, any month-name case, fractional seconds,
// a leap second (:60, normalized to the next minute), zones from -2359 to
// +2359 (with or without a colon, or none: UTC), absolute-form targets
// ("GET http://host/path", whose host becomes Host), and fields appended
// after the user agent (ignored). A line cut off inside its last quoted
// field (the user agent, or the referer when it is the last) is kept
// without that field: what a trace needs is before it. A line cut off
// earlier (inside the request line, or before the status or the size) is
// bad.
//
// The TraceRequest has Time set and At 0; its Path is the request target
// with every byte that is not printable ASCII percent-encoded. User-Agent
// and Referer, when present and not "-", are in Headers. The error, if any,
// is a *LineError with Line 0 and one of the Reason constants. It never
// panics.
func ParseCLF(line []byte) (TraceRequest, error) {
	r, _, fe := parseCLF(line)
	if fe != nil {
		return TraceRequest{}, &LineError{Reason: fe.reason, Detail: fe.detail}
	}
	return r, nil
}

// parseCLF parses a line as ParseCLF does. truncated reports a line whose
// last quoted field (the user agent, or the referer when the line ends in
// it) was cut off, unterminated: the request is kept without that field,
// since the fields a trace needs (client, time, request line) and the
// status and size before it are intact.
func parseCLF(s []byte) (TraceRequest, bool, *fieldError) {
	s = bytes.TrimSpace(s)
	if len(s) == 0 {
		return TraceRequest{}, false, badf(ReasonEmpty, "nothing on the line")
	}
	// The date's "[" follows a space: a bracketed IPv6 client may come first.
	open := bytes.Index(s, []byte(" ["))
	if open++; open <= 0 {
		return TraceRequest{}, false, badf(ReasonLayout, "no [date] in %s", quoteShort(s))
	}
	var r TraceRequest
	head := bytes.Fields(s[:open])
	switch ip, ok := parseClient(head); {
	case len(head) < 3:
		return TraceRequest{}, false, badf(ReasonLayout, "expected client, ident and user before the date, got %s", quoteShort(s[:open]))
	case ok:
		r.IP = ip
	default:
		if vhost, ip, ok := parseVhost(head); ok {
			r.Host, r.IP = vhost, ip
		} else {
			return TraceRequest{}, false, badf(ReasonClient, "%s is not an IP address", quoteShort(head[0]))
		}
	}
	end := bytes.IndexByte(s[open:], ']')
	if end < 0 {
		return TraceRequest{}, false, badf(ReasonDate, "unterminated [date] %s", quoteShort(s[open:]))
	}
	t, fe := parseCLFDate(s[open+1 : open+end])
	if fe != nil {
		return TraceRequest{}, false, fe
	}
	r.Time = t
	rest := bytes.TrimLeft(s[open+end+1:], " ")
	if len(rest) == 0 || rest[0] != '"' {
		return TraceRequest{}, false, badf(ReasonLayout, "no quoted request after the date: %s", quoteShort(rest))
	}
	reqLine, rest, ok := quotedField(rest, func(after []byte) bool {
		status, _ := nextField(after)
		return len(after) > 0 && after[0] == ' ' && validStatus(status)
	})
	if !ok {
		return TraceRequest{}, false, badf(ReasonQuote, "request %s", quoteShort(rest))
	}
	status, rest := nextField(rest)
	if !validStatus(status) {
		return TraceRequest{}, false, badf(ReasonStatus, "%s: want three digits or -", quoteShort(status))
	}
	if isDigits(status) {
		// What the origin answered: a rule that counts by response is
		// settled with it offline. A code past 599 is kept as unknown.
		if n := int(status[0]-'0')*100 + int(status[1]-'0')*10 + int(status[2]-'0'); n <= 599 {
			r.Status = n
		}
	}
	size, rest := nextField(rest)
	if !validSize(size) {
		return TraceRequest{}, false, badf(ReasonSize, "%s: want digits or -", quoteShort(size))
	}
	// Combined: "referer" "user-agent"; anything after is ignored. A log
	// line cut off (a line-length limit, a full disk, a partial write) most
	// often ends inside the user agent, the longest field: the last quoted
	// field, unterminated, is dropped and the line kept.
	var referer, agent []byte
	truncated := false
	if rest = bytes.TrimLeft(rest, " "); len(rest) > 0 && rest[0] == '"' {
		if referer, rest, ok = quotedField(rest, func(after []byte) bool {
			return bytes.HasPrefix(after, []byte(` "`)) || len(bytes.TrimSpace(after)) == 0
		}); !ok {
			referer, rest, truncated = nil, nil, true
		}
		if rest = bytes.TrimLeft(rest, " "); len(rest) > 0 && rest[0] == '"' {
			if agent, _, ok = quotedField(rest, nil); !ok {
				agent, truncated = nil, true
			}
		}
	}
	if fe := parseRequestLine(&r, unescapeLog(reqLine)); fe != nil {
		return TraceRequest{}, false, fe
	}
	addHeader(&r, "Referer", referer)
	addHeader(&r, "User-Agent", agent)
	if fe := checkRequest(&r); fe != nil {
		return TraceRequest{}, false, fe
	}
	return r, truncated, nil
}

// parseClient parses the client of a CLF head (host ident user).
func parseClient(head [][]byte) (netip.Addr, bool) {
	if len(head) < 3 {
		return netip.Addr{}, false
	}
	return parseAddr(head[0])
}

// parseVhost parses Apache's vhost_combined head (vhost:port host ident user).
func parseVhost(head [][]byte) (string, netip.Addr, bool) {
	if len(head) < 4 {
		return "", netip.Addr{}, false
	}
	ip, ok := parseAddr(head[1])
	if !ok {
		return "", netip.Addr{}, false
	}
	host := string(head[0])
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	return host, ip, true
}

func parseAddr(b []byte) (netip.Addr, bool) {
	if len(b) > 2 && b[0] == '[' && b[len(b)-1] == ']' {
		b = b[1 : len(b)-1]
	}
	a, err := netip.ParseAddr(string(b))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

var monthNames = [...]string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}

// parseCLFDate parses "10/Oct/2000:13:55:36 -0700" and its tolerated variants.
func parseCLFDate(b []byte) (time.Time, *fieldError) {
	bad := func(why string) (time.Time, *fieldError) {
		return time.Time{}, badf(ReasonDate, "[%s]: %s", b, why)
	}
	p := b
	num := func(min, max int) (int, bool) {
		n, i := 0, 0
		for i < len(p) && i < max && '0' <= p[i] && p[i] <= '9' {
			n = n*10 + int(p[i]-'0')
			i++
		}
		if i < min {
			return 0, false
		}
		p = p[i:]
		return n, true
	}
	sep := func(c byte) bool {
		if len(p) == 0 || p[0] != c {
			return false
		}
		p = p[1:]
		return true
	}
	day, ok := num(1, 2)
	if !ok || !sep('/') {
		return bad("want day/Mon/year:hh:mm:ss zone")
	}
	if len(p) < 4 || p[3] != '/' {
		return bad("want a three-letter month")
	}
	month := 0
	for i, m := range monthNames {
		if strings.EqualFold(string(p[:3]), m) {
			month = i + 1
		}
	}
	if month == 0 {
		return bad("unknown month " + quoteShort(p[:3]))
	}
	p = p[4:]
	year, ok := num(4, 4)
	if !ok || year == 0 || !sep(':') {
		return bad("want a four-digit year and a colon")
	}
	hour, ok1 := num(2, 2)
	ok2 := sep(':')
	minute, ok3 := num(2, 2)
	ok4 := sep(':')
	sec, ok5 := num(2, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return bad("want hh:mm:ss")
	}
	var nsec int
	if sep('.') || sep(',') {
		digits := len(p)
		frac, ok := num(1, 9)
		if !ok {
			return bad("want digits after the decimal point")
		}
		for digits -= len(p); digits < 9; digits++ {
			frac *= 10
		}
		nsec = frac
	}
	if day < 1 || day > daysIn(month, year) {
		return bad(fmt.Sprintf("day %d is not in %s %d", day, monthNames[month-1], year))
	}
	if hour > 23 || minute > 59 || sec > 60 {
		return bad("time of day out of range")
	}
	loc := time.UTC
	p = bytes.TrimLeft(p, " ")
	switch {
	case len(p) == 0:
		// No zone: UTC.
	case len(p) == 1 && (p[0] == 'Z' || p[0] == 'z'):
		p = p[1:]
	case p[0] == '+' || p[0] == '-':
		sign := 1
		if p[0] == '-' {
			sign = -1
		}
		p = p[1:]
		zh, ok1 := num(2, 2)
		sep(':')
		zm, ok2 := num(2, 2)
		if !ok1 || !ok2 || zh > 23 || zm > 59 {
			return bad("want a zone ±hhmm")
		}
		if off := sign * (zh*3600 + zm*60); off != 0 {
			loc = time.FixedZone("", off)
		}
	}
	if len(p) > 0 {
		return bad("unexpected " + quoteShort(p))
	}
	// time.Date normalizes a leap second (:60) to the next minute.
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, loc), nil
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// quotedField returns the content of the quoted field that s starts with,
// still escaped, and what follows it. A backslash escapes the next byte.
// The closing quote is the first unescaped one that what follows it
// accepts (nil accepts anything); failing that, the first followed by a
// space or the end of the line. So a quote left unescaped inside a field
// (old Apache, custom formats) is taken as a literal where the layout
// allows.
func quotedField(s []byte, accept func(after []byte) bool) (field, rest []byte, ok bool) {
	loose := -1
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			after := s[i+1:]
			if len(after) > 0 && after[0] != ' ' && after[0] != '\t' {
				continue
			}
			if accept == nil || accept(after) {
				return s[1:i], after, true
			}
			if loose < 0 {
				loose = i
			}
		}
	}
	if loose >= 0 {
		return s[1:loose], s[loose+1:], true
	}
	return nil, s, false
}

func nextField(s []byte) (field, rest []byte) {
	s = bytes.TrimLeft(s, " ")
	i := bytes.IndexByte(s, ' ')
	if i < 0 {
		return s, nil
	}
	return s[:i], s[i:]
}

func validStatus(b []byte) bool {
	if len(b) == 1 && b[0] == '-' {
		return true
	}
	return len(b) == 3 && '1' <= b[0] && b[0] <= '9' && isDigits(b)
}

func validSize(b []byte) bool {
	return len(b) == 1 && b[0] == '-' || len(b) > 0 && len(b) <= 19 && isDigits(b)
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// unescapeLog undoes Apache's and nginx's log escaping: \" \\ \xHH and the
// C escapes \b \f \n \r \t \v. An unknown escape is kept as it is.
func unescapeLog(b []byte) []byte {
	if bytes.IndexByte(b, '\\') < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' || i+1 == len(b) {
			out = append(out, c)
			continue
		}
		switch e := b[i+1]; e {
		case '"', '\\':
			out = append(out, e)
			i++
		case 'b', 'f', 'n', 'r', 't', 'v':
			out = append(out, "\b\f\n\r\t\v"[strings.IndexByte("bfnrtv", e)])
			i++
		case 'x':
			if i+3 < len(b) && isHex(b[i+2]) && isHex(b[i+3]) {
				out = append(out, unhex(b[i+2])<<4|unhex(b[i+3]))
				i += 3
			} else {
				out = append(out, c)
			}
		default:
			out = append(out, c)
		}
	}
	return out
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// parseRequestLine fills r's method, path (and host, for an absolute
// target) from an unescaped request line.
func parseRequestLine(r *TraceRequest, line []byte) *fieldError {
	parts := bytes.Fields(line)
	switch {
	case len(parts) == 0 || len(parts) == 1 && string(parts[0]) == "-":
		return badf(ReasonNoRequest, "request %s", quoteShort(line))
	case !rules.IsToken(string(parts[0])) || len(parts[0]) > maxMethod:
		return badf(ReasonRequestLine, "method %s is not a token", quoteShort(parts[0]))
	case len(parts) == 1:
		return badf(ReasonRequestLine, "no request target in %s", quoteShort(line))
	}
	r.Method = string(parts[0])
	middle := parts[1:]
	if n := len(parts); n >= 3 && bytes.HasPrefix(parts[n-1], []byte("HTTP/")) {
		middle = parts[1 : n-1]
	}
	target := bytes.Join(middle, []byte(" "))
	switch {
	case r.Method == "CONNECT":
		return badf(ReasonTarget, "CONNECT %s is not replayable", quoteShort(target))
	case hasPrefixFold(target, "http://") || hasPrefixFold(target, "https://"):
		rest := target[bytes.Index(target, []byte("//"))+2:]
		i := bytes.IndexAny(rest, "/?")
		if i < 0 {
			r.Host, target = string(rest), []byte("/")
		} else {
			r.Host, target = string(rest[:i]), rest[i:]
			if target[0] == '?' {
				target = append([]byte("/"), target...)
			}
		}
	case len(target) == 0 || target[0] != '/':
		return badf(ReasonTarget, "%s is not a path", quoteShort(target))
	}
	r.Path = percentEncode(target)
	if len(r.Path) > maxPath {
		return badf(ReasonTarget, "path of %d bytes, more than %d", len(r.Path), maxPath)
	}
	return nil
}

func hasPrefixFold(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && strings.EqualFold(string(b[:len(prefix)]), prefix)
}

// percentEncode encodes every byte that is not printable ASCII as %XX.
func percentEncode(b []byte) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			n++
		}
	}
	if n == 0 {
		return string(b)
	}
	out := make([]byte, 0, len(b)+2*n)
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			out = append(out, '%', hex[c>>4], hex[c&0xf])
		} else {
			out = append(out, c)
		}
	}
	return string(out)
}

// addHeader adds a logged header value unless it is "-", empty, or not a
// valid header value once unescaped.
func addHeader(r *TraceRequest, name string, escaped []byte) {
	if len(escaped) == 0 || string(escaped) == "-" {
		return
	}
	v := strings.ToValidUTF8(string(unescapeLog(escaped)), "\uFFFD")
	if len(v) > maxHeaderValue || strings.ContainsAny(v, "\r\n\x00") {
		return
	}
	if r.Headers == nil {
		r.Headers = make(map[string]string, 2)
	}
	r.Headers[name] = v
}

// ImportConfig configures an Importer. The zero value is ready to use.
type ImportConfig struct {
	// Host is set on every request whose log line names none (default
	// none: the replay target's address is sent).
	Host string
	// Agents keeps User-Agent and Referer as request headers (default:
	// dropped, for smaller traces).
	Agents bool
	// MaxBuffered is how many good lines are held to be put in time order:
	// a log of at most MaxBuffered good lines is sorted whole, so none is
	// placed late however far out of order it was logged (Apache logs a
	// request when it ends, stamped with when it began: a slow request's
	// line comes late). A longer log is sorted within a window past that
	// many lines (see Reorder). Each line held costs about 200 bytes plus
	// its path (and its headers, with Agents): about 250 MB at the default,
	// 1,000,000 lines. Replaying or simulating a log (replay -log, offline
	// -log) starts once the log is read or that many lines are held.
	MaxBuffered int
	// Reorder is the least window of the fallback, once more than
	// MaxBuffered lines have been read: from then on a line is emitted
	// when the newest line read is more than the window later than it (or
	// to keep at most MaxBuffered held), and the window is the larger of
	// Reorder and the largest disorder seen so far (how far a line's time
	// was behind the newest line read before it), so a log that was a
	// minute out of order keeps a minute's window. A line later than that
	// is placed at the latest time already emitted and counted as Late.
	// Default 10s.
	Reorder time.Duration
	// Spread spaces the lines stamped with one same second evenly over that
	// second (logs have one-second resolution; replaying them all at the
	// top of the second makes bursts that were not there). Default off.
	Spread bool
}

// DefaultImportLines is ImportConfig.MaxBuffered's default.
const DefaultImportLines = 1_000_000

func (c *ImportConfig) setDefaults() {
	if c.Reorder == 0 {
		c.Reorder = 10 * time.Second
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = DefaultImportLines
	}
}

// ImportSummary counts the lines of an import.
type ImportSummary struct {
	Lines   int64            `json:"lines"` // lines read, bad ones included
	Good    int64            `json:"good"`
	Bad     int64            `json:"bad"`
	Reasons map[string]int64 `json:"reasons,omitempty"` // bad lines by Reason
	// Truncated counts the good lines whose last quoted field (the user
	// agent, or the referer) was cut off: kept without it.
	Truncated int64 `json:"truncated"`
	Late      int64 `json:"late"` // good lines placed late (see ImportConfig.Reorder)
	// MaxDisorderMillis is the furthest a line's time was behind the
	// newest line read before it, in milliseconds.
	MaxDisorderMillis float64 `json:"max_disorder_ms"`
	// Streamed is true when the log had more good lines than MaxBuffered:
	// past them it was sorted within a window of WindowMillis (the final
	// window) instead of whole.
	Streamed     bool      `json:"streamed"`
	WindowMillis float64   `json:"window_ms,omitempty"`
	First        time.Time `json:"first"` // the trace's origin: the first request's time
	Last         time.Time `json:"last"`
}

// Importer reads a Common or Combined Log Format access log as a Trace,
// with its lines put back in time order: all of them when the log has at
// most ImportConfig.MaxBuffered good lines, else within a window (see
// ImportConfig). Offsets are from the first request's time. It is not safe
// for concurrent use.
type Importer struct {
	cfg ImportConfig
	lr  lineReader
	sum ImportSummary
	h   reqHeap
	seq int64
	// emitted is the time of the last request handed out.
	emitted     time.Time
	newest      time.Time // the latest time read
	maxDisorder time.Duration
	hasOrigin   bool
	group       []TraceRequest // one second's requests, for Spread
}

// NewImporter returns an Importer of the log read from r.
func NewImporter(r io.Reader, cfg ImportConfig) *Importer {
	cfg.setDefaults()
	return &Importer{cfg: cfg, lr: newLineReader(r), sum: ImportSummary{Reasons: map[string]int64{}}}
}

// Summary returns the counts so far; complete once All has been ranged over.
func (im *Importer) Summary() ImportSummary {
	s := im.sum
	s.Reasons = make(map[string]int64, len(im.sum.Reasons))
	for k, v := range im.sum.Reasons {
		s.Reasons[k] = v
	}
	s.MaxDisorderMillis = float64(im.maxDisorder) / 1e6
	if s.Streamed {
		s.WindowMillis = float64(im.window()) / 1e6
	}
	return s
}

// window is the fallback's reorder window: Reorder, or the largest
// disorder seen when that is more.
func (im *Importer) window() time.Duration {
	return max(im.cfg.Reorder, im.maxDisorder)
}

// All returns the log as a Trace: good requests, and a *LineError for each
// bad line (skipped; the iteration goes on). It can be ranged over once.
func (im *Importer) All() Trace {
	return func(yield func(TraceRequest, error) bool) {
		for {
			line, tooLong, err := im.lr.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				yield(TraceRequest{}, fmt.Errorf("loadtest: read log: %w", err))
				return
			}
			im.sum.Lines++
			var r TraceRequest
			var truncated bool
			var fe *fieldError
			if tooLong {
				fe = badf(ReasonTooLong, "more than %d bytes", MaxLineBytes)
			} else {
				r, truncated, fe = parseCLF(line)
			}
			if fe != nil {
				im.sum.Bad++
				im.sum.Reasons[fe.reason]++
				if !yield(TraceRequest{}, &LineError{Line: im.lr.line, Reason: fe.reason, Detail: fe.detail}) {
					return
				}
				continue
			}
			im.sum.Good++
			if truncated {
				im.sum.Truncated++
			}
			if !im.cfg.Agents {
				r.Headers = nil
			}
			if r.Host == "" {
				r.Host = im.cfg.Host
			}
			im.seq++
			heap.Push(&im.h, heapItem{r, im.seq})
			if r.Time.After(im.newest) {
				im.newest = r.Time
			} else if d := im.newest.Sub(r.Time); d > im.maxDisorder {
				im.maxDisorder = d
			}
			if im.h.Len() <= im.cfg.MaxBuffered && !im.sum.Streamed {
				continue // the whole log may yet fit: sort it whole
			}
			im.sum.Streamed = true
			// Emit what can no longer be overtaken within the window.
			for im.h.Len() > 0 && (im.h.Len() > im.cfg.MaxBuffered || im.newest.Sub(im.h.items[0].r.Time) > im.window()) {
				if !im.emit(heap.Pop(&im.h).(heapItem).r, yield) {
					return
				}
			}
		}
		for im.h.Len() > 0 {
			if !im.emit(heap.Pop(&im.h).(heapItem).r, yield) {
				return
			}
		}
		im.flushGroup(yield)
	}
}

// emit hands out r in time order, through the Spread group when enabled.
func (im *Importer) emit(r TraceRequest, yield func(TraceRequest, error) bool) bool {
	if !im.hasOrigin {
		im.hasOrigin = true
		im.sum.First, im.emitted = r.Time, r.Time
	}
	if r.Time.Before(im.emitted) {
		im.sum.Late++
		r.At = im.emitted.Sub(im.sum.First)
	} else {
		im.emitted = r.Time
		r.At = r.Time.Sub(im.sum.First)
	}
	im.sum.Last = im.emitted
	if !im.cfg.Spread {
		return yield(r, nil)
	}
	if len(im.group) > 0 && (im.group[0].At != r.At || len(im.group) >= im.cfg.MaxBuffered) {
		if !im.flushGroup(yield) {
			return false
		}
	}
	im.group = append(im.group, r)
	return true
}

// flushGroup yields the requests of one timestamp spread over the second
// that follows it.
func (im *Importer) flushGroup(yield func(TraceRequest, error) bool) bool {
	n := len(im.group)
	for i := range im.group {
		r := im.group[i]
		r.At += time.Duration(i) * time.Second / time.Duration(n)
		im.group[i] = TraceRequest{}
		if !yield(r, nil) {
			im.group = im.group[:0]
			return false
		}
	}
	im.group = im.group[:0]
	return true
}

// reqHeap orders requests by time, then by line.
type reqHeap struct{ items []heapItem }

type heapItem struct {
	r   TraceRequest
	seq int64
}

func (h *reqHeap) Len() int { return len(h.items) }
func (h *reqHeap) Less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	if c := a.r.Time.Compare(b.r.Time); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}
func (h *reqHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *reqHeap) Push(x any)    { h.items = append(h.items, x.(heapItem)) }
func (h *reqHeap) Pop() any {
	n := len(h.items)
	x := h.items[n-1]
	h.items[n-1] = heapItem{}
	h.items = h.items[:n-1]
	return x
}

// Import reads a Common or Combined Log Format access log from r and writes
// it to w as a JSON-lines trace. onBad, when not nil, is called with each
// bad line. The error is that of reading r or writing w; bad lines are not
// errors, they are counted in the summary.
func Import(r io.Reader, w io.Writer, cfg ImportConfig, onBad func(*LineError)) (ImportSummary, error) {
	im := NewImporter(r, cfg)
	tw := NewWriter(w)
	for req, err := range im.All() {
		var le *LineError
		switch {
		case errors.As(err, &le):
			if onBad != nil {
				onBad(le)
			}
			continue
		case err != nil:
			tw.Flush()
			return im.Summary(), err
		}
		if err := tw.Write(&req); err != nil {
			return im.Summary(), err
		}
	}
	return im.Summary(), tw.Flush()
}
