package decision

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/transform"
	"golang.org/x/text/unicode/norm"

	"github.com/poplimit/poplimit/rules"
)

// Body is implemented by the Fields of a front end that read the body of
// a request for the rules keyed by it (form: and json: key parts). A
// front end reads at most Core.BodyKeyBytes bytes of a body, and only for
// requests that Core.WantsBody says a rule needs it for; Fields that do
// not implement Body have no body (every body key part falls back, as
// BodyUnread).
type Body interface {
	// Body returns what the front end holds of the request body, and
	// whether that is the whole body (false: the body is longer than the
	// front end read, or streams on unread).
	Body() (b []byte, whole bool)
}

// BodyReason says why a body key part was not read: the request falls
// back as the rule's missing_key says, counted by reason in
// poplimit_edge_body_key_fallbacks_total.
type BodyReason uint8

const (
	BodyRead          BodyReason = iota // read (or not a body key)
	BodyAbsent                          // the body lacks the field, or its value is empty, null, an object or an array
	BodyMalformed                       // the body does not parse as its content type says
	BodyTooLarge                        // the body is longer than the bound (CoreConfig.BodyKeyBytes)
	BodyContentType                     // the body is not of the part's content type, or has a Content-Encoding
	BodyTooDeep                         // a JSON body nests deeper than MaxJSONDepth
	BodyTooManyFields                   // a form body has more than MaxFormFields fields
	BodyUnread                          // the front end read no body (Fields without Body)
	numBodyReasons
)

var bodyReasonNames = [numBodyReasons]string{"", "absent", "malformed", "too_large", "content_type", "too_deep", "too_many_fields", "unread"}

func (r BodyReason) String() string {
	if r < numBodyReasons {
		return bodyReasonNames[r]
	}
	return "unknown(" + strconv.Itoa(int(r)) + ")"
}

// Bounds on the work of one body key.
const (
	// DefaultBodyKeyBytes is CoreConfig.BodyKeyBytes' default: room for a
	// login form or JSON document with a CAPTCHA token (hCaptcha's and
	// reCAPTCHA's run to 2 KiB and more) beside the credentials.
	DefaultBodyKeyBytes = 8 << 10
	// MaxBodyKeyBytes is the largest CoreConfig.BodyKeyBytes accepted.
	MaxBodyKeyBytes = 1 << 20
	// MaxJSONDepth is how deep a JSON body may nest (objects and arrays)
	// for a json: key to be read: a deeper one is BodyTooDeep, scanned no
	// further.
	MaxJSONDepth = 64
	// MaxFormFields is how many fields a form body may hold for a form:
	// key to be read: a form with more is BodyTooManyFields, scanned no
	// further.
	MaxFormFields = 1000
)

// bodyPart reads the body key part p of rule r from f: the value, its
// last occurrence and how many there are, as Fields' methods answer, or
// the reason it could not be read. A value is as sent: a form value
// percent- and plus-encoded, a JSON string with its escapes, a JSON
// number, true or false as written. It does not allocate.
func bodyPart(f Fields, r *rules.Rule, p rules.KeyPart, bound int) (first, last []byte, n int, why BodyReason) {
	bf, ok := f.(Body)
	if !ok {
		return nil, nil, 0, BodyUnread
	}
	ct, _, lines := f.Header("Content-Type")
	if lines > 1 || !contentTypeIs(ct, p.Source) {
		return nil, nil, 0, BodyContentType
	}
	if enc, _, lines := f.Header("Content-Encoding"); lines > 1 || len(enc) > 0 && !equalFoldASCII(bytes.TrimSpace(enc), "identity") {
		return nil, nil, 0, BodyContentType
	}
	b, whole := bf.Body()
	switch {
	case !whole || len(b) > bound:
		return nil, nil, 0, BodyTooLarge
	case len(b) == 0:
		return nil, nil, 0, BodyAbsent
	}
	if p.Source == rules.KeyForm {
		first, last, n, why = ScanForm(b, p.Name, r.DuplicateKey == rules.DuplicateKeyFirst)
	} else {
		first, last, n, why = ScanJSON(b, p.Name, r.DuplicateKey == rules.DuplicateKeyFirst)
	}
	if why == BodyRead && n == 0 {
		why = BodyAbsent
	}
	return first, last, n, why
}

