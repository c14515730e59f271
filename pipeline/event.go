package pipeline

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
)

// Version is the encoding version that AppendEvent writes and DecodeEvent
// accepts. It is the first byte of every encoded event.
const Version = 1

// MaxRuleLen is the longest rule name, in bytes, that an event can carry.
const MaxRuleLen = 255

// MaxEventLen is the longest encoding of one event, in bytes: the fixed head,
// the longest varints and a rule name of MaxRuleLen bytes.
const MaxEventLen = 296

// The build fails unless MaxEventLen matches the layout.
var _ [0]struct{} = [MaxEventLen - (headLen + 3 + 3*5 + 1 + MaxRuleLen)]struct{}{}

const (
	// headLen is the fixed part: version, flags, time, key hash, estimate.
	headLen = 1 + 1 + 8 + 8 + 4
	// minEventLen is the shortest event: the head, four one-byte varints
	// and an empty rule name.
	minEventLen = headLen + 4 + 1
)

// Flag bits of the second byte.
const (
	flagLimited        = 1 << 0
	flagSync           = 1 << 1
	flagBlock          = 1 << 2
	flagFromBlockCache = 1 << 3
	flagShadow         = 1 << 4
	flagFallback       = 1 << 5
	flagsReserved      = 0xff &^ (1<<6 - 1)
)

