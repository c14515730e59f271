package window

import (
	"time"

	"github.com/poplimit/poplimit/policy"
)

// Policy is what the Limiter needs of a rule (package slots its Lease and
// Fail): how much, over what period, by which algorithm, and what to do
// past it. Rule files (package rules) embed one in each rule. A Policy is a small value, immutable once
// built, safe to share between goroutines.
type Policy struct {
	Limit     uint64        // units per Window (for a token bucket, the refill per Window)
	Window    time.Duration // the period of the limit
	Burst     uint64        // token and leaky bucket capacity; Limit when zero
	Algorithm policy.Algorithm
	Action    policy.Action
	Timeout   time.Duration // how long Block blocks; Window when zero
	Mode      policy.Mode
	Fail      policy.Fail
	Lease     time.Duration // concurrency slots: how long a dead edge's slots live
}
