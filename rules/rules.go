package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/internal/mix"
	"github.com/poplimit/poplimit/window"
	"go.yaml.in/yaml/v3"
)

// Kind is what a rule limits.
type Kind uint8

const (
	// Rate limits requests per window (the default).
	Rate Kind = iota
	// Concurrency limits requests in flight per key across the PoP: a slot
	// is taken when the request is admitted and given back when its
	// response completes; slots of an edge that died expire with their
	// lease. Only the proxy mode sees responses complete.
	Concurrency
	// Shed gives matching routes a priority class for load shedding: when
	// the upstream is overloaded, the lowest classes are refused first with
	// 503. It counts nothing per key.
	Shed
)

var kindNames = []string{"rate", "concurrency", "shed"}

func (k Kind) String() string { return enumName(kindNames, int(k)) }

// Priority is a route's class for load shedding, most important first.
type Priority uint8

const (
	Critical Priority = iota // shed last, with a reserved share of capacity
	High
	Normal // routes under no shed rule
	Low    // shed first
)

var priorityNames = []string{"critical", "high", "normal", "low"}

func (p Priority) String() string { return enumName(priorityNames, int(p)) }

// Shedding configures load shedding for the whole edge: the upstream counts
// as overloaded in proportion to max(in flight ÷ MaxInFlight, latency ÷
// Latency). Low routes are shed from 60 %, normal from 80 %, high from
// 100 % of the share left after Reserved; critical routes only at 100 %.
type Shedding struct {
	MaxInFlight int           // upstream requests in flight at full load; 0 disables shedding
	Latency     time.Duration // upstream latency (moving average) at full load; 0: in flight only
	Reserved    float64       // share of capacity only critical routes may use (default 0.1)
}

// KeySource names where one part of a rule's key comes from.
type KeySource uint8

const (
	KeyIP     KeySource = iota // the client IP (trusted-proxy aware, resolved by the edge)
	KeyHeader                  // a request header
	KeyQuery                   // a query parameter
	KeyCookie                  // a cookie
)

var keySourceNames = []string{"ip", "header", "query", "cookie"}

func (k KeySource) String() string { return enumName(keySourceNames, int(k)) }

// KeyPart is one part of a rule's key recipe.
type KeyPart struct {
	Source KeySource
	Name   string // header, query parameter or cookie name; empty for KeyIP
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

// Scope is where a rule's limit holds: among the edges of one PoP (the
// default), or across every PoP, each PoP adding what the others counted
// for the key (package global).
type Scope uint8

const (
	ScopePoP    Scope = iota // the limit holds within each PoP
	ScopeGlobal              // the limit holds across PoPs
)

var scopeNames = []string{"pop", "global"}

func (s Scope) String() string { return enumName(scopeNames, int(s)) }

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "unknown(" + strconv.Itoa(i) + ")"
}

// Rule is one parsed, validated rate-limiting rule. Rules are immutable once
// parsed and safe for concurrent use; a reload builds new ones.
type Rule struct {
	Name     string
	Kind     Kind
	Priority Priority // for Kind Shed

	// Policy is what the limiter runs: limit, window, burst, algorithm,
	// action, timeout, mode, failure policy and, for Kind Concurrency, the
	// lease (how long a dead edge's slots live).
	window.Policy

	// Match: every non-empty condition must hold.
	Host       string // exact host, without port; empty matches any
	PathPrefix string // empty matches any
	// PathFold compares PathPrefix under ASCII case folding (path_case:
	// insensitive), for origins that route /LOGIN as /login.
	PathFold bool
	Methods  []string // upper case; empty matches any; GET covers HEAD

	Key          []KeyPart // the key recipe; parts are joined
	MissingKey   MissingKey
	DuplicateKey DuplicateKey
	// QuerySemicolon and KeyTrim say how the key's fields are read
	// (query_semicolon, key_trim).
	QuerySemicolon QuerySemicolon
	KeyTrim        KeyTrim
	// IPv6Prefix is how many leading bits of an IPv6 client address key
	// the rule (default 64: one subscriber holds a whole /64 and can
	// rotate addresses inside it; 128 keys each address).
	IPv6Prefix int

	Shadow bool // decide and count, never refuse
	// Scope says whether the limit holds within the PoP or across PoPs
	// (scope: global; sliding and fixed windows only).
	Scope Scope
	// Envoy marks a rule built from an envoyproxy/ratelimit descriptor: it
	// is decided only through Envoy's rate limit service, and no HTTP
	// request matches it.
	Envoy bool

	Cost       uint64 // units one request costs (default 1)
	CostHeader string // if set, a request's cost is read from this header ...
	MaxCost    uint64 // ... and refused above this bound (default Limit)

	Tiers map[string]uint64 // tier name → limit, chosen by the key's override

	// Index is the rule's position in its Rules; Seed mixes the rule's
	// identity (name, window, algorithm) into key hashes, so a reload that
	// changes a rule's window starts it on fresh counters.
	Index int
	Seed  uint64
	// nameBytes is Name as bytes, for allocation-free event encoding.
	nameBytes []byte
}

