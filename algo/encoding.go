package algo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The encodings of the algorithms' states, as a store that keeps values
// (memcached, MemStore) holds them: a tag byte, then the state.

// MaxSharedLogLimit is the largest limit of a shared sliding log: the log
// holds one instant per unit in the window, read and written whole by every
// decision, so it is for exactness-first rules with small limits (logins,
// password resets). Larger limits take sliding_window, whose state is two
// counters whatever the limit.
const MaxSharedLogLimit = 1000

// MaxLogUnits bounds the units a shared log holds in its window, attempts
// logged unconditionally (a blocking rule's) included.
const MaxLogUnits = 2 * MaxSharedLogLimit

// ErrBadState is wrapped by the error of a stored state (DecodeGCRA,
// DecodeLog) that does not decode as the state of its kind.
var ErrBadState = errors.New("algo: stored state does not decode")

const (
	gcraTag = 'G'
	logTag  = 'L'
)

// AppendGCRA appends the encoding of a bucket's state: a tag, then TAT and
// Frac as little-endian 64-bit integers.
func AppendGCRA(dst []byte, s LeakyBucketState) []byte {
	dst = append(dst, gcraTag)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.TAT))
	return binary.LittleEndian.AppendUint64(dst, uint64(s.Frac))
}

// DecodeGCRA decodes into s a bucket's state that AppendGCRA encoded; a
// value that is not one fails with ErrBadState.
func DecodeGCRA(s *LeakyBucketState, b []byte) error {
	if len(b) != 17 || b[0] != gcraTag {
		return fmt.Errorf("%w: %d bytes, not a bucket", ErrBadState, len(b))
	}
	s.TAT = int64(binary.LittleEndian.Uint64(b[1:]))
	s.Frac = int64(binary.LittleEndian.Uint64(b[9:]))
	return nil
}

// Added returns the units ever logged in s: it changes exactly when an
// operation logs units.
func (s *SlidingLogState) Added() int64 { return s.added }

// Pour adds n > 0 units to the bucket at now whatever its level.
func (lb LeakyBucket) Pour(s *LeakyBucketState, now, n int64) {
	tat, frac := s.TAT, s.Frac
	if lb.Level(*s, now) == 0 {
		tat, frac = now, 0
	}
	per := int64(lb.Per)
	if n > (math.MaxInt64-frac)/per {
		s.TAT, s.Frac = math.MaxInt64, 0
		return
	}
	total := frac + n*per
	s.TAT, s.Frac = tat+total/lb.Rate, total%lb.Rate
	if s.TAT < tat {
		s.TAT, s.Frac = math.MaxInt64, 0
	}
}

// AppendLog appends the log's entries in the window: a tag, the latest
// instant seen, the number of entries, then each entry's instant (as the
// difference from the previous, the first from 0) and units, as uvarints.
// Expired entries were dropped by the op that ran before.
func AppendLog(dst []byte, s *SlidingLogState) []byte {
	dst = append(dst, logTag)
	dst = binary.AppendUvarint(dst, uint64(s.latest))
	dst = binary.AppendUvarint(dst, uint64(s.size))
	var at, cum int64 = 0, s.dropped
	for i := range s.size {
		e := s.at(i)
		dst = binary.AppendUvarint(dst, uint64(e.at-at))
		dst = binary.AppendUvarint(dst, uint64(e.cum-cum))
		at, cum = e.at, e.cum
	}
	return dst
}

// DecodeLog decodes into s, empty, a log that AppendLog encoded; a value
// that is not one fails with ErrBadState.
func DecodeLog(s *SlidingLogState, b []byte) error {
	bad := func(why string) error { return fmt.Errorf("%w: log: %s", ErrBadState, why) }
	if b[0] != logTag {
		return bad("not a log")
	}
	b = b[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	latest, ok1 := next()
	size, ok2 := next()
	if !ok1 || !ok2 || latest > math.MaxInt64 || size > MaxLogUnits {
		return bad("bad header")
	}
	s.latest, s.seen = int64(latest), true
	var at int64
	for range size {
		d, ok1 := next()
		n, ok2 := next()
		if !ok1 || !ok2 || n == 0 || n > MaxLogUnits || d > uint64(math.MaxInt64-at) || (at+int64(d)) > s.latest {
			return bad("bad entry")
		}
		at += int64(d)
		if s.size > 0 && at <= s.at(s.size-1).at {
			return bad("entries out of order")
		}
		s.push(at, int64(n))
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return nil
}

// GiveBack takes back n > 0 units poured at an earlier instant that left
// the bucket's theoretical arrival time at mark (the whole nanoseconds of
// the state after that pour): what of them has not leaked by now. The
// units are the last ⌊n × Per / Rate⌋ ns before mark (a bucket leaks in
// the order it was filled), so min(that, mark − now) ns are still in it,
// and the TAT moves that much earlier, never before now. This never gives
// back more than the bucket would hold had the units never been poured:
// while any of them is in it, the bucket has not been empty since they
// came, so the later pours stand on them exactly; once they have leaked,
// nothing is given back.
func (lb LeakyBucket) GiveBack(s *LeakyBucketState, now, mark, n int64) {
	if n <= 0 || lb.Rate <= 0 || lb.Per <= 0 || mark <= now {
		return
	}
	per := int64(lb.Per)
	length := int64(math.MaxInt64)
	if n <= math.MaxInt64/per {
		length = n * per / lb.Rate
	}
	g := min(length, mark-now)
	if g <= 0 || s.TAT <= now {
		return
	}
	if s.TAT-g <= now {
		s.TAT, s.Frac = now, 0
		return
	}
	s.TAT -= g
}