// contentTypeIs reports whether the media type of Content-Type value ct
// (parameters ignored, case-insensitive) is the one of a src part:
// application/x-www-form-urlencoded for form:, application/json or any
// application/*+json (RFC 6839) for json:.
func contentTypeIs(ct []byte, src rules.KeySource) bool {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	if src == rules.KeyForm {
		return equalFoldASCII(ct, "application/x-www-form-urlencoded")
	}
	if equalFoldASCII(ct, "application/json") {
		return true
	}
	const app, suffix = "application/", "+json"
	return len(ct) > len(app)+len(suffix) && equalFoldASCII(ct[:len(app)], app) && equalFoldASCII(ct[len(ct)-len(suffix):], suffix)
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// ScanForm counts the fields of the application/x-www-form-urlencoded
// body b whose name, percent- and plus-decoded, is name (the WHATWG URL
// standard's parser: fields separated by '&', the name ending at the
// first '='); first and last are the values as sent. It stops at the
// first match when stopFirst, and after MaxFormFields fields
// (BodyTooManyFields). A form has no malformed input: a bad escape
// stands for itself. It does not allocate.
func ScanForm(b []byte, name string, stopFirst bool) (first, last []byte, n int, why BodyReason) {
	first, last, n, over := scanPairs(b, name, false, MaxFormFields, stopFirst)
	if over {
		return nil, nil, 0, BodyTooManyFields
	}
	return first, last, n, BodyRead
}

// ScanJSON counts the values of the JSON text b (RFC 8259) at the JSON
// Pointer ptr (RFC 6901, as a rules file writes it: "/user/email"), as
// one pass over b with no tree built: a member name that appears twice
// in an object is two values (most JSON parsers keep the last one, so a
// key must not read the first). first and last are a string's content
// as sent (escapes undecoded, see AppendJSONString) or a number, true
// or false as written; null, an object or an array is a value of no
// bytes. It stops at the first match when stopFirst, at MaxJSONDepth
// levels of nesting (BodyTooDeep) and at the first byte that is not
// JSON (BodyMalformed). It does not allocate.
func ScanJSON(b []byte, ptr string, stopFirst bool) (first, last []byte, n int, why BodyReason) {
	s := jsonScan{b: b, ptr: ptr, stopFirst: stopFirst}
	s.value(0, true, 1) // the first token follows the pointer's leading '/'

	if s.why == BodyRead && !s.stopped {
		s.ws()
		if s.i != len(s.b) {
			s.why = BodyMalformed
		}
	}
	if s.why != BodyRead {
		return nil, nil, 0, s.why
	}
	return s.first, s.last, s.n, BodyRead
}

type jsonScan struct {
	b           []byte
	i           int
	ptr         string
	stopFirst   bool
	stopped     bool // stopFirst and found
	why         BodyReason
	first, last []byte
	n           int
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// done reports whether the scan is over: an error, or the first match
// found under stopFirst.
func (s *jsonScan) done() bool { return s.why != BodyRead || s.stopped }

// token returns the reference token of ptr at offset at (just past its
// '/'), undecoded, and the offset of the next token (len(ptr)+1 past the
// last); at beyond ptr means the value is the pointer's target.
func (s *jsonScan) token(at int) (tok string, next int) {
	rest := s.ptr[at:]
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		return rest[:i], at + i + 1
	}
	return rest, len(s.ptr) + 1
}

// value scans one value at depth; onPath says its path is the pointer's
// up to at (the offset in ptr of the next token; beyond ptr: the value is
// the target).
func (s *jsonScan) value(depth int, onPath bool, at int) {
	s.ws()
	if s.i >= len(s.b) {
		s.why = BodyMalformed
		return
	}
	target := onPath && at > len(s.ptr)
	start := s.i
	switch c := s.b[s.i]; {
	case c == '{' || c == '[':
		if depth >= MaxJSONDepth {
			s.why = BodyTooDeep
			return
		}
		var tok string
		next := at
		if onPath && !target {
			tok, next = s.token(at)
		}
		s.i++
		if c == '{' {
			s.object(depth+1, onPath && !target, tok, next)
		} else {
			s.array(depth+1, onPath && !target, tok, next)
		}
		if target && !s.done() {
			s.match(nil)
		}
	case c == '"':
		s.i++
		end, ok := scanJSONString(s.b, s.i)
		if !ok {
			s.why = BodyMalformed
			return
		}
		if target {
			s.match(s.b[s.i:end])
		}
		s.i = end + 1
	default:
		if !s.literal() {
			s.why = BodyMalformed
			return
		}
		if target {
			if v := s.b[start:s.i]; string(v) == "null" {
				s.match(nil)
			} else {
				s.match(v)
			}
		}
	}
}

func (s *jsonScan) match(v []byte) {
	if s.n == 0 {
		s.first = v
	}
	s.last, s.n = v, s.n+1
	if s.stopFirst {
		s.stopped = true
	}
}

// object scans the members of an object after its '{'.
func (s *jsonScan) object(depth int, onPath bool, tok string, next int) {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			s.why = BodyMalformed
			return
		}
		s.i++
		end, ok := scanJSONString(s.b, s.i)
		if !ok {
			s.why = BodyMalformed
			return
		}
		name := s.b[s.i:end]
		s.i = end + 1
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			s.why = BodyMalformed
			return
		}
		s.i++
		s.value(depth, onPath && jsonNameIs(name, tok), next)
		if s.done() {
			return
		}
		if !s.another('}') {
			return
		}
	}
}