// NameBytes returns the rule's name as a byte slice that must not be
// modified; it lives as long as the rule.
func (r *Rule) NameBytes() []byte { return r.nameBytes }

// Matches reports whether a request with this host (without port), method
// and path is under the rule. A rule for GET also meets HEAD, which asks
// for the same resource and which origins (Go's ServeMux, most
// frameworks) route to GET's handler. It does not allocate.
func (r *Rule) Matches(host, method, path []byte) bool {
	if r.Envoy {
		return false
	}
	if r.Host != "" && !EqualFold(host, r.Host) {
		return false
	}
	if r.PathPrefix != "" {
		if len(path) < len(r.PathPrefix) {
			return false
		}
		if r.PathFold {
			if !EqualFold(path[:len(r.PathPrefix)], r.PathPrefix) {
				return false
			}
		} else if string(path[:len(r.PathPrefix)]) != r.PathPrefix {
			return false
		}
	}
	if len(r.Methods) == 0 {
		return true
	}
	for _, m := range r.Methods {
		if string(method) == m || m == "GET" && string(method) == "HEAD" {
			return true
		}
	}
	return false
}

// EqualFold reports whether b and s are equal under ASCII case folding
// (header names, hosts), without allocating.
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Hash returns the 64-bit identity of key under the rule: the name of the
// key's counters in the store and in the block cache. Any bytes of any
// length are fine; the key itself is never stored.
func (r *Rule) Hash(key []byte) uint64 {
	return mix.Mix64(xxhash.Sum64(key) ^ r.Seed)
}

