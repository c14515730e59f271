package event

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/poplimit/poplimit/policy"
)

// Version is the event encoding version that Append writes: the first
// byte of every event it encodes. Decode accepts it, VersionV3, VersionV2
// and VersionV1.
const Version = 4

// VersionV3 is version 4 without the counting byte (Counting, Counted,
// SettleMicros): an event of it decodes with Counting false.
const VersionV3 = 3

// VersionV2 is version 3 without the PoP's name and the Global flag: an
// event of it decodes with an empty Pop and Global false.
const VersionV2 = 2

// VersionV1 is the first event encoding, without the algorithm, burst and
// delay. Decode still reads it (as a sliding-window event whose Burst
// is its Limit); nothing writes it any more.
const VersionV1 = 1

// MaxRuleLen is the longest rule name, in bytes, that an event can carry.
const MaxRuleLen = 255

// MaxPopLen is the longest PoP name, in bytes, that an event can carry.
const MaxPopLen = 32

// MaxLen is the longest encoding of one event of any version, in
// bytes: the version 4 head, the longest varints (a delay included), a
// rule name of MaxRuleLen bytes, a PoP name of MaxPopLen and the counting
// byte with its two longest varints. Version 3 events are at most 340
// bytes, version 2 events 307, version 1 events 296.
const MaxLen = 351

// The build fails unless MaxLen matches the layouts.
var (
	_ [0]struct{} = [MaxLen - (headLen + 3 + 5*5 + 1 + MaxRuleLen + 1 + MaxPopLen + 1 + 2*5)]struct{}{}
	_ [0]struct{} = [maxEventLenV1 - (headLenV1 + 3 + 3*5 + 1 + MaxRuleLen)]struct{}{}
	_ [MaxLen - maxEventLenV1]struct{}
)

const (
	// headLen is the fixed part of version 2: version, flags, algorithm,
	// time, key hash, estimate.
	headLen = 1 + 1 + 1 + 8 + 8 + 4
	// minEventLen is the shortest version 2 event: the head, five one-byte
	// varints (edge, cost, limit, window, burst) and an empty rule name;
	// a version 3 event has one more byte, its PoP name's length, and a
	// version 4 event another, its counting byte.
	minEventLen = headLen + 5 + 1

	// headLenV1 is the fixed part of version 1: version, flags, time, key
	// hash, estimate.
	headLenV1 = 1 + 1 + 8 + 8 + 4
	// minEventLenV1 is the shortest version 1 event: the head, four
	// one-byte varints and an empty rule name.
	minEventLenV1 = headLenV1 + 4 + 1
	// maxEventLenV1 is the longest version 1 event.
	maxEventLenV1 = 296
)

// Flag bits of the second byte.
const (
	flagLimited        = 1 << 0
	flagSync           = 1 << 1
	flagBlock          = 1 << 2
	flagFromBlockCache = 1 << 3
	flagShadow         = 1 << 4
	flagFallback       = 1 << 5
	flagDelayed        = 1 << 6 // version 2 and later
	flagGlobal         = 1 << 7 // version 3 only
	flagsReservedV2    = 0xff &^ (1<<7 - 1)
	flagsReservedV1    = 0xff &^ (1<<6 - 1)
)

// Bits of the counting byte, the last byte of a version 4 event before its
// counting varints.
const (
	countCounting      = 1 << 0
	countReservedFlags = 0xff &^ countCounting
)

// Errors that Decode, Append and the frame functions of package pipeline
// return. They are returned bare (not wrapped) so that decoding allocates
// nothing even when it fails; check them with errors.Is, since callers may
// wrap them.
var (
	// ErrVersion reports an event or frame whose first byte is not a
	// version this package reads.
	ErrVersion = errors.New("event: unknown event version")
	// ErrTruncated reports an input that ends inside an event or frame.
	ErrTruncated = errors.New("event: truncated event")
	// ErrTrailing reports bytes after a complete event or frame.
	ErrTrailing = errors.New("event: trailing bytes after event")
	// ErrRuleTooLong reports a rule name longer than MaxRuleLen bytes, or
	// a PoP name longer than MaxPopLen.
	ErrRuleTooLong = errors.New("event: rule name longer than 255 bytes or PoP name longer than 32")
	// ErrMalformed reports a field outside its domain: a reserved flag bit
	// set, a varint that is not minimally encoded or overflows its field,
	// an enumeration value (Decision, Mode, Action, Algorithm) that does
	// not exist, a delay on an event that was not delayed, a count or a
	// settlement time on an event that is not Counting, a count over the
	// cost, or, in a frame,
	// an event count or length out of range or an event of another edge or
	// version.
	ErrMalformed = errors.New("event: malformed event")
)

