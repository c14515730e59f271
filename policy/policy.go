// Package policy is the vocabulary of a rate-limiting rule: which
// algorithm counts (Algorithm), what happens to a key over its limit
// (Action), where the counting happens relative to the request (Mode), and
// what is decided when the store cannot answer (Fail). Each concept is
// spelled once, here, and every package names it through this one:
// package window's algorithms and limiter, package event's records (whose
// wire format numbers the values as this package does), the rules file
// parser, the envoyproxy/ratelimit file parser (which keeps its own
// defaults and maps its spellings to these values when it parses), the
// judge and the decision core.
//
// The package is a leaf: it imports only the standard library, so that
// package event stays a leaf of types, and so that the algorithms, the
// stores, the block cache and the Kafka transport can all name a rule's
// algorithm without importing each other.
//
// The numbering of every value is part of the event wire format
// (event/FORMAT.md): new values are appended, none is renumbered.
package policy

import (
	"fmt"
	"strconv"
	"strings"
)

// Algorithm names a rate-limiting algorithm. The zero value is
// SlidingWindow, the default of a poplimit rules file.
type Algorithm uint8

// The algorithms a rule can name. Every one holds across the PoP through
// the store: SlidingWindow and FixedWindow as window counters, the others
// as one state per key that each operation reads, updates and writes back
// atomically.
const (
	SlidingWindow Algorithm = iota // "sliding_window": counters of two fixed windows, the previous one weighted (default)
	FixedWindow                    // "fixed_window": one counter per window
	TokenBucket                    // "token_bucket": refills Limit per Window, capacity Burst
	LeakyBucket                    // "leaky_bucket": leaks Limit per Window, capacity Burst
	SlidingLog                     // "sliding_log": exact, one timestamp per admitted unit, O(Limit) memory per key
)

var algorithmNames = []string{"sliding_window", "fixed_window", "token_bucket", "leaky_bucket", "sliding_log"}

// String returns the algorithm's name as rule files write it.
func (a Algorithm) String() string { return enumName("Algorithm", algorithmNames, int(a)) }

// IsCounter reports whether the algorithm keeps its count in window
// counters: the sliding and the fixed window. The others keep one state
// per key.
func (a Algorithm) IsCounter() bool { return a <= FixedWindow }

// IsBucket reports whether the algorithm is a bucket (token or leaky), the
// only ones with a burst.
func (a Algorithm) IsBucket() bool { return a == TokenBucket || a == LeakyBucket }

// Action is what a rule does with a key over its limit. The zero value is
// Throttle.
type Action uint8

const (
	// Throttle admits while the estimate of admitted units in the trailing
	// window stays within the limit; only admitted requests are counted, and
	// a refused key is refused until its computed release time.
	Throttle Action = iota
	// Block counts every request and, when the estimated rate of all of
	// them exceeds the limit, blocks the key for the rule's timeout;
	// blocked requests are still counted.
	Block
	// Delay is the leaky bucket as a queue (nginx's limit_req with burst
	// and no nodelay): a request over the rate is admitted with a delay
	// that spaces the key's requests Window/Limit apart, up to Burst of
	// them waiting at once; past that it is refused. Leaky buckets only.
	Delay
)

var actionNames = []string{"throttle", "block", "delay"}

// String returns the action's name as rule files write it.
func (a Action) String() string { return enumName("Action", actionNames, int(a)) }

// Mode is where a rule's counting happens relative to the request. The
// zero value is Async.
type Mode uint8

const (
	// Async decides from the local view and flushes what it counted in
	// the background: no network on the request path.
	Async Mode = iota
	// Sync updates the store on the request path (a counter's increment, a
	// state's conditional take) and decides on the reply: exact, one store
	// round trip per request. Sliding logs always run in sync mode.
	Sync
)

var modeNames = []string{"async", "sync"}

// String returns the mode's name as rule files write it.
func (m Mode) String() string { return enumName("Mode", modeNames, int(m)) }

// Fail is what a rule decides when the store cannot answer. The zero value
// is FailOpen.
type Fail uint8

const (
	FailOpen   Fail = iota // "open": admit (Stripe's and Cloudflare's default)
	FailClosed             // "closed": refuse (logins and other abuse-first rules)
)

var failNames = []string{"open", "closed"}

// String returns the failure policy's name as rule files write it.
func (f Fail) String() string { return enumName("Fail", failNames, int(f)) }

// enumName returns the name of value i, or "Type(i)" outside the enum.
func enumName(typ string, names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return typ + "(" + strconv.Itoa(i) + ")"
}

// Names returns the names of T's values in order of their numbers, as
// rule files write them.
func Names[T Algorithm | Action | Mode | Fail]() []string {
	var names []string
	switch any(T(0)).(type) {
	case Algorithm:
		names = algorithmNames
	case Action:
		names = actionNames
	case Mode:
		names = modeNames
	default:
		names = failNames
	}
	return append([]string(nil), names...)
}

// Lookup returns the value of T named s, and whether there is one.
func Lookup[T Algorithm | Action | Mode | Fail](s string) (T, bool) {
	for i, n := range Names[T]() {
		if n == s {
			return T(i), true
		}
	}
	return 0, false
}

// Parse parses the name of a value of one of this package's types as
// rule files write it; "" is the zero value. The error says which names
// are valid.
func Parse[T Algorithm | Action | Mode | Fail](s string) (T, error) {
	if s == "" {
		return 0, nil
	}
	if v, ok := Lookup[T](s); ok {
		return v, nil
	}
	return 0, fmt.Errorf("must be one of %s", strings.Join(Names[T](), ", "))
}
