package window

import (
	"time"

	"github.com/poplimit/poplimit/policy"
)

// Transitional names of package policy's vocabulary.
type (
	Algorithm  = policy.Algorithm
	Action     = policy.Action
	Mode       = policy.Mode
	FailPolicy = policy.Fail
)

const (
	SlidingWindowCounter = policy.SlidingWindow
	FixedWindowCounter   = policy.FixedWindow
	TokenBucketAlgorithm = policy.TokenBucket
	LeakyBucketAlgorithm = policy.LeakyBucket
	SlidingLogAlgorithm  = policy.SlidingLog
	Throttle             = policy.Throttle
	Block                = policy.Block
	Delay                = policy.Delay
	Async                = policy.Async
	Sync                 = policy.Sync
	FailOpen             = policy.FailOpen
	FailClosed           = policy.FailClosed
)

// ParseEnum is policy.Parse.
func ParseEnum[T Algorithm | Action | Mode | FailPolicy](s string) (T, error) {
	return policy.Parse[T](s)
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
