package judge

import (
	"errors"
	"fmt"
	"time"
)

// Config configures a Judge. Start from DefaultConfig; Validate rejects zero
// values rather than replacing them.
type Config struct {
	// AllowedLateness is how far behind the latest event time seen an event
	// may arrive and still be judged in order: events are released once
	// the watermark (latest time − AllowedLateness) passes them. It adds
	// that much delay to every verdict. Zero judges on arrival order beyond
	// ties. Default 2 s.
	AllowedLateness time.Duration
	// MaxClockSkew bounds how far ahead of the caller's clock (the now
	// given to Add) an event may be: an event whose time is more than
	// AllowedLateness + MaxClockSkew after now, i.e. one that would move the
	// watermark more than MaxClockSkew past the clock, is invalid
	// ("future"): counted, kept out of the watermark and not judged. One
	// such event (an edge whose clock jumped) would otherwise release
	// every buffered event at once and, once judged, expire every key as
	// idle. It is the skew tolerated between the edges' clocks and the
	// caller's. Zero turns the check off, for callers whose now is not a
	// clock of the events' epoch (traces judged offline). Default 5 s.
	MaxClockSkew time.Duration
	// MaxEventAge bounds how far behind the caller's clock an event may
	// be: an event older than now − MaxEventAge is invalid ("past"):
	// counted, not judged, its units logged nowhere. A stream that is
	// merely behind (a backlog after a restart, a lagging partition) may
	// be far behind the watermark but is within this of the clock, and is
	// judged as usual: the default is Kafka's default retention, the
	// oldest backlog a default topic holds. Zero turns the check off.
	// Default 168 h.
	MaxEventAge time.Duration
	// Hold is the least time, measured in arrival (processing) time, that
	// an event waits in the buffer even once the watermark has passed it.
	// The watermark follows the partition furthest ahead; while the
	// consumer catches up (after a restart, or lagging) the others' events
	// arrive already behind it, and without a hold they would be judged in
	// arrival order, turning the small disorder between two edges' events
	// in one partition into late events. Such neighbours arrive within a
	// fetch of each other, well within the hold. In steady state events
	// wait AllowedLateness anyway and the hold never binds. Zero releases
	// on the watermark alone. Default 250 ms.
	Hold time.Duration
	// SettleLateness is how much longer than AllowedLateness the events of
	// a rule that counts by response (event.Event.Counting) wait: an
	// admitted request's event is sent when its response is known, or when
	// the edge gave up waiting for it, so it arrives up to the edges'
	// settle timeout after its time, and is judged in time order with the
	// refusals of its key, which arrive at once. Set it to the edges'
	// settle timeout; an event that settled later than this is late. The
	// buffer holds a counting rule's events that much longer (MaxBuffered
	// bounds them with the others). Default 1 min, the edges' default.
	SettleLateness time.Duration
	// Resolution is the step event times are floored to before they are
	// logged and compared. Default 1 ms; 1 ns is exact.
	Resolution time.Duration
	// MaxBuffered is the most events waiting for the watermark
	// (BytesPerBuffered each); past it, the oldest is judged early and
	// counted. Default 1<<20.
	MaxBuffered int
	// MaxKeys is the most keys (rule, key hash) with state (BytesPerKey
	// each, their logs apart); past it the least recently active key is
	// evicted and counted. Default 1<<20.
	MaxKeys int
	// MaxLogEntries is the most sliding-log entries the keys' rings have
	// room for, all keys together (BytesPerLogEntry each: a ring has room
	// for 8 entries at least, and for up to 4 times the entries it holds);
	// past it the least recently active keys are evicted and counted.
	// Default 1<<24: 256 MiB, room for 2^20 keys of sliding-log rules at
	// rest. See Config.MemoryBound for all the bounds together.
	MaxLogEntries int
	// MaxWrongKeys is the most keys remembered per list (false negatives,
	// false positives). Default 10000.
	MaxWrongKeys int
	// TopKeys is how many keys of each list the Report shows, most severe
	// first. At most MaxWrongKeys. Default 10.
	TopKeys int
	// MaxRules and MaxEdges bound the distinct rule names and edge ids that
	// get their own breakdown row and metric label value; the rest share
	// "_other". Defaults 256 each.
	MaxRules int
	MaxEdges int
	// Dedup is how many of the latest events the judge remembers (by a
	// 64-bit fingerprint of every field, about 40 bytes each) to drop an
	// exact copy of one of them: a batch that a producer wrote twice (its
	// acknowledgement timed out and it retried) or that the consumer read
	// twice (its commit was cut off). Edges stamp events to the
	// nanosecond, so two real decisions are never identical. 0 keeps
	// every event, for sources whose times are coarse, such as traces
	// judged offline in milliseconds. Events marked event.Event.Framed
	// are not fingerprinted: their copies are their frames', which the
	// consumer drops. Default 0; the aggregator sets it.
	Dedup int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		AllowedLateness: 2 * time.Second,
		MaxClockSkew:    5 * time.Second,
		MaxEventAge:     168 * time.Hour,
		Hold:            250 * time.Millisecond,
		SettleLateness:  time.Minute,
		Resolution:      time.Millisecond,
		MaxBuffered:     1 << 20,
		MaxKeys:         1 << 20,
		MaxLogEntries:   1 << 24,
		MaxWrongKeys:    10000,
		TopKeys:         10,
		MaxRules:        256,
		MaxEdges:        256,
	}
}

// ErrConfig is wrapped by every problem Validate reports.
var ErrConfig = errors.New("judge: invalid config")

// Validate reports every invalid field, each with its name and value, joined
// into one error that wraps ErrConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%w: Config.%s = %v: %s", ErrConfig, field, value, why))
	}
	atLeast1 := func(field string, v int) {
		if v < 1 {
			bad(field, v, "must be at least 1")
		}
	}
	if c.AllowedLateness < 0 {
		bad("AllowedLateness", c.AllowedLateness, "must not be negative")
	}
	if c.MaxClockSkew < 0 {
		bad("MaxClockSkew", c.MaxClockSkew, "must not be negative (0: off)")
	}
	if c.MaxEventAge < 0 {
		bad("MaxEventAge", c.MaxEventAge, "must not be negative (0: off)")
	}
	if c.Hold < 0 {
		bad("Hold", c.Hold, "must not be negative")
	}
	if c.SettleLateness < 0 {
		bad("SettleLateness", c.SettleLateness, "must not be negative")
	}
	if c.Resolution <= 0 {
		bad("Resolution", c.Resolution, "must be positive")
	}
	atLeast1("MaxBuffered", c.MaxBuffered)
	atLeast1("MaxKeys", c.MaxKeys)
	atLeast1("MaxLogEntries", c.MaxLogEntries)
	atLeast1("MaxWrongKeys", c.MaxWrongKeys)
	if c.TopKeys < 0 || c.TopKeys > c.MaxWrongKeys {
		bad("TopKeys", c.TopKeys, "must be between 0 and MaxWrongKeys")
	}
	atLeast1("MaxRules", c.MaxRules)
	atLeast1("MaxEdges", c.MaxEdges)
	if c.MaxKeys > 1<<30 {
		bad("MaxKeys", c.MaxKeys, "must be at most 2^30")
	}
	if c.Dedup < 0 || c.Dedup > 1<<24 {
		bad("Dedup", c.Dedup, "must be between 0 (off) and 2^24")
	}
	return errors.Join(errs...)
}
