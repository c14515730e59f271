package decision

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"unicode"
	"unicode/utf8"

	"github.com/poplimit/poplimit/rules"
)

// KeyAddr is the part of ip that a rule keys on: the address itself for
// IPv4, its network of the rule's IPv6Prefix bits for IPv6 (a subscriber
// holds a whole /64 and can rotate addresses inside it).
//
// An IPv6 address that stands for an IPv4 client is no subscriber's: a
// translator (NAT64, SIIT) writes every IPv4 client it serves inside one
// prefix, so a /64 of them would pool them all under one counter. Such an
// address keys as its client:
//
//   - 64:ff9b::/96, the well-known prefix of RFC 6052 (NAT64, SIIT-DC),
//     ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765) and ::a.b.c.d
//     (IPv4-compatible, RFC 4291) key as the IPv4 address a.b.c.d, as
//     the same client does over IPv4; ::a.b.c.d only outside 0.0.0.0/8,
//     so that :: and ::1 stay IPv6;
//   - 64:ff9b:1::/48, the local-use prefix of RFC 8215, keys as the whole
//     address: the operator chooses the prefix length inside it (RFC 6052
//     allows /48 to /96), and so where the IPv4 address sits, but every
//     client has an address of its own.
//
// IPv4-mapped addresses (::ffff:a.b.c.d) are unmapped before any rule
// sees them, and key as IPv4 here too. It does not allocate.
func KeyAddr(r *rules.Rule, ip netip.Addr) netip.Addr {
	if !ip.Is6() {
		return ip
	}
	b := ip.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	switch {
	case hi == 0x0064_ff9b_0000_0000 && lo>>32 == 0, // 64:ff9b::/96
		hi == 0 && lo>>32 == 0xffff_0000,     // ::ffff:0:0:0/96, translated
		hi == 0 && lo>>32 == 0xffff,          // ::ffff:0:0/96, mapped, should a front end not unmap
		hi == 0 && lo>>32 == 0 && b[12] != 0: // ::/96 but 0.0.0.0/8
		return netip.AddrFrom4([4]byte(b[12:]))
	case hi>>16 == 0x0064_ff9b_0001: // 64:ff9b:1::/48
		return ip.WithZone("")
	}
	if r.IPv6Prefix > 0 && r.IPv6Prefix < 128 {
		if p, err := ip.Prefix(r.IPv6Prefix); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// FallbackKeyTag starts a key built from the client IP because the rule's
// own key was missing. No key built from the request itself starts with a
// NUL byte (see AppendKeyStatus), so a fallback key never equals one.
const FallbackKeyTag = "\x00ip\x00"

// AppendFallbackKey appends the key of a request whose rule's key is
// missing and whose rule falls back to the client IP (or, for IPv6, its
// network of the rule's IPv6Prefix).
func AppendFallbackKey(dst []byte, r *rules.Rule, ip netip.Addr) []byte {
	return KeyAddr(r, ip).AppendTo(append(dst, FallbackKeyTag...))
}

// KeyStatus says whether AppendKeyStatus built a key.
type KeyStatus uint8

const (
	KeyBuilt     KeyStatus = iota
	KeyMissing             // a part of the recipe is absent or empty
	KeyDuplicate           // a part appears more than once and the rule's duplicate_key is refuse
)

// AppendKeyStatus appends the key of a request with fields f (nil: none)
// from client ip under rule r to dst, and says whether it built one. A
// part that appears more than once (see Fields) is its first or its last
// value as the rule's DuplicateKey says, or, under DuplicateKeyRefuse,
// makes the status KeyDuplicate: a duplicated part outranks a missing one,
// so a request cannot trade a refusal for the missing-key fallback. dst
// holds no complete key unless the status is KeyBuilt. It does not
// allocate once dst has room, but for rules with key_case: insensitive.
// Body key parts (form:, json:) read at most DefaultBodyKeyBytes of the
// body; see AppendKeyBody.
//
// The encoding is injective, because a query value is percent-decoded and
// may hold any byte: a key of one part is the value itself (so overrides
// name API keys as they are), with a 0x01 put before a value that starts
// with 0x00 or 0x01, so that no key starts with the NUL of FallbackKeyTag;
// a key of several parts is each part preceded by its length (uvarint), so
// no two splits of the same bytes meet.
func AppendKeyStatus(dst []byte, f Fields, r *rules.Rule, ip netip.Addr) (_ []byte, _ KeyStatus) {
	dst, st, _ := AppendKeyBody(dst, f, r, ip, DefaultBodyKeyBytes)
	return dst, st
}

// AppendKeyBody is AppendKeyStatus reading body key parts from a body of
// at most bound bytes (Fields that implement Body): a part read from the
// body is a form field's value percent- and plus-decoded, or a JSON
// string's decoded (a number, true or false as written). When the status
// is KeyMissing because of a body part, the reason says why it was not
// read (the first such part's); else it is BodyRead.
func AppendKeyBody(dst []byte, f Fields, r *rules.Rule, ip netip.Addr, bound int) (_ []byte, _ KeyStatus, why BodyReason) {
	single := len(r.Key) == 1
	missing := false
	fold := r.KeyCase == rules.KeyCaseInsensitive
	for _, p := range r.Key {
		var v, last []byte
		n := 0
		dec := decodeNone // v is as sent: dec says how to decode it
		switch p.Source {
		case rules.KeyIP:
			if single {
				return KeyAddr(r, ip).AppendTo(dst), KeyBuilt, BodyRead
			}
			var a [64]byte
			v, n = KeyAddr(r, ip).AppendTo(a[:0]), 1
		case rules.KeyHeader:
			if f != nil {
				v, last, n = f.Header(p.Name)
			}
		case rules.KeyQuery:
			if f == nil {
				break
			}
			if rq, ok := f.(RawQuery); ok && r.QuerySemicolon == rules.QuerySemicolonSplit {
				v, last, n = ScanQuery(rq.RawQuery(), p.Name, true)
				dec = decodeQuery
			} else {
				v, last, n = f.Query(p.Name)
			}
		case rules.KeyCookie:
			if f != nil {
				v, last, n = f.Cookie(p.Name)
			}
		case rules.KeyForm, rules.KeyJSON:
			w := BodyUnread
			if f != nil {
				v, last, n, w = bodyPart(f, r, p, bound)
			}
			if w != BodyRead && why == BodyRead {
				why = w
			}
			dec = decodeForm
			if p.Source == rules.KeyJSON {
				dec = decodeJSON
			}
		}
		if n > 1 {
			switch r.DuplicateKey {
			case rules.DuplicateKeyFirst:
			case rules.DuplicateKeyLast:
				v = last
			default:
				return dst, KeyDuplicate, BodyRead
			}
		}
		if len(v) == 0 || missing {
			missing = true // look on for a duplicated part
			if n > 0 && dec != decodeNone && p.Source != rules.KeyQuery && why == BodyRead {
				why = BodyAbsent // null, "", an object or an array
			}
			continue
		}
		if p.Source != rules.KeyIP && (dec != decodeNone || fold || r.KeyTrim == rules.KeyTrimUnicode) {
			var ok bool
			if dst, ok = appendPart(dst, v, dec, r.KeyTrim == rules.KeyTrimUnicode || fold, fold, single); !ok {
				missing = true
				if (p.Source == rules.KeyForm || p.Source == rules.KeyJSON) && why == BodyRead {
					why = BodyAbsent // blanks only
				}
				continue
			}
			if single {
				return dst, KeyBuilt, BodyRead
			}
			continue
		}
		if single {
			if v[0] <= 0x01 {
				dst = append(dst, 0x01)
			}
			return append(dst, v...), KeyBuilt, BodyRead
		}
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	if missing {
		return dst, KeyMissing, why
	}
	return dst, KeyBuilt, BodyRead
}

// decodeKind is how appendPart decodes a part's value as sent.
type decodeKind uint8

const (
	decodeNone  decodeKind = iota
	decodeQuery            // percent- and plus-decoded (a raw query, a form body)
	decodeJSON             // a JSON string's escapes decoded
	decodeForm  = decodeQuery
)

// RawQuery is implemented by the Fields of a front end that can give the
// query as the client sent it (without the '?'), for rules that split it
// on ';' too (query_semicolon: split). The edge's and the middleware's
// Fields implement it; with other Fields such a rule reads Query.
type RawQuery interface {
	RawQuery() []byte
}

// ScanQuery counts the pairs of the raw query q whose name, percent- and
// plus-decoded, is name, as Fields.Query does, with pairs separated by '&'
// and, when semicolon, by ';' too; an escaped separator (%26, %3B)
// separates nothing. first and last are the values as sent, not decoded.
// It does not allocate.
func ScanQuery(q []byte, name string, semicolon bool) (first, last []byte, n int) {
	first, last, n, _ = scanPairs(q, name, semicolon, 0, false)
	return first, last, n
}

// scanPairs is ScanQuery's scan, which ScanForm shares: it stops at the
// first match when stopFirst and, with maxPairs > 0, after that many
// pairs (over).
func scanPairs(q []byte, name string, semicolon bool, maxPairs int, stopFirst bool) (first, last []byte, n int, over bool) {
	seen := 0
	for len(q) > 0 {
		i := bytes.IndexByte(q, '&')
		if semicolon {
			if j := bytes.IndexByte(q, ';'); j >= 0 && (i < 0 || j < i) {
				i = j
			}
		}
		pair := q
		if i >= 0 {
			pair, q = q[:i], q[i+1:]
		} else {
			q = nil
		}
		if len(pair) == 0 {
			continue
		}
		if seen++; maxPairs > 0 && seen > maxPairs {
			return nil, nil, 0, true
		}
		k, v := pair, []byte(nil)
		if j := bytes.IndexByte(pair, '='); j >= 0 {
			k, v = pair[:j], pair[j+1:]
		}
		if !QueryNameIs(k, name) {
			continue
		}
		if n == 0 {
			first = v
		}
		last, n = v, n+1
		if stopFirst {
			break
		}
	}
	return first, last, n, false
}

// QueryNameIs reports whether the raw query name k, percent- and
// plus-decoded (an escape that is not one stands for itself), is name. It
// does not allocate; the front ends that read a query themselves (the
// net/http middleware) match names with it as the core does.
func QueryNameIs[T string | []byte](k T, name string) bool {
	j := 0
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(k) && isHex(k[i+1]) && isHex(k[i+2]):
			c = unhex(k[i+1])<<4 | unhex(k[i+2])
			i += 2
		}
		if j >= len(name) || name[j] != c {
			return false
		}
		j++
	}
	return j == len(name)
}

// appendQueryDecoded appends the raw query value v percent- and
// plus-decoded, an escape that is not one kept as it is.
func appendQueryDecoded(dst, v []byte) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(v) && isHex(v[i+1]) && isHex(v[i+2]):
			c = unhex(v[i+1])<<4 | unhex(v[i+2])
			i += 2
		}
		dst = append(dst, c)
	}
	return dst
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// IsKeyBlank reports whether key_trim: unicode strips r from the ends of
// a key: Unicode White_Space (what Go's unicode.IsSpace, JavaScript's
// trim and Python's str.strip strip), U+FEFF (JavaScript's trim) and
// U+001C to U+001F (Python's str.strip).
func IsKeyBlank(r rune) bool {
	return unicode.IsSpace(r) || r == 0xfeff || 0x1c <= r && r <= 0x1f
}

