package window

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm uint8

// The algorithms a policy can name. Every one holds across the PoP
// through the Store: SlidingWindowCounter and FixedWindowCounter as window
// counters (Store.Do), the others as one state per key that each operation
// reads, updates and writes back atomically (Store.DoState).
const (
	SlidingWindowCounter Algorithm = iota // "sliding_window" (default)
	FixedWindowCounter                    // "fixed_window"
	TokenBucketAlgorithm                  // "token_bucket": rate Limit per Window, burst Burst
	LeakyBucketAlgorithm                  // "leaky_bucket": leaks Limit per Window, capacity Burst
	SlidingLogAlgorithm                   // "sliding_log": exact, O(Limit) memory per key
)

var algorithmNames = []string{"sliding_window", "fixed_window", "token_bucket", "leaky_bucket", "sliding_log"}

func (a Algorithm) String() string { return enumName(algorithmNames, int(a)) }

// IsCounter reports whether the algorithm keeps its count in window
// counters (Store.Do): the sliding and the fixed window. The others keep
// one state per key (Store.DoState).
func (a Algorithm) IsCounter() bool { return a <= FixedWindowCounter }

// Action is what a policy does with a key over its limit.
type Action uint8

const (
	// Throttle admits while the estimate of admitted units in the trailing
	// window stays within the limit; only admitted requests are counted, and
	// a refused key is refused until its computed release time.
	Throttle Action = iota
	// Block counts every request and, when the estimated rate of all of
	// them exceeds the limit, blocks the key for the policy's Timeout;
	// blocked requests are still counted.
	Block
	// Delay is the leaky bucket as a queue (nginx's limit_req with burst
	// and no nodelay): a request over the rate is admitted with a delay
	// that spaces the key's requests Window/Limit apart, up to Burst of
	// them waiting at once; past that it is refused. Leaky buckets only.
	Delay
)

var actionNames = []string{"throttle", "block", "delay"}

func (a Action) String() string { return enumName(actionNames, int(a)) }

// Mode is where a policy's counting happens relative to the request.
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

func (m Mode) String() string { return enumName(modeNames, int(m)) }

// FailPolicy is what a policy decides when the store cannot answer.
type FailPolicy uint8

const (
	FailOpen   FailPolicy = iota // admit (Stripe's and Cloudflare's default)
	FailClosed                   // refuse (logins and other abuse-first rules)
)

var failNames = []string{"open", "closed"}

func (f FailPolicy) String() string { return enumName(failNames, int(f)) }

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "unknown(" + strconv.Itoa(i) + ")"
}

// ParseEnum parses the name of a value of one of this package's
// enumerations (Algorithm, Action, Mode, FailPolicy) as rule files write
// it; "" is the zero value. The error says which names are valid.
func ParseEnum[T Algorithm | Action | Mode | FailPolicy](s string) (T, error) {
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
	if s == "" {
		return 0, nil
	}
	for i, n := range names {
		if n == s {
			return T(i), nil
		}
	}
	return 0, fmt.Errorf("must be one of %s", strings.Join(names, ", "))
}

// Policy is what the Limiter and Slots need of a rule: how much, over what
// period, by which algorithm, and what to do past it. Rule files (package
// rules) embed one in each rule. A Policy is a small value, immutable once
// built, safe to share between goroutines.
type Policy struct {
	Limit     uint64        // units per Window (for a token bucket, the refill per Window)
	Window    time.Duration // the period of the limit
	Burst     uint64        // token and leaky bucket capacity; Limit when zero
	Algorithm Algorithm
	Action    Action
	Timeout   time.Duration // how long Block blocks; Window when zero
	Mode      Mode
	Fail      FailPolicy
	Lease     time.Duration // concurrency slots: how long a dead edge's slots live
}