// Event is one rate-limit decision, as an edge emits it and the aggregator
// judges it. It carries everything the judge needs to compute the exact
// truth of the rule's algorithm (limit, window, burst, action, mode), so no
// event needs a rule table to be understood.
//
// The zero value is a valid event: an allowed async throttle decision of a
// sliding-window rule at the Unix epoch on edge 0 with an empty rule name.
// Fields are ordered to keep the struct at 112 bytes with no padding
// between fields.
type Event struct {
	Time    int64  // when the edge decided, Unix nanoseconds
	KeyHash uint64 // 64-bit hash of the rule and the client key, never the key itself
	// Rule is the rule's name, at most MaxRuleLen bytes. Decode sets it
	// to a sub-slice of its input (no copy): it is valid as long as that
	// input is and must be copied to be kept longer.
	Rule []byte
	// Pop is the name of the PoP whose edge decided, at most MaxPopLen
	// bytes, empty when the edge has none; it aliases Decode's input
	// as Rule does. A PoP-scope rule is judged per PoP, a global one across
	// every PoP.
	Pop          []byte
	Cost         uint32  // how much this request counts (usually 1)
	Limit        uint32  // the limit in force for this key: units per window (a bucket's rate per window)
	WindowMillis uint32  // the rule's window, milliseconds
	Estimate     float32 // the estimated request count in the window that the edge decided on
	// Burst is the capacity of a token_bucket or leaky_bucket rule, in
	// units; edges set it to Limit for the other algorithms, which do not
	// use it. A version 1 event decodes with Burst = Limit.
	Burst uint32
	// DelayMicros is how long a leaky-bucket queue held the request before
	// it went through, microseconds; it must be 0 unless Delayed is set.
	DelayMicros uint32
	// Counted is how many of the request's units its response counted, at
	// most Cost, for an event that is Counting; 0 otherwise. A limited
	// request counts nothing; an admitted one whose response never came
	// counts all its Cost.
	Counted uint32
	// SettleMicros is how long after Time the request settled (its
	// response was known, or the edge gave up waiting for it),
	// microseconds, for an event that is Counting; 0 otherwise.
	SettleMicros uint32
	Edge         uint16 // the edge server that decided

	Decision       Admission
	Mode           policy.Mode
	Action         policy.Action
	Algorithm      policy.Algorithm // the rule's algorithm; version 1 events decode as policy.SlidingWindow
	FromBlockCache bool             // answered from the block cache without consulting the counters
	Shadow         bool             // the rule is in shadow (log-only) mode: the decision was recorded, not enforced
	Fallback       bool             // decided by the rule's failure policy because the store was unavailable
	// Delayed reports a request that a leaky-bucket queue delayed (by
	// DelayMicros) instead of refusing it.
	Delayed bool
	// Global reports a rule of scope global: its limit holds across PoPs.
	Global bool
	// Counting reports a rule that counts by response (its count field):
	// the request spent Counted units, not Cost, and an admitted request's
	// event is sent when it settled, SettleMicros after Time, so it
	// arrives up to the rule's settle timeout late.
	Counting bool
	// Framed is set by pipeline's Consumer on an event that came in a
	// frame its frame dedup (DedupFrames) checked: a copy of it can only be a copy
	// of its frame, which that dedup drops, so a judge need not
	// fingerprint it. It is not encoded; Append ignores it.
	Framed bool
}

