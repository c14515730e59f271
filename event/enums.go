package event

import "strconv"

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

// Mode is how the rule counts. The zero value is ModeAsync.
type Mode uint8

const (
	ModeAsync Mode = iota // decided from the local view, counted by a coalesced flush
	ModeSync              // decided on the count returned by one store round trip
)

func (m Mode) String() string {
	switch m {
	case ModeAsync:
		return "async"
	case ModeSync:
		return "sync"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Action is what a rule does to a client over its limit. The zero value is
// ActionThrottle.
type Action uint8

const (
	ActionThrottle Action = iota // refuse the excess, count admitted requests only
	ActionBlock                  // block the key for a timeout, count every attempt
)

func (a Action) String() string {
	switch a {
	case ActionThrottle:
		return "throttle"
	case ActionBlock:
		return "block"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Algorithm is the rate-limiting algorithm of the rule that decided, which
// tells the judge which exact truth to compute. The values and their order
// mirror window.Algorithm (this package does not import window), so an
// edge converts with Algorithm(rule.Algorithm). The zero value is
// AlgorithmSlidingWindow.
type Algorithm uint8

const (
	AlgorithmSlidingWindow Algorithm = iota // "sliding_window": counters of two fixed windows, weighted; shared by the PoP
	AlgorithmFixedWindow                    // "fixed_window": one counter per window; shared by the PoP
	AlgorithmTokenBucket                    // "token_bucket": Limit per window refill, Burst capacity; shared by the PoP
	AlgorithmLeakyBucket                    // "leaky_bucket": leaks Limit per window, Burst capacity; shared by the PoP
	AlgorithmSlidingLog                     // "sliding_log": exact log of the window; shared by the PoP
)

var algorithmNames = [...]string{"sliding_window", "fixed_window", "token_bucket", "leaky_bucket", "sliding_log"}

// String returns the name rule files use for the algorithm.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}