// another reads what follows a member or an element: ',' (another
// comes) or end (the container ends, or anything else: malformed).
func (s *jsonScan) another(end byte) bool {
	s.ws()
	if s.i < len(s.b) && (s.b[s.i] == ',' || s.b[s.i] == end) {
		s.i++
		return s.b[s.i-1] == ','
	}
	s.why = BodyMalformed
	return false
}

// array scans the elements of an array after its '['.
func (s *jsonScan) array(depth int, onPath bool, tok string, next int) {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return
	}
	want := -1 // the element the pointer names, if its token is an index
	if onPath {
		want = pointerIndex(tok)
	}
	for k := 0; ; k++ {
		s.value(depth, onPath && k == want, next)
		if s.done() {
			return
		}
		if !s.another(']') {
			return
		}
	}
}

// pointerIndex is the array index a reference token names (RFC 6901 §4:
// "0" or digits without a leading zero), or -1.
func pointerIndex(tok string) int {
	if tok == "" || len(tok) > 9 || len(tok) > 1 && tok[0] == '0' {
		return -1
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return -1
		}
		n = n*10 + int(tok[i]-'0')
	}
	return n
}

// literal scans a number, true, false or null.
func (s *jsonScan) literal() bool {
	b, i := s.b, s.i
	for _, w := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(b[i:], []byte(w)) {
			s.i += len(w)
			return true
		}
	}
	// number = [ minus ] int [ frac ] [ exp ]
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	s.i = i
	return true
}

// scanJSONString returns the offset of the closing quote of the string
// whose content starts at b[i], and false when the string does not end
// or holds a control character or a bad escape.
func scanJSONString(b []byte, i int) (int, bool) {
	for i < len(b) {
		switch c := b[i]; {
		case c == '"':
			return i, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			if i+1 >= len(b) {
				return 0, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return 0, false
				}
				i += 6
			default:
				return 0, false
			}
		default:
			i++
		}
	}
	return 0, false
}

// nextJSONRune decodes the rune at the start of s, a JSON string's
// content that scanJSONString accepted: an escape (a surrogate pair as
// one rune, a lone surrogate as U+FFFD, as encoding/json does) or UTF-8
// (a byte that is not, as itself with size 1 and ok false).
func nextJSONRune(s []byte) (r rune, size int, utf bool) {
	if s[0] != '\\' {
		r, size = utf8.DecodeRune(s)
		return r, size, !(r == utf8.RuneError && size <= 1)
	}
	switch s[1] {
	case 'b':
		return '\b', 2, true
	case 'f':
		return '\f', 2, true
	case 'n':
		return '\n', 2, true
	case 'r':
		return '\r', 2, true
	case 't':
		return '\t', 2, true
	case 'u':
		r = hex4(s[2:6])
		if utf16.IsSurrogate(r) {
			if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
				if r2 := utf16.DecodeRune(r, hex4(s[8:12])); r2 != utf8.RuneError {
					return r2, 12, true
				}
			}
			return utf8.RuneError, 6, true
		}
		return r, 6, true
	}
	return rune(s[1]), 2, true // " \ /
}

func hex4(h []byte) rune {
	return rune(unhex(h[0]))<<12 | rune(unhex(h[1]))<<8 | rune(unhex(h[2]))<<4 | rune(unhex(h[3]))
}

// AppendJSONString appends the content of a JSON string (escapes as
// sent, as ScanJSON returns it) decoded to UTF-8; a byte that is not
// UTF-8 is kept as it is. It allocates only to grow dst.
func AppendJSONString(dst, s []byte) []byte {
	for len(s) > 0 {
		if s[0] != '\\' {
			// Copy a run without escapes as it is.
			i := bytes.IndexByte(s, '\\')
			if i < 0 {
				i = len(s)
			}
			dst, s = append(dst, s[:i]...), s[i:]
			continue
		}
		r, size, _ := nextJSONRune(s)
		dst, s = utf8.AppendRune(dst, r), s[size:]
	}
	return dst
}