// TrimKey returns v without the runes IsKeyBlank at either end; bytes
// that are not UTF-8 are kept.
func TrimKey(v []byte) []byte {
	a, b := trimBounds(v)
	return v[a:b]
}

// trimBounds returns where TrimKey(v) starts and ends in v.
func trimBounds(v []byte) (a, b int) {
	a, b = 0, len(v)
	for a < b {
		r, n := utf8.DecodeRune(v[a:b])
		if r == utf8.RuneError && n <= 1 || !IsKeyBlank(r) {
			break
		}
		a += n
	}
	for a < b {
		r, n := utf8.DecodeLastRune(v[a:b])
		if r == utf8.RuneError && n <= 1 || !IsKeyBlank(r) {
			break
		}
		b -= n
	}
	return a, b
}

// appendPart appends one part of a key, v, to dst as AppendKeyStatus
// encodes parts (single: the value itself, 0x01 before a value that starts
// with 0x00 or 0x01; else its length as a uvarint, then the value),
// decoding v as dec says, trimming it (TrimKey) when trim and folding it
// (appendFolded, then trimmed again) when fold. The value is built in dst
// past a gap for the length, then moved down, so no scratch is needed. It
// reports false, dst unchanged, when nothing is left of v.
func appendPart(dst, v []byte, dec decodeKind, trim, fold, single bool) ([]byte, bool) {
	const gap = binary.MaxVarintLen64
	off := len(dst)
	dst = append(dst, make([]byte, gap)...)
	switch dec {
	case decodeQuery:
		dst = appendQueryDecoded(dst, v)
	case decodeJSON:
		dst = AppendJSONString(dst, v)
	default:
		dst = append(dst, v...)
	}
	lo, hi := off+gap, len(dst)
	if trim {
		a, b := trimBounds(dst[lo:hi])
		lo, hi = lo+a, lo+b
	}
	if fold && lo < hi {
		start := len(dst)
		dst = appendFolded(dst, dst[lo:hi])
		a, b := trimBounds(dst[start:])
		lo, hi = start+a, start+b
	}
	if lo == hi {
		return dst[:off], false
	}
	val := dst[lo:hi]
	var h [gap]byte
	head := h[:0]
	if !single {
		head = binary.AppendUvarint(head, uint64(len(val)))
	} else if val[0] <= 0x01 {
		head = append(head, 0x01)
	}
	n := copy(dst[off:], head)
	n += copy(dst[off+n:], val) // moves down: val starts past the head
	return dst[:off+n], true
}
