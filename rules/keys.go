package rules

import (
	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/internal/mix"
)

// KeySource names where one part of a rule's key comes from.
type KeySource uint8

const (
	KeyIP     KeySource = iota // the client IP (trusted-proxy aware, resolved by the edge)
	KeyHeader                  // a request header
	KeyQuery                   // a query parameter
	KeyCookie                  // a cookie
	KeyForm                    // a field of an application/x-www-form-urlencoded body (bodykeys.go)
	KeyJSON                    // a member of a JSON body, named by a JSON Pointer (bodykeys.go)
)

var keySourceNames = []string{"ip", "header", "query", "cookie", "form", "json"}

func (k KeySource) String() string { return enumName(keySourceNames, int(k)) }

// KeyPart is one part of a rule's key recipe.
type KeyPart struct {
	Source KeySource
	Name   string // header, query parameter, cookie or form field name, or a JSON Pointer as written; empty for KeyIP
}

// MissingKey is what a rule does with a request that lacks part of its key.
type MissingKey uint8

const (
	// MissingKeyIP falls back to the client IP alone, so keyless requests
	// are still limited per client, never pooled in one shared bucket.
	MissingKeyIP   MissingKey = iota
	MissingKeySkip            // the rule does not apply to the request
	MissingKeyDeny            // refuse the request (e.g. an API key is required)
)

var missingKeyNames = []string{"ip", "skip", "deny"}

func (m MissingKey) String() string { return enumName(missingKeyNames, int(m)) }

// DuplicateKey is what a rule does with a request in which a header, query
// parameter or cookie of its key appears more than once. The edge and the
// origin may read different ones of its values (PHP and many frameworks
// take the last query parameter or header line, the edge's recipe one
// value): a client that sends a fresh value beside the one the origin
// reads would meet a fresh counter on every request.
type DuplicateKey uint8

const (
	DuplicateKeyRefuse DuplicateKey = iota // refuse the request with 400 (the default)
	DuplicateKeyFirst                      // key by the first value
	DuplicateKeyLast                       // key by the last value
)

var duplicateKeyNames = []string{"refuse", "first", "last"}

func (d DuplicateKey) String() string { return enumName(duplicateKeyNames, int(d)) }

// QuerySemicolon is how a rule keyed by a query parameter reads ';' in
// the query. The WHATWG URL standard (URLSearchParams), PHP and Node's
// querystring split pairs on '&' only, so ?key=A;key=B is one value
// "A;key=B" (Go since 1.17 drops a pair holding ';'); Python's parse_qs
// before 3.9.2, Go before 1.17 and Perl's CGI.pm split on ';' too, and
// read key twice. A rule keyed for such an origin splits on ';' as well,
// so that the key given twice is a duplicate (DuplicateKey), not a fresh
// value.
type QuerySemicolon uint8

const (
	QuerySemicolonKeep  QuerySemicolon = iota // ';' is part of a name or value (the default)
	QuerySemicolonSplit                       // ';' separates pairs, as '&' does
)

var querySemicolonNames = []string{"keep", "split"}

func (q QuerySemicolon) String() string { return enumName(querySemicolonNames, int(q)) }

// KeyTrim is what a rule strips from the ends of the header, query and
// cookie values of its key. A header value is always read without its
// surrounding spaces and tabs (RFC 9110 §5.5); an origin that strips
// Unicode blanks too (Python's str.strip, JavaScript's String.trim) reads
// "k\u00a0" as "k", where the edge would count a fresh key.
type KeyTrim uint8

const (
	KeyTrimNone    KeyTrim = iota // values as read (the default)
	KeyTrimUnicode                // strip Unicode White_Space and U+FEFF from both ends
)

var keyTrimNames = []string{"none", "unicode"}

func (k KeyTrim) String() string { return enumName(keyTrimNames, int(k)) }

// Hash returns the 64-bit identity of key under the rule: the name of the
// key's counters in the store and in the block cache. Any bytes of any
// length are fine; the key itself is never stored.
func (r *Rule) Hash(key []byte) uint64 {
	return mix.Mix64(xxhash.Sum64(key) ^ r.Seed)
}

// LimitFor returns the limit of rule r for key: the limit of the key's tier
// when the rule has tiers and the key has an override, else r.Limit. It does
// not allocate.
func (rs *Rules) LimitFor(r *Rule, key []byte) uint64 {
	if len(r.Tiers) == 0 || len(rs.Overrides) == 0 {
		return r.Limit
	}
	tier, ok := rs.Overrides[string(key)]
	if !ok {
		return r.Limit
	}
	if l, ok := r.Tiers[tier]; ok {
		return l
	}
	return r.Limit
}
