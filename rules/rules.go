package rules

import (
	"strconv"
	"time"

	"github.com/poplimit/poplimit/window"
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
	// KeyCase says whether the key's fields are compared as sent or
	// folded (key_case: insensitive; bodykeys.go).
	KeyCase KeyCase
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

	// Count says which responses spend the rule's units (count:); its
	// zero value counts every admitted request.
	Count Count

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

// Lookup returns the rule named name, or nil.
func (rs *Rules) Lookup(name string) *Rule {
	for _, r := range rs.Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}
