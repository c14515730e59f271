package rules

import "time"

// DescriptorEntry is one key/value pair of a descriptor of Envoy's rate
// limit service (envoy.extensions.common.ratelimit.v3.RateLimitDescriptor),
// in the order Envoy sent them.
type DescriptorEntry struct {
	Key   string
	Value string
}

// DescriptorAnswer is how a Descriptors answers one descriptor.
type DescriptorAnswer uint8

const (
	// DescriptorNone: no limit applies (an unknown domain, a descriptor the
	// files do not name). The front end answers OK without counting.
	DescriptorNone DescriptorAnswer = iota
	// DescriptorUnlimited: the files say the descriptor is unlimited; the
	// front end answers OK without counting.
	DescriptorUnlimited
	// DescriptorCounted: Rules.Rules[Rule] counts and decides the
	// descriptor, its limit being the rule's.
	DescriptorCounted
	// DescriptorOverride: the request carried its own limit
	// (RateLimitDescriptor.limit). Rules.Rules[Rule] counts the hits with a
	// ceiling of a limit (it never refuses below 2^32−1 units); the front
	// end compares the count after the hits, Limit − Remaining of the
	// verdict, with RequestsPerUnit itself.
	DescriptorOverride
)

var descriptorAnswerNames = []string{"none", "unlimited", "counted", "override"}

func (a DescriptorAnswer) String() string { return enumName(descriptorAnswerNames, int(a)) }

// DescriptorMatch is the answer of a Descriptors for one descriptor: which
// rule of the same Rules counts it, and what Envoy's response says of its
// limit. Its strings and slices are shared with the Descriptors and read
// only. The zero value is DescriptorNone, with Rule 0: check Answer first.
type DescriptorMatch struct {
	Answer DescriptorAnswer
	// Rule is the index in Rules.Rules of the rule that counts the
	// descriptor, for DescriptorCounted and DescriptorOverride; -1
	// otherwise.
	Rule int
	// Name is the limit's own name (rate_limit.name in envoyproxy/ratelimit's
	// files), empty when unnamed: current_limit.name of the answer, and
	// what other limits' Replaces name.
	Name string
	// Replaces names the limits this one replaces when both match one
	// request (rate_limit.replaces).
	Replaces []string
	// RequestsPerUnit is the limit in hits per Window (0 refuses every hit).
	RequestsPerUnit uint32
	// Unit is the number of envoy.service.ratelimit.v3.RateLimitResponse.
	// RateLimit.Unit for current_limit.unit (1 second … 7 week), 0 when the
	// window is not a whole number of seconds. With UnitMultiplier above 1
	// the window is that many units (a 90 s window is 90 × SECOND).
	Unit           uint8
	UnitMultiplier uint32 // 0 or 1: exactly one Unit
	// Window is the limit's window (0 for DescriptorNone and
	// DescriptorUnlimited). Windows start at whole multiples of Window since
	// the Unix epoch, as envoyproxy/ratelimit aligns them.
	Window time.Duration
	Shadow bool // counted, never refused (shadow_mode)
	Quota  bool // quota_mode: see the RLS's overall code
}

// Descriptors maps the descriptors of Envoy's rate limit service to the
// rules of the Rules that carries it (package envoyconf builds both from
// envoyproxy/ratelimit's files). The Rules and its Descriptors are one
// immutable value, swapped whole on reload, so a front end that reads
// both from one Rules never mixes generations. Implementations are safe
// for concurrent use and do not allocate for descriptors of up to 8
// entries of up to 256 bytes each.
type Descriptors interface {
	// HasDomain reports whether domain is configured.
	HasDomain(domain string) bool
	// Descriptor returns the limit of one descriptor of a request to
	// domain and appends to key the counter key to decide it under (the
	// bytes the core hashes into the rule's counter identity); it appends nothing when
	// no rule counts the descriptor.
	Descriptor(domain string, entries []DescriptorEntry, key []byte) (DescriptorMatch, []byte)
	// Override returns the limit of a descriptor that carries its own
	// limit: requestsPerUnit per unit (the number of envoy.type.v3.
	// RateLimitUnit), and appends its counter key. An unknown domain gets
	// DescriptorNone; an unknown unit is an error (envoyproxy/ratelimit
	// cannot answer it either).
	Override(domain string, entries []DescriptorEntry, requestsPerUnit uint32, unit uint8, key []byte) (DescriptorMatch, []byte, error)
}

// Finish derives what ParseRules computes once for each rule it parses
// (Rule.Seed, its counters' identity, and its name as bytes), for rules built by
// other loaders (package envoyconf), and returns r. Call it once, after
// every field is set and before r is shared; its Index is the caller's.
func Finish(r *Rule) *Rule {
	r.finish()
	return r
}