// Check reports why Append would reject e, or nil: ErrRuleTooLong or
// ErrMalformed.
func (e *Event) Check() error {
	if len(e.Rule) > MaxRuleLen || len(e.Pop) > MaxPopLen {
		return ErrRuleTooLong
	}
	if e.Decision > Limited || e.Mode > policy.Sync || e.Action > policy.Block || e.Algorithm > policy.SlidingLog ||
		(!e.Delayed && e.DelayMicros != 0) || (!e.Counting && (e.Counted != 0 || e.SettleMicros != 0)) ||
		e.Counted > e.Cost {
		return ErrMalformed
	}
	return nil
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

// EncodedLen is the number of bytes Append writes for e, or 0 if
// Append would reject e.
func EncodedLen(e *Event) int {
	if e.Check() != nil {
		return 0
	}
	n := headLen + uvarintLen(uint64(e.Edge)) + uvarintLen(uint64(e.Cost)) + uvarintLen(uint64(e.Limit)) +
		uvarintLen(uint64(e.WindowMillis)) + uvarintLen(uint64(e.Burst)) + 1 + len(e.Rule) + 1 + len(e.Pop) + 1
	if e.Delayed {
		n += uvarintLen(uint64(e.DelayMicros))
	}
	if e.Counting {
		n += uvarintLen(uint64(e.Counted)) + uvarintLen(uint64(e.SettleMicros))
	}
	return n
}

// Append appends the version 4 encoding of e to dst and returns the
// extended buffer. It allocates only if dst lacks the capacity
// (EncodedLen(e) or MaxLen bytes are always enough). It returns dst
// unchanged with ErrRuleTooLong if e.Rule is longer than MaxRuleLen bytes
// or e.Pop longer than MaxPopLen,
// or with ErrMalformed if e.Decision, e.Mode, e.Action or e.Algorithm is not
// a defined value, e.DelayMicros is set on an event that is not Delayed,
// e.Counted or e.SettleMicros on one that is not Counting, or e.Counted
// exceeds e.Cost.
//
// The encoding is canonical: one event has exactly one encoding, so
// Append(nil, decoded) reproduces the version 4 bytes Decode
// accepted.
func Append(dst []byte, e *Event) ([]byte, error) {
	if err := e.Check(); err != nil {
		return dst, err
	}
	return appendEvent(dst, e), nil
}

// appendEvent is Append for an event that check accepted.
func appendEvent(dst []byte, e *Event) []byte {
	var flags byte
	if e.Decision == Limited {
		flags |= flagLimited
	}
	if e.Mode == policy.Sync {
		flags |= flagSync
	}
	if e.Action == policy.Block {
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
	if e.Delayed {
		flags |= flagDelayed
	}
	if e.Global {
		flags |= flagGlobal
	}
	dst = append(dst, Version, flags, byte(e.Algorithm))
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.BigEndian.AppendUint64(dst, e.KeyHash)
	dst = binary.BigEndian.AppendUint32(dst, math.Float32bits(e.Estimate))
	dst = binary.AppendUvarint(dst, uint64(e.Edge))
	dst = binary.AppendUvarint(dst, uint64(e.Cost))
	dst = binary.AppendUvarint(dst, uint64(e.Limit))
	dst = binary.AppendUvarint(dst, uint64(e.WindowMillis))
	dst = binary.AppendUvarint(dst, uint64(e.Burst))
	if e.Delayed {
		dst = binary.AppendUvarint(dst, uint64(e.DelayMicros))
	}
	dst = append(dst, byte(len(e.Rule)))
	dst = append(dst, e.Rule...)
	dst = append(dst, byte(len(e.Pop)))
	dst = append(dst, e.Pop...)
	if !e.Counting {
		return append(dst, 0)
	}
	dst = append(dst, countCounting)
	dst = binary.AppendUvarint(dst, uint64(e.Counted))
	return binary.AppendUvarint(dst, uint64(e.SettleMicros))
}

// Decode decodes exactly one event of version 4, 3, 2 or 1 from b into e.
// It allocates nothing; e.Rule and e.Pop alias b (capacity-limited, so
// appending to them cannot overwrite b). A version 3 event decodes with
// Counting false, a version 2 event also with an empty Pop and Global
// false, a version 1 event also with Algorithm policy.SlidingWindow and
// Burst = Limit; all re-encode as version 4.
//
// It returns ErrVersion if b does not start with one of these versions,
// ErrTruncated if b ends inside the event, ErrTrailing if bytes follow it,
// and ErrMalformed if a field is outside its domain (see ErrMalformed). The
// version is checked before the length, so a future version is reported as
// such even when it is shorter than this one. On error e is left unchanged.
// Decode never panics, whatever b holds.
func Decode(b []byte, e *Event) error {
	if len(b) == 0 {
		return ErrTruncated
	}
	switch b[0] {
	case Version, VersionV3, VersionV2, VersionV1:
		return decodeEvent(b, e, b[0])
	}
	return ErrVersion
}

// decodeEvent decodes b, whose version byte, version, has been checked.
func decodeEvent(b []byte, e *Event, version byte) error {
	v2 := version >= VersionV2
	minLen, reserved := minEventLenV1, byte(flagsReservedV1)
	switch version {
	case Version:
		minLen, reserved = minEventLen+2, 0
	case VersionV3:
		minLen, reserved = minEventLen+1, 0
	case VersionV2:
		minLen, reserved = minEventLen, flagsReservedV2
	}
	if len(b) < minLen {
		return ErrTruncated
	}
	flags := b[1]
	if flags&reserved != 0 {
		return ErrMalformed
	}
	off := 2
	var ev Event
	if v2 {
		if b[2] > byte(policy.SlidingLog) {
			return ErrMalformed
		}
		ev.Algorithm = policy.Algorithm(b[2])
		off = 3
	}
	ev.Time = int64(binary.BigEndian.Uint64(b[off:]))
	ev.KeyHash = binary.BigEndian.Uint64(b[off+8:])
	ev.Estimate = math.Float32frombits(binary.BigEndian.Uint32(b[off+16:]))
	off += 20
	ev.FromBlockCache = flags&flagFromBlockCache != 0
	ev.Shadow = flags&flagShadow != 0
	ev.Fallback = flags&flagFallback != 0
	ev.Delayed = flags&flagDelayed != 0
	ev.Global = flags&flagGlobal != 0
	if flags&flagLimited != 0 {
		ev.Decision = Limited
	}
	if flags&flagSync != 0 {
		ev.Mode = policy.Sync
	}
	if flags&flagBlock != 0 {
		ev.Action = policy.Block
	}
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
	ev.Burst = ev.Limit
	if v2 {
		if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
			return err
		}
		ev.Burst, off = uint32(v), off+n
		if ev.Delayed {
			if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
				return err
			}
			ev.DelayMicros, off = uint32(v), off+n
		}
	}
	if off >= len(b) {
		return ErrTruncated
	}
	ruleLen := int(b[off])
	off++
	if len(b)-off < ruleLen {
		return ErrTruncated
	}
	ev.Rule = b[off : off+ruleLen : off+ruleLen]
	off += ruleLen
	if version >= VersionV3 {
		if off >= len(b) {
			return ErrTruncated
		}
		popLen := int(b[off])
		off++
		if popLen > MaxPopLen {
			return ErrMalformed
		}
		if len(b)-off < popLen {
			return ErrTruncated
		}
		ev.Pop = b[off : off+popLen : off+popLen]
		off += popLen
	}
	if version == Version {
		if off >= len(b) {
			return ErrTruncated
		}
		count := b[off]
		off++
		if count&countReservedFlags != 0 {
			return ErrMalformed
		}
		if count&countCounting != 0 {
			ev.Counting = true
			if v, n, err = uvarint(b[off:], uint64(ev.Cost)); err != nil {
				return err
			}
			ev.Counted, off = uint32(v), off+n
			if v, n, err = uvarint(b[off:], math.MaxUint32); err != nil {
				return err
			}
			ev.SettleMicros, off = uint32(v), off+n
		}
	}
	if off != len(b) {
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