// Rules is an immutable snapshot of parsed rules and key overrides, safe for
// concurrent use. A reload builds a new snapshot and swaps it in whole.
type Rules struct {
	Rules []*Rule
	// MatchAll applies every matching rule to a request; otherwise the first
	// matching rule wins.
	MatchAll bool
	// Overrides maps a key (as the rule's recipe builds it) to a tier name.
	Overrides map[string]string
	// Shedding is the edge's load-shedding configuration.
	Shedding Shedding
	// Descriptors maps Envoy rate limit descriptors to these rules when
	// they came from envoyproxy/ratelimit files (package envoyconf); nil
	// for a poplimit rules file.
	Descriptors Descriptors
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

// Lookup returns the rule named name, or nil.
func (rs *Rules) Lookup(name string) *Rule {
	for _, r := range rs.Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Limits on rule files, so a hostile or broken file costs bounded memory.
const (
	MaxRules       = 1024
	MaxRuleName    = 128
	MaxKeyParts    = 8
	maxWindow      = 366 * 24 * time.Hour
	maxLimit       = 1 << 32 // counters are 32-bit in the Limiter's local view
	maxOverrideKey = 1024
)

// ruleFile is the YAML form of a rules file.
type ruleFile struct {
	Match    string       `yaml:"match"` // "first" (default) or "all"
	Rules    []ruleYAML   `yaml:"rules"`
	Shedding sheddingYAML `yaml:"shedding"`
}

type sheddingYAML struct {
	MaxInFlight *number  `yaml:"max_in_flight"`
	Latency     string   `yaml:"latency"`
	Reserved    *float64 `yaml:"reserved"`
}

type ruleYAML struct {
	Name         string             `yaml:"name"`
	Kind         string             `yaml:"kind"`
	Priority     string             `yaml:"priority"`
	Lease        string             `yaml:"lease"`
	Host         string             `yaml:"host"`
	PathPrefix   string             `yaml:"path_prefix"`
	PathCase     string             `yaml:"path_case"`
	Methods      []string           `yaml:"methods"`
	Key          []string           `yaml:"key"`
	MissingKey   string             `yaml:"missing_key"`
	DuplicateKey string             `yaml:"duplicate_key"`
	QuerySemi    string             `yaml:"query_semicolon"`
	KeyTrim      string             `yaml:"key_trim"`
	IPv6Prefix   *number            `yaml:"ipv6_prefix"`
	Limit        *number            `yaml:"limit"`
	Window       string             `yaml:"window"`
	Burst        *number            `yaml:"burst"`
	Algorithm    string             `yaml:"algorithm"`
	Action       string             `yaml:"action"`
	Timeout      string             `yaml:"timeout"`
	Mode         string             `yaml:"mode"`
	Fail         string             `yaml:"fail"`
	Shadow       bool               `yaml:"shadow"`
	Scope        string             `yaml:"scope"`
	Cost         *number            `yaml:"cost"`
	CostHeader   string             `yaml:"cost_header"`
	MaxCost      *number            `yaml:"max_cost"`
	Tiers        map[string]*number `yaml:"tiers"`
}

// number is an integer field as the file writes it: decoding keeps what
// was written and validation judges it, naming the field. (Decoded into
// an integer, YAML would truncate 1.5 to 1, read 010 as octal 8, and
// report 2^64 as a "!!float" without naming the field.)
type number struct {
	v     int64
	text  string // as written, quoted when a string, for messages
	whole bool   // v holds a YAML integer within int64
	huge  bool   // a whole number beyond int64
	octal bool   // a YAML 1.1 octal, 0 followed by digits
}

// UnmarshalYAML keeps node for validation; it never fails, so that every
// bad number is reported with its field's path.
func (n *number) UnmarshalYAML(node *yaml.Node) error {
	*n = number{text: node.Value}
	switch {
	case node.Kind == yaml.SequenceNode:
		n.text = "a list"
	case node.Kind == yaml.MappingNode:
		n.text = "a mapping"
	case node.Kind != yaml.ScalarNode:
		n.text = "an alias"
	case node.ShortTag() == "!!str":
		n.text = strconv.Quote(node.Value)
	case node.ShortTag() == "!!int":
		digits := strings.TrimLeft(strings.ReplaceAll(node.Value, "_", ""), "+-")
		if len(digits) > 1 && digits[0] == '0' && strings.Trim(digits, "0123456789") == "" {
			n.octal = true
			return nil
		}
		n.whole = node.Decode(&n.v) == nil
		n.huge = !n.whole
	case node.ShortTag() == "!!float":
		// YAML resolves a string of digits beyond uint64 as a float.
		digits := strings.TrimLeft(strings.ReplaceAll(node.Value, "_", ""), "+-")
		n.huge = digits != "" && strings.Trim(digits, "0123456789") == ""
	}
	return nil
}

// between returns n's value when it is a whole number within [lo, hi],
// else the reason it is not.
func (n *number) between(lo, hi int64) (int64, string) {
	rng := "between " + strconv.FormatInt(lo, 10) + " and " + strconv.FormatInt(hi, 10)
	switch {
	case n.octal:
		return 0, "must be a whole number " + rng + " written without a leading zero (YAML reads 010 as octal 8)"
	case n.huge:
		return 0, "must be " + rng
	case !n.whole:
		return 0, "must be a whole number " + rng
	case n.v < lo || n.v > hi:
		return 0, "must be " + rng
	}
	return n.v, ""
}

// FieldError is one problem with one field of a configuration file.
type FieldError struct {
	Path   string // e.g. "rules[2].limit"
	Value  string // the offending value, quoted as found
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return e.Path + ": " + e.Reason
	}
	return e.Path + ": " + e.Reason + " (got " + e.Value + ")"
}

// ErrInvalid is wrapped by every error of ParseRules and ParseOverrides about
// the content of a file.
var ErrInvalid = errors.New("invalid configuration")

// ParseRules parses and validates a YAML rules file. It reports every
// invalid field, each with its path and the bad value, joined in one error
// that wraps ErrInvalid; it never panics on any input.
func ParseRules(data []byte) (*Rules, error) {
	if n := countRules(data); n > MaxRules {
		// Refused before every rule is decoded and checked: a file of
		// 100,000 small rules (4 MB) would cost some 100 MB more.
		return nil, fmt.Errorf("rules: %w:\n%w", ErrInvalid,
			&FieldError{Path: "rules", Value: strconv.Itoa(n), Reason: "at most " + strconv.Itoa(MaxRules) + " rules"})
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&f)
	empty := errors.Is(err, io.EOF) // no document: empty, or only comments
	if err != nil && !empty {
		return nil, fmt.Errorf("rules: %w: %v", ErrInvalid, err)
	}
	var errs []error
	bad := func(path, value, reason string) {
		errs = append(errs, &FieldError{Path: path, Value: value, Reason: reason})
	}
	if !empty && !lastDocument(dec) {
		bad("file", "", "a rules file is one YAML document; this one holds more after a ---, which would be ignored")
	}
	rs := &Rules{}
	switch f.Match {
	case "", "first":
	case "all":
		rs.MatchAll = true
	default:
		bad("match", strconv.Quote(f.Match), `must be "first" or "all"`)
	}
	rs.Shedding = Shedding{Reserved: 0.1}
	if n := f.Shedding.MaxInFlight; n != nil {
		if v, why := n.between(0, 1<<24); why != "" {
			bad("shedding.max_in_flight", n.text, why+" (0: off)")
		} else {
			rs.Shedding.MaxInFlight = int(v)
		}
	}
	if f.Shedding.Latency != "" {
		if d, err := ParseDuration(f.Shedding.Latency); err != nil || d <= 0 || d > time.Hour {
			bad("shedding.latency", strconv.Quote(f.Shedding.Latency), "must be a positive duration of at most 1h")
		} else {
			rs.Shedding.Latency = d
		}
	}
	if r := f.Shedding.Reserved; r != nil {
		if *r < 0 || *r >= 1 {
			bad("shedding.reserved", strconv.FormatFloat(*r, 'g', -1, 64), "must be in [0, 1)")
		} else {
			rs.Shedding.Reserved = *r
		}
	}
	switch {
	case empty:
		bad("rules", "", "at least one rule is required; the file holds no YAML document (it is empty or only comments)")
	case len(f.Rules) == 0:
		bad("rules", "", "at least one rule is required")
	}
	if len(f.Rules) > MaxRules {
		bad("rules", strconv.Itoa(len(f.Rules)), "at most "+strconv.Itoa(MaxRules)+" rules")
		f.Rules = f.Rules[:MaxRules]
	}
	names := make(map[string]int)
	for i, y := range f.Rules {
		p := "rules[" + strconv.Itoa(i) + "]"
		r := parseRule(y, p, bad)
		if r == nil {
			continue
		}
		if j, dup := names[r.Name]; dup {
			bad(p+".name", strconv.Quote(r.Name), "duplicates rules["+strconv.Itoa(j)+"]")
			continue
		}
		names[r.Name] = i
		r.Index = len(rs.Rules)
		rs.Rules = append(rs.Rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("rules: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	return rs, nil
}

// lastDocument reports whether dec holds no document after the one
// decoded, but for empty ones (a trailing ---).
func lastDocument(dec *yaml.Decoder) bool {
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			return errors.Is(err, io.EOF)
		}
		if len(n.Content) > 0 && n.Content[0].ShortTag() != "!!null" {
			return false
		}
	}
}

// fields validates the fields of one rule: each check reports a bad value
// with the field's path and counts it, so a rule with any bad field is
// dropped whole.
type fields struct {
	path string
	bad  func(path, value, reason string)
	n    int
}

func (f *fields) fail(field, value, reason string) {
	f.n++
	if field == "" {
		f.bad(f.path, value, reason)
		return
	}
	f.bad(f.path+"."+field, value, reason)
}

// amount returns v when it is a whole number within [1, maxLimit), def
// when v is nil (required: a nil v is reported instead).
func (f *fields) amount(field string, v *number, def uint64, required bool) uint64 {
	if v == nil {
		if required {
			f.fail(field, "", "is required")
		}
		return def
	}
	n, why := v.between(1, maxLimit-1)
	if why != "" {
		f.fail(field, v.text, why)
		return def
	}
	return uint64(n)
}

// duration returns s parsed within [lo, hi] (whole milliseconds when
// wholeMillis), or def when s is empty.
func (f *fields) duration(field, s string, def, lo, hi time.Duration, wholeMillis bool, want string) time.Duration {
	if s == "" {
		return def
	}
	d, err := ParseDuration(s)
	if err != nil || d < lo || d > hi || wholeMillis && d%time.Millisecond != 0 {
		f.fail(field, strconv.Quote(s), "must be "+want)
		return def
	}
	return d
}

// only reports a field set on a rule it does not apply to.
func (f *fields) only(set bool, field, value string, applies bool, to string) {
	if set && !applies {
		f.fail(field, value, "applies only to "+to)
	}
}

func enumField[T window.Algorithm | window.Action | window.Mode | window.FailPolicy](f *fields, field, s string) T {
	v, err := window.ParseEnum[T](s)
	if err != nil {
		f.fail(field, strconv.Quote(s), err.Error())
	}
	return v
}

func parseRule(y ruleYAML, p string, bad func(path, value, reason string)) *Rule {
	f := &fields{path: p, bad: bad}
	r := &Rule{Name: y.Name, Shadow: y.Shadow}
	parseName(f, y.Name)
	parseMatch(f, y, r)
	parseKind(f, y, r)
	if r.Kind == Shed {
		// A shed rule only classes routes: nothing else applies.
		if y.Limit != nil || y.Window != "" || len(y.Key) > 0 || y.DuplicateKey != "" || y.QuerySemi != "" || y.KeyTrim != "" || y.Scope != "" {
			f.fail("", "", "a shed rule takes only name, match and priority")
		}
		if f.n > 0 {
			return nil
		}
		r.Limit, r.Window, r.Cost, r.Key = 1, time.Second, 1, []KeyPart{{Source: KeyIP}}
		r.finish()
		return r
	}
	parseKey(f, y, r)
	parsePolicy(f, y, r)
	parseCost(f, y, r)
	parseTiers(f, y, r)
	parseScope(f, y, r)
	if f.n == 0 && r.Kind == Rate {
		checkCost(f, y, r)
	}
	if f.n > 0 {
		return nil
	}
	r.finish()
	return r
}

// finish derives what a parsed rule computes once.
func (r *Rule) finish() {
	r.nameBytes = []byte(r.Name)
	r.Seed = xxhash.Sum64String(r.Name + "\x00" + r.Window.String() + "\x00" + r.Algorithm.String() + "\x00" + r.Kind.String())
}

func parseScope(f *fields, y ruleYAML, r *Rule) {
	var ok bool
	if r.Scope, ok = parseEnum[Scope](scopeNames, y.Scope); !ok {
		f.fail("scope", strconv.Quote(y.Scope), "must be one of "+strings.Join(scopeNames, ", "))
		return
	}
	if r.Scope == ScopeGlobal {
		f.only(true, "scope", strconv.Quote(y.Scope), r.Kind == Rate && r.Algorithm.IsCounter(),
			"rate rules of algorithm sliding_window or fixed_window (other PoPs' counts are window counts)")
	}
}

func parseName(f *fields, name string) {
	switch {
	case name == "":
		f.fail("name", "", "is required")
	case len(name) > MaxRuleName:
		f.fail("name", strconv.Itoa(len(name))+" bytes", "at most "+strconv.Itoa(MaxRuleName)+" bytes")
	case !printableName(name):
		f.fail("name", strconv.Quote(name), "only letters, digits and -_.:/ are allowed")
	}
}

func parseMatch(f *fields, y ruleYAML, r *Rule) {
	// One trailing dot is dropped: a fully qualified name is the same host,
	// and the front ends drop it from requests too.
	r.Host, r.PathPrefix = strings.TrimSuffix(strings.ToLower(y.Host), "."), y.PathPrefix
	if y.PathPrefix != "" && y.PathPrefix[0] != '/' {
		f.fail("path_prefix", strconv.Quote(y.PathPrefix), `must start with "/"`)
	}
	switch y.PathCase {
	case "", "sensitive":
	case "insensitive":
		r.PathFold = true
		f.only(true, "path_case", strconv.Quote(y.PathCase), y.PathPrefix != "", "rules with path_prefix")
	default:
		f.fail("path_case", strconv.Quote(y.PathCase), `must be "sensitive" or "insensitive"`)
	}
	for j, m := range y.Methods {
		u := strings.ToUpper(m)
		if u == "" || strings.IndexFunc(u, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
			f.fail("methods["+strconv.Itoa(j)+"]", strconv.Quote(m), "is not an HTTP method")
		}
		r.Methods = append(r.Methods, u)
	}
}

func parseKind(f *fields, y ruleYAML, r *Rule) {
	var ok bool
	if r.Kind, ok = parseEnum[Kind](kindNames, y.Kind); !ok {
		f.fail("kind", strconv.Quote(y.Kind), "must be one of "+strings.Join(kindNames, ", "))
	}
	r.Priority = Normal
	if y.Priority != "" {
		if r.Priority, ok = parseEnum[Priority](priorityNames, y.Priority); !ok {
			f.fail("priority", strconv.Quote(y.Priority), "must be one of "+strings.Join(priorityNames, ", "))
		}
		f.only(true, "priority", strconv.Quote(y.Priority), r.Kind == Shed, "kind: shed")
	}
}

func parseKey(f *fields, y ruleYAML, r *Rule) {
	if len(y.Key) == 0 {
		r.Key = []KeyPart{{Source: KeyIP}}
	}
	if len(y.Key) > MaxKeyParts {
		f.fail("key", strconv.Itoa(len(y.Key))+" parts", "at most "+strconv.Itoa(MaxKeyParts)+" parts")
	}
	for j, k := range y.Key {
		kp, err := parseKeyPart(k)
		if err != "" {
			f.fail("key["+strconv.Itoa(j)+"]", strconv.Quote(k), err)
			continue
		}
		r.Key = append(r.Key, kp)
	}
	var ok bool
	if r.MissingKey, ok = parseEnum[MissingKey](missingKeyNames, y.MissingKey); !ok {
		f.fail("missing_key", strconv.Quote(y.MissingKey), "must be one of "+strings.Join(missingKeyNames, ", "))
	}
	if r.DuplicateKey, ok = parseEnum[DuplicateKey](duplicateKeyNames, y.DuplicateKey); !ok {
		f.fail("duplicate_key", strconv.Quote(y.DuplicateKey), "must be one of "+strings.Join(duplicateKeyNames, ", "))
	}
	fieldKey := false
	for _, p := range r.Key {
		fieldKey = fieldKey || p.Source != KeyIP
	}
	f.only(y.DuplicateKey != "", "duplicate_key", strconv.Quote(y.DuplicateKey), fieldKey || len(r.Key) < len(y.Key),
		"rules keyed by a header, query parameter or cookie")
	if r.QuerySemicolon, ok = parseEnum[QuerySemicolon](querySemicolonNames, y.QuerySemi); !ok {
		f.fail("query_semicolon", strconv.Quote(y.QuerySemi), "must be one of "+strings.Join(querySemicolonNames, ", "))
	}
	queryKey := false
	for _, p := range r.Key {
		queryKey = queryKey || p.Source == KeyQuery
	}
	f.only(y.QuerySemi != "", "query_semicolon", strconv.Quote(y.QuerySemi), queryKey || len(r.Key) < len(y.Key),
		"rules keyed by a query parameter")
	if r.KeyTrim, ok = parseEnum[KeyTrim](keyTrimNames, y.KeyTrim); !ok {
		f.fail("key_trim", strconv.Quote(y.KeyTrim), "must be one of "+strings.Join(keyTrimNames, ", "))
	}
	f.only(y.KeyTrim != "", "key_trim", strconv.Quote(y.KeyTrim), fieldKey || len(r.Key) < len(y.Key),
		"rules keyed by a header, query parameter or cookie")
	r.IPv6Prefix = 64
	if n := y.IPv6Prefix; n != nil {
		if v, why := n.between(8, 128); why != "" {
			f.fail("ipv6_prefix", n.text, why+" bits")
		} else {
			r.IPv6Prefix = int(v)
		}
	}
}

func parsePolicy(f *fields, y ruleYAML, r *Rule) {
	r.Lease = f.duration("lease", y.Lease, 30*time.Second, time.Second, 24*time.Hour, true, "a duration of whole milliseconds between 1s and 24h")
	f.only(y.Lease != "", "lease", strconv.Quote(y.Lease), r.Kind == Concurrency, "kind: concurrency")
	if r.Kind == Concurrency && y.Window == "" {
		y.Window = r.Lease.String() // slots are counted per lease period
	}
	r.Algorithm = enumField[window.Algorithm](f, "algorithm", y.Algorithm)
	r.Action = enumField[window.Action](f, "action", y.Action)
	r.Mode = enumField[window.Mode](f, "mode", y.Mode)
	r.Fail = enumField[window.FailPolicy](f, "fail", y.Fail)
	r.Limit = f.amount("limit", y.Limit, 0, true)
	if y.Window == "" {
		f.fail("window", "", "is required")
	}
	r.Window = f.duration("window", y.Window, 0, time.Millisecond, maxWindow, true, "a duration of whole milliseconds between 1ms and 366d")
	r.Burst = f.amount("burst", y.Burst, r.Limit, false)
	r.Timeout = f.duration("timeout", y.Timeout, r.Window, time.Nanosecond, maxWindow, false, "a positive duration of at most 366d")
	f.only(y.Timeout != "", "timeout", strconv.Quote(y.Timeout), r.Action == window.Block, "action: block")
	switch {
	case f.n > 0:
	case r.Algorithm == window.TokenBucketAlgorithm:
		if err := (window.TokenBucket{Rate: int64(r.Limit), Per: r.Window, Burst: int64(r.Burst)}).Validate(); err != nil {
			f.fail("burst", strconv.FormatUint(r.Burst, 10), "does not fit the token bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	case r.Algorithm == window.LeakyBucketAlgorithm:
		if err := (window.LeakyBucket{Rate: int64(r.Limit), Per: r.Window, Capacity: int64(r.Burst)}).Validate(); err != nil {
			f.fail("burst", strconv.FormatUint(r.Burst, 10), "does not fit the leaky bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	}
	if r.Kind == Concurrency && (y.Algorithm != "" || y.Action != "" || y.Mode != "" || y.Timeout != "") {
		f.fail("kind", "concurrency", "takes no algorithm, action, mode or timeout")
	}
	if r.Algorithm == window.SlidingLogAlgorithm {
		// An exact limit cannot be decided from a view: a sliding log
		// runs in sync mode, one store operation per request.
		if y.Mode == "" {
			r.Mode = window.Sync
		} else if r.Mode == window.Async {
			f.fail("mode", "async", "a sliding_log runs in sync mode only (exact across edges, one store operation per request); use sliding_window for an async limit")
		}
		if r.Limit > window.MaxSharedLogLimit {
			f.fail("limit", strconv.FormatUint(r.Limit, 10), fmt.Sprintf("a sliding_log keeps every request's instant and takes at most %d per window; use sliding_window for large limits", window.MaxSharedLogLimit))
		}
	}
	if r.Action == window.Delay && r.Algorithm != window.LeakyBucketAlgorithm {
		f.fail("action", "delay", "queues requests as a leaky bucket: needs algorithm: leaky_bucket, not "+r.Algorithm.String())
	}
}

func parseCost(f *fields, y ruleYAML, r *Rule) {
	r.CostHeader = y.CostHeader
	r.Cost = f.amount("cost", y.Cost, 1, false)
	r.MaxCost = f.amount("max_cost", y.MaxCost, r.Limit, false)
	if y.MaxCost != nil {
		f.only(true, "max_cost", y.MaxCost.text, y.CostHeader != "", "rules with cost_header")
	}
	if y.CostHeader != "" && !IsToken(y.CostHeader) {
		f.fail("cost_header", strconv.Quote(y.CostHeader), "is not a valid header name")
	}
}

// checkCost refuses costs no request can ever be admitted at: a rate rule
// admits at most its capacity for one key at once (the limit, or a
// bucket's burst), so a request costing more is refused on every try.
// The capacity of a tier is its limit (and its burst, when the rule's
// burst is its limit, as the limiter scales it).
func checkCost(f *fields, y ruleYAML, r *Rule) {
	capacity := func(limit uint64) (uint64, string) {
		c, what := limit, "limit"
		if r.Algorithm != window.TokenBucketAlgorithm && r.Algorithm != window.LeakyBucketAlgorithm {
			return c, what
		}
		if r.Burst != r.Limit {
			c, what = r.Burst, "burst"
		}
		if r.Action == window.Delay {
			c, what = c+1, what+" plus the one being served" // a queue holds Burst while one is served
		}
		return c, what
	}
	c, what := capacity(r.Limit)
	if r.Cost > c {
		f.fail("cost", strconv.FormatUint(r.Cost, 10), "must be at most the "+what+", "+strconv.FormatUint(c, 10)+
			", or every request is refused")
		return
	}
	most, mostWhat := c, what
	for _, tier := range sortedKeys(r.Tiers) {
		tl := r.Tiers[tier]
		tc, tw := capacity(tl)
		if r.Cost > tc { // tc is the tier's limit (plus one, for a queue)
			f.fail("tiers."+tier, strconv.FormatUint(tl, 10), "must be at least "+strconv.FormatUint(r.Cost-(tc-tl), 10)+
				" (a request costs "+strconv.FormatUint(r.Cost, 10)+"), or every request of the tier is refused")
		}
		if tc > most {
			most, mostWhat = tc, "largest "+tw+" of the rule and its tiers"
		}
	}
	if y.MaxCost != nil && r.MaxCost > most {
		f.fail("max_cost", strconv.FormatUint(r.MaxCost, 10), "must be at most the "+mostWhat+", "+strconv.FormatUint(most, 10)+
			": a request costing more is refused on every try")
	}
}

func sortedKeys(m map[string]uint64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func parseTiers(f *fields, y ruleYAML, r *Rule) {
	for tier, l := range y.Tiers {
		if tier == "" || len(tier) > MaxRuleName || !printableName(tier) {
			f.fail("tiers", strconv.Quote(tier), "tier names are 1 to 128 letters, digits and -_.:/")
			continue
		}
		if l == nil {
			f.fail("tiers."+tier, "null", "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
			continue
		}
		if v := f.amount("tiers."+tier, l, 0, true); v > 0 {
			if r.Algorithm == window.SlidingLogAlgorithm && v > window.MaxSharedLogLimit {
				f.fail("tiers."+tier, strconv.FormatUint(v, 10), fmt.Sprintf("a sliding_log takes at most %d per window; use sliding_window for large limits", window.MaxSharedLogLimit))
			}
			if r.Tiers == nil {
				r.Tiers = make(map[string]uint64, len(y.Tiers))
			}
			r.Tiers[tier] = v
		}
	}
}

func parseEnum[T ~uint8](names []string, s string) (T, bool) {
	if s == "" {
		return 0, true
	}
	for i, n := range names {
		if n == s {
			return T(i), true
		}
	}
	return 0, false
}

func parseKeyPart(s string) (KeyPart, string) {
	src, name, hasName := strings.Cut(s, ":")
	switch src {
	case "ip":
		if hasName {
			return KeyPart{}, `"ip" takes no name`
		}
		return KeyPart{Source: KeyIP}, ""
	case "header", "query", "cookie":
		if !hasName || name == "" {
			return KeyPart{}, `needs a name, as in "` + src + `:NAME"`
		}
		if !IsToken(name) {
			return KeyPart{}, "name is not a valid token"
		}
		k := KeyPart{Name: name}
		switch src {
		case "header":
			k.Source = KeyHeader
		case "query":
			k.Source = KeyQuery
		default:
			k.Source = KeyCookie
		}
		return k, ""
	}
	return KeyPart{}, `must be "ip", "header:NAME", "query:NAME" or "cookie:NAME"`
}

// IsToken reports whether s is an RFC 9110 token (a header name, say) of
// at most 256 bytes.
func IsToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func printableName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:/", c) >= 0) {
			return false
		}
	}
	return true
}

// ParseDuration is time.ParseDuration that also takes whole days ("1d").
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("rules: duration %q: %w", s, err)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("rules: %w", err)
	}
	return d, nil
}

// countRulesFrom is the size from which ParseRules counts a file's rules
// before decoding them: a smaller file costs little either way.
const countRulesFrom = 64 << 10

// countRules returns how many items the top-level rules list of a file
// of at least countRulesFrom bytes holds (0 for a smaller file, or one
// that does not read), from the YAML's nodes alone.
func countRules(data []byte) int {
	if len(data) < countRulesFrom {
		return 0
	}
	var f struct {
		Rules ruleCount `yaml:"rules"`
	}
	if yaml.Unmarshal(data, &f) != nil {
		return 0
	}
	return int(f.Rules)
}

// ruleCount decodes a YAML sequence into its length.
type ruleCount int

func (c *ruleCount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		*c = ruleCount(len(n.Content))
	}
	return nil
}

// ParseOverrides parses a YAML overrides file, a map from key to tier name:
//
//	overrides:
//	  "api-key-123": pro
//
// Every bad entry is reported; the error wraps ErrInvalid.
func ParseOverrides(data []byte) (map[string]string, error) {
	var f struct {
		Overrides map[string]string `yaml:"overrides"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("rules: overrides: %w: %v", ErrInvalid, err)
	}
	var errs []error
	for k, t := range f.Overrides {
		switch {
		case k == "" || len(k) > maxOverrideKey:
			errs = append(errs, &FieldError{Path: "overrides", Value: strconv.Itoa(len(k)) + " bytes", Reason: "keys are 1 to 1024 bytes"})
		case t == "" || len(t) > MaxRuleName || !printableName(t):
			errs = append(errs, &FieldError{Path: "overrides." + strconv.Quote(k), Value: strconv.Quote(t), Reason: "tier names are 1 to 128 letters, digits and -_.:/"})
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("rules: overrides: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	if f.Overrides == nil {
		f.Overrides = map[string]string{}
	}
	return f.Overrides, nil
}