// jsonNameIs reports whether the JSON member name raw (escapes as sent)
// is the reference token tok (as a pointer writes it, ~0 and ~1 not yet
// decoded). It does not allocate.
func jsonNameIs(raw []byte, tok string) bool {
	for len(raw) > 0 {
		r, size, utf := nextJSONRune(raw)
		var buf [utf8.UTFMax]byte
		enc := buf[:1]
		if utf {
			enc = utf8.AppendRune(buf[:0], r)
		} else {
			buf[0] = raw[0]
		}
		raw = raw[size:]
		for _, c := range enc {
			if len(tok) == 0 {
				return false
			}
			t := tok[0]
			tok = tok[1:]
			if t == '~' {
				// Valid pointers hold only ~0 and ~1 (package rules).
				if len(tok) == 0 {
					return false
				}
				t = '~'
				if tok[0] == '1' {
					t = '/'
				}
				tok = tok[1:]
			}
			if c != t {
				return false
			}
		}
	}
	return len(tok) == 0
}

// foldPool holds case folders (a cases.Caser keeps state and is not safe
// for concurrent use).
var foldPool = sync.Pool{New: func() any { c := cases.Fold(); return &c }}

// appendFolded appends v as key_case: insensitive compares it: NFKC, then
// Unicode full case folding, then NFKC again (folding can leave text that
// is not normalized), so that "ALICE@example.com", "alice@Example.com"
// and the full-width "ＡＬＩＣＥ@example.com" are one key. A v that is
// not UTF-8 keeps its bad bytes as U+FFFD. v must not overlap dst's spare
// capacity.
func appendFolded(dst, v []byte) []byte {
	if ascii(v) {
		// NFKC leaves ASCII as it is, and folding it is lowering it.
		for _, c := range v {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
		}
		return dst
	}
	start := len(dst)
	dst = append(dst, v...)
	dst = appendTransform(dst, start, len(dst), norm.NFKC) // dst[p1:p2]; never composed with what precedes v
	p1, p2 := start+len(v), len(dst)
	c := foldPool.Get().(*cases.Caser)
	dst = appendTransform(dst, p1, p2, c) // dst[p2:p3]
	foldPool.Put(c)
	p3 := len(dst)
	dst = appendTransform(dst, p2, p3, norm.NFKC) // dst[p3:]
	n := copy(dst[start:], dst[p3:])
	return dst[:start+n]
}

func ascii(v []byte) bool {
	for _, c := range v {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// appendFoldedKey appends key trimmed of Unicode blanks and folded
// (appendFolded), or key as it is when nothing is left of it.
func appendFoldedKey(dst, key []byte) []byte {
	start := len(dst)
	dst = appendFolded(dst, TrimKey(key))
	if v := TrimKey(dst[start:]); len(v) > 0 {
		n := copy(dst[start:], v)
		return dst[:start+n]
	}
	return append(dst[:start], key...)
}

// appendTransform appends t applied to dst[from:end] to dst (end is
// len(dst)).
func appendTransform(dst []byte, from, end int, t transform.Transformer) []byte {
	t.Reset()
	src := from
	for {
		if cap(dst)-len(dst) < 2*(end-src)+utf8.UTFMax {
			dst = append(dst[:cap(dst)], make([]byte, 2*(end-src)+utf8.UTFMax)...)[:len(dst)]
		}
		nDst, nSrc, err := t.Transform(dst[len(dst):cap(dst)], dst[src:end], true)
		dst = dst[:len(dst)+nDst]
		src += nSrc
		if err != transform.ErrShortDst {
			return dst
		}
	}
}

// WantsBody reports whether a rule keyed by the body (form:, json:)
// matches a request to host, method and path: a front end reads the
// body's first BodyKeyBytes bytes for such a request only, before
// Decide, and gives them to the core through its Fields (Body). It does
// not allocate; with no such rule in force it costs one load.
func (c *Core) WantsBody(host, method, path []byte) bool {
	sn := c.rules.Load()
	if !sn.bodyKeys {
		return false
	}
	for _, r := range sn.rules.Rules {
		if r.Kind != rules.Shed && r.BodyKey() && r.Matches(host, method, path) {
			return true
		}
	}
	return false
}

// BodyKeyBytes is the most of a request body a front end reads for the
// rules keyed by it (CoreConfig.BodyKeyBytes).
func (c *Core) BodyKeyBytes() int { return c.cfg.BodyKeyBytes }
