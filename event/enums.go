package event

import (
	"strconv"

	"github.com/poplimit/poplimit/policy"
)

// Decision is what the edge decided for one request. The zero value is
// Allowed.
type Decision uint8

const (
	Allowed Decision = iota // the request went through
	Limited                 // the request was refused (429)
)

func (d Decision) String() string {
	switch d {
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// Transitional names of package policy's vocabulary.
type (
	Mode      = policy.Mode
	Action    = policy.Action
	Algorithm = policy.Algorithm
)

const (
	ModeAsync              = policy.Async
	ModeSync               = policy.Sync
	ActionThrottle         = policy.Throttle
	ActionBlock            = policy.Block
	AlgorithmSlidingWindow = policy.SlidingWindow
	AlgorithmFixedWindow   = policy.FixedWindow
	AlgorithmTokenBucket   = policy.TokenBucket
	AlgorithmLeakyBucket   = policy.LeakyBucket
	AlgorithmSlidingLog    = policy.SlidingLog
)
