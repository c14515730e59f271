package aggregator

import (
	"log/slog"
	"os"
	"runtime/debug"
)

// What the aggregator holds beside the judge, in bytes (64-bit platforms),
// measured by TestMemoryBoundUnderFlood.
const (
	// tallyBytesPerKey is a key of a global rule counted for the global
	// topic in one PoP (global.Tally: about 590 bytes, more while its
	// index map grows; each further PoP adds about 300 bytes): at most
	// -global-max-keys of them.
	tallyBytesPerKey = 720
	// bytesPerDedupFrame is a frame identity the consumer remembers
	// (pipeline.ConsumerConfig.DedupFrames of them).
	bytesPerDedupFrame = 32
	// maxMessageBytes is the largest message the consumer expects: a
	// frame of the producers' default pipeline.ProducerConfig.FrameBytes.
	// kafka-go queues up to pipeline.ConsumerConfig.QueueCapacity fetched
	// messages ahead of the judge, and one fetch of MaxBytes.
	maxMessageBytes = 64 << 10
	// fixedBytes is the rest: the Go runtime, the HTTP server, the
	// metrics, the consumer at rest.
	fixedBytes = 8 << 20
)

// MemoryBound returns the most memory, in bytes, the aggregator's state
// takes at c's bounds (the judge's, the global tally's, the consumer's
// frame identities), its zero fields at their defaults, without the
// embedded broker's log: the live heap. The garbage between two
// collections comes on top; SetMemoryLimit bounds it.
func (c Config) MemoryBound() int64 {
	c = c.WithDefaults()
	b := c.Judge.MemoryBound() + int64(c.Consumer.DedupFrames)*bytesPerDedupFrame + fixedBytes +
		int64(c.Consumer.QueueCapacity)*maxMessageBytes + int64(c.Consumer.MaxBytes)
	if c.GlobalInterval > 0 {
		b += int64(c.GlobalMaxKeys) * tallyBytesPerKey
	}
	return b
}

// memoryLimit is the Go runtime's soft memory limit the aggregator sets
// for a bound b: an eighth more, so that the collector runs more often as
// the heap nears the bound rather than let the garbage double it (the
// default GOGC=100 lets the heap grow to twice what is live, which is how
// a flood of keys took an aggregator whose state fitted its bound to
// half as much again in RSS).
func memoryLimit(b int64) int64 { return b + b/8 }

// SetMemoryLimit sets the Go runtime's soft memory limit to
// memoryLimit(c.MemoryBound()), unless GOMEMLIMIT is set (then that holds),
// and logs which. The limit is the process's: a program that runs an
// aggregator alone calls it (cmd/aggregator does); one that embeds it
// among other work sets its own.
func SetMemoryLimit(c Config, log *slog.Logger) {
	c = c.WithDefaults()
	b := c.MemoryBound()
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("aggregator: memory: GOMEMLIMIT holds", "gomemlimit", v, "state_bound_mib", b>>20)
		return
	}
	l := memoryLimit(b)
	debug.SetMemoryLimit(l)
	log.Info("aggregator: memory: soft limit set from the bounds (GOMEMLIMIT overrides it)",
		"limit_mib", l>>20, "state_bound_mib", b>>20, "judge_mib", c.Judge.MemoryBound()>>20)
}