// Errors that DecodeEvent and AppendEvent return. They are returned bare (not
// wrapped) so that decoding allocates nothing even when it fails; check them
// with errors.Is, since callers may wrap them.
var (
	// ErrVersion reports an event whose first byte is not Version.
	ErrVersion = errors.New("pipeline: unknown event version")
	// ErrTruncated reports an input that ends inside an event.
	ErrTruncated = errors.New("pipeline: truncated event")
	// ErrTrailing reports bytes after a complete event.
	ErrTrailing = errors.New("pipeline: trailing bytes after event")
	// ErrRuleTooLong reports a rule name longer than MaxRuleLen bytes.
	ErrRuleTooLong = errors.New("pipeline: rule name longer than 255 bytes")
	// ErrMalformed reports a field outside its domain: a reserved flag bit
	// set, a varint that is not minimally encoded or overflows its field,
	// or an enumeration value (Decision, Mode, Action) that does not exist.
	ErrMalformed = errors.New("pipeline: malformed event")
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

// Event is one rate-limit decision, as an edge emits it and the aggregator
// judges it. It carries everything the judge needs (limit, window, action,
// mode), so no event needs a rule table to be understood.
//
// The zero value is a valid event: an allowed async throttle decision at the
// Unix epoch on edge 0 with an empty rule name. Fields are ordered to keep
// the struct at 64 bytes without padding holes.
type Event struct {
	Time    int64  // when the edge decided, Unix nanoseconds
	KeyHash uint64 // 64-bit hash of the rule and the client key, never the key itself
	// Rule is the rule's name, at most MaxRuleLen bytes. DecodeEvent sets it
	// to a sub-slice of its input (no copy): it is valid as long as that
	// input is and must be copied to be kept longer.
	Rule         []byte
	Cost         uint32  // how much this request counts (usually 1)
	Limit        uint32  // the limit in force for this key, requests per window
	WindowMillis uint32  // the rule's window, milliseconds
	Estimate     float32 // the estimated request count in the window that the edge decided on
	Edge         uint16  // the edge server that decided

	Decision       Decision
	Mode           Mode
	Action         Action
	FromBlockCache bool // answered from the block cache without consulting the counters
	Shadow         bool // the rule is in shadow (log-only) mode: the decision was recorded, not enforced
	Fallback       bool // decided by the rule's failure policy because the store was unavailable
}

// uvarintLen is the number of bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// EncodedLen is the number of bytes AppendEvent writes for e, or 0 if
// AppendEvent would reject e.
func EncodedLen(e *Event) int {
	if len(e.Rule) > MaxRuleLen || e.Decision > Limited || e.Mode > ModeSync || e.Action > ActionBlock {
		return 0
	}
	return headLen + uvarintLen(uint64(e.Edge)) + uvarintLen(uint64(e.Cost)) +
		uvarintLen(uint64(e.Limit)) + uvarintLen(uint64(e.WindowMillis)) + 1 + len(e.Rule)
}

// AppendEvent appends the encoding of e to dst and returns the extended
// buffer. It allocates only if dst lacks the capacity (EncodedLen(e) or
// MaxEventLen bytes are always enough). It returns dst unchanged with
// ErrRuleTooLong if e.Rule is longer than MaxRuleLen bytes, or with
// ErrMalformed if e.Decision, e.Mode or e.Action is not a defined value.
//
// The encoding is canonical: one event has exactly one encoding, so
// AppendEvent(nil, decoded) reproduces the bytes DecodeEvent accepted.
func AppendEvent(dst []byte, e *Event) ([]byte, error) {
	if len(e.Rule) > MaxRuleLen {
		return dst, ErrRuleTooLong
	}
	if e.Decision > Limited || e.Mode > ModeSync || e.Action > ActionBlock {
		return dst, ErrMalformed
	}
	var flags byte
	if e.Decision == Limited {
		flags |= flagLimited
	}
	if e.Mode == ModeSync {
		flags |= flagSync
	}
	if e.Action == ActionBlock {
		flags |= flagBlock
	}
	if e.FromBlockCache {
		flags |= flagFromBlockCache
	}
	if e.Shadow {
		flags |= flagShadow
	}
	if e.Fallback {
		flags |= flagFallback
	}
	dst = append(dst, Version, flags)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.BigEndian.AppendUint64(dst, e.KeyHash)
	dst = binary.BigEndian.AppendUint32(dst, math.Float32bits(e.Estimate))
	dst = binary.AppendUvarint(dst, uint64(e.Edge))
	dst = binary.AppendUvarint(dst, uint64(e.Cost))
	dst = binary.AppendUvarint(dst, uint64(e.Limit))
	dst = binary.AppendUvarint(dst, uint64(e.WindowMillis))
	dst = append(dst, byte(len(e.Rule)))
	return append(dst, e.Rule...), nil
}

// DecodeEvent decodes exactly one event from b into e. It allocates nothing;
// e.Rule aliases b (capacity-limited, so appending to it cannot overwrite b).
//
// It returns ErrVersion if b does not start with Version, ErrTruncated if b
// ends inside the event, ErrTrailing if bytes follow it, and ErrMalformed if a
// field is outside its domain (see ErrMalformed). The version is checked
// before the length, so a future version is reported as such even when it is
// shorter than this one. On error e is left unchanged. DecodeEvent never
// panics, whatever b holds.
func DecodeEvent(b []byte, e *Event) error {
	if len(b) == 0 {
		return ErrTruncated
	}
	if b[0] != Version {
		return ErrVersion
	}
	if len(b) < minEventLen {
		return ErrTruncated
	}
	flags := b[1]
	if flags&flagsReserved != 0 {
		return ErrMalformed
	}
	ev := Event{
		Time:           int64(binary.BigEndian.Uint64(b[2:])),
		KeyHash:        binary.BigEndian.Uint64(b[10:]),
		Estimate:       math.Float32frombits(binary.BigEndian.Uint32(b[18:])),
		FromBlockCache: flags&flagFromBlockCache != 0,
		Shadow:         flags&flagShadow != 0,
		Fallback:       flags&flagFallback != 0,
	}
	if flags&flagLimited != 0 {
		ev.Decision = Limited
	}
	if flags&flagSync != 0 {
		ev.Mode = ModeSync
	}
	if flags&flagBlock != 0 {
		ev.Action = ActionBlock
	}
	off := headLen
	v, n, err := uvarint(b[off:], math.MaxUint16)
	if err != nil {
		return err
	}
	ev.Edge, off = uint16(v), off+n
	if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
		return err
	}
	ev.Cost, off = uint32(v), off+n
	if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
		return err
	}
	ev.Limit, off = uint32(v), off+n
	if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
		return err
	}
	ev.WindowMillis, off = uint32(v), off+n
	if off >= len(b) {
		return ErrTruncated
	}
	ruleLen := int(b[off])
	off++
	if len(b)-off < ruleLen {
		return ErrTruncated
	}
	ev.Rule = b[off : off+ruleLen : off+ruleLen]
	if off+ruleLen != len(b) {
		return ErrTrailing
	}
	*e = ev
	return nil
}

// uvarint decodes a minimally encoded unsigned varint of at most max from the
// start of b and returns it with its length.
func uvarint(b []byte, max uint64) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, 0, ErrTruncated
	case n < 0:
		return 0, 0, ErrMalformed // overflows 64 bits
	case n > 1 && b[n-1] == 0:
		return 0, 0, ErrMalformed // not minimal: a trailing zero group
	case v > max:
		return 0, 0, ErrMalformed
	}
	return v, n, nil
}
