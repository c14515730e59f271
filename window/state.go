package window

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// StateKind names a shared algorithm state that edges update by one atomic
// read-modify-write in the store, where the counters of Store do not
// suffice.
type StateKind uint8

const (
	// StateGCRA is a token or leaky bucket as GCRA: one theoretical
	// arrival time per key (LeakyBucketState).
	StateGCRA StateKind = iota + 1
	// StateLog is a sliding log: the instants of the units in the window.
	StateLog
)

// MaxSharedLogLimit is the largest limit of a shared sliding log: the log
// holds one instant per unit in the window, read and written whole by every
// decision, so it is for exactness-first rules with small limits (logins,
// password resets). Larger limits take sliding_window, whose state is two
// counters whatever the limit.
const MaxSharedLogLimit = 1000

// maxLogUnits bounds the units a shared log holds in its window, attempts
// logged unconditionally (a blocking rule's) included.
const maxLogUnits = 2 * MaxSharedLogLimit

// ErrBadState is wrapped by the error of a StateOp whose stored value does
// not decode as the state of its kind.
var ErrBadState = errors.New("window: stored state does not decode")

// StateOp is one atomic read-modify-write of a key's shared state in a
// StateStore.
//
// With Conditional set it is the decision of a sync rule: the N units are
// taken (poured into the bucket, logged) only if they fit, and Allowed says
// whether they did. Without it the N units are taken whatever the state:
// units an edge already admitted, sent by its flusher, or the attempts of a
// blocking rule; the bucket may then go over its capacity and refuse until
// it has drained. N ≤ 0 reads the state and changes nothing.
type StateOp struct {
	Kind   StateKind
	Key    uint64      // hash of rule and client key, as Op.Key
	Bucket LeakyBucket // StateGCRA: the bucket (a token bucket's Burst is its Capacity)
	Log    SlidingLog  // StateLog: the log; Limit at most MaxSharedLogLimit
	Now    int64       // Unix ns, the caller's clock
	N      int64       // units; ≤ 0 reads

	Conditional bool

	// Set by the store.
	Allowed   bool  // the units were taken (always, unconditional)
	Remaining int64 // whole units of room left at Now after the op
	ReleaseAt int64 // as LeakyBucket.Release / SlidingLog.Release after the op: Now when N more fit
	TAT, Frac int64 // StateGCRA: the bucket's state after the op
	Err       error // nil, or why the op failed (the state is unknown)
}

// StateStore is the part of Store that holds the shared states of token
// buckets, leaky buckets and sliding logs: memcached through
// compare-and-swap, Redis through scripts, MemStore in one process.
//
// DoState performs every op atomically per op and sets its outputs. Ops fail
// independently. A sliding log's instants never go back: an op whose Now
// is before the latest unit logged runs at that instant (a clock behind
// sees the log fuller, never emptier). A log holds at most twice
// MaxSharedLogLimit units in its window; attempts logged past that are
// dropped. Like Store.Do it returns when every op has finished or ctx
// is done, bounds each op by its own timeout as well, and keeps no reference
// to ops. Ops on one key take effect in the order given.
type StateStore interface {
	DoState(ctx context.Context, ops []StateOp)
}

// Validate reports why op cannot run.
func (op *StateOp) Validate() error {
	switch op.Kind {
	case StateGCRA:
		return op.Bucket.Validate()
	case StateLog:
		if err := op.Log.Validate(); err != nil {
			return err
		}
		if op.Log.Limit > MaxSharedLogLimit {
			return fmt.Errorf("window: SlidingLog.Limit %d: a shared sliding log takes at most %d per window; use sliding_window for large limits", op.Log.Limit, MaxSharedLogLimit)
		}
		return nil
	default:
		return fmt.Errorf("window: StateOp.Kind %d: unknown", op.Kind)
	}
}

// Apply runs op over the state stored as old (nil or empty: none) and sets
// op's outputs, as a store that keeps values and compare-and-swaps them
// (memcached) does: it returns the new value, appended to dst[:0], the TTL
// to store it with, and write = false when the state did not change (a
// refused conditional op, a read), so no write is needed. A value that does
// not decode fails the op with ErrBadState and is not replaced. Apply does
// not set op.Err on success and allocates only through dst and, for a log,
// a ring for its entries.
func (op *StateOp) Apply(old, dst []byte) (val []byte, ttl time.Duration, write bool, err error) {
	if err := op.Validate(); err != nil {
		return dst[:0], 0, false, err
	}
	switch op.Kind {
	case StateGCRA:
		return op.applyGCRA(old, dst)
	default:
		return op.applyLog(old, dst)
	}
}

const (
	gcraTag = 'G'
	logTag  = 'L'
)

func (op *StateOp) applyGCRA(old, dst []byte) ([]byte, time.Duration, bool, error) {
	var s LeakyBucketState
	if len(old) > 0 {
		if len(old) != 17 || old[0] != gcraTag {
			return dst[:0], 0, false, fmt.Errorf("%w: %d bytes, not a bucket", ErrBadState, len(old))
		}
		s.TAT = int64(binary.LittleEndian.Uint64(old[1:]))
		s.Frac = int64(binary.LittleEndian.Uint64(old[9:]))
		if s.Frac < 0 || s.Frac >= op.Bucket.Rate {
			// The rule's rate changed, or the value is not ours: keep
			// the instant, drop the fraction (less than 1 ns).
			s.Frac = 0
		}
	}
	before := s
	lb := op.Bucket
	if op.Conditional || op.N <= 0 {
		op.Allowed, op.Remaining, op.ReleaseAt = lb.Allow(&s, op.Now, op.N)
	} else {
		lb.pour(&s, op.Now, op.N)
		op.Allowed = true
		op.Remaining = lb.Remaining(s, op.Now)
		op.ReleaseAt = lb.Release(s, op.Now, op.N)
	}
	op.TAT, op.Frac = s.TAT, s.Frac
	if s == before {
		return dst[:0], 0, false, nil
	}
	dst = append(dst[:0], gcraTag)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.TAT))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.Frac))
	// Kept until the bucket is empty again, and a second more: after that
	// a missing value is the same empty bucket.
	return dst, time.Duration(max(s.TAT-op.Now, 0)) + time.Second, true, nil
}

// pour adds n > 0 units to the bucket at now whatever its level.
func (lb LeakyBucket) pour(s *LeakyBucketState, now, n int64) {
	tat, frac := s.TAT, s.Frac
	if lb.level(*s, now) == 0 {
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

func (op *StateOp) applyLog(old, dst []byte) ([]byte, time.Duration, bool, error) {
	var s SlidingLogState
	if len(old) > 0 {
		if err := decodeLog(&s, old); err != nil {
			return dst[:0], 0, false, err
		}
	}
	l := op.Log
	added := s.added
	if op.Conditional || op.N <= 0 {
		op.Allowed, op.Remaining, op.ReleaseAt = l.Allow(&s, op.Now, op.N)
	} else {
		// Attempts past maxLogUnits in the window are not logged: the
		// key is refused until they leave it anyway, and the value
		// stays bounded.
		l.Add(&s, op.Now, min(op.N, maxLogUnits-l.Count(&s, op.Now)))
		op.Allowed = true
		op.Remaining = l.Remaining(&s, op.Now)
		op.ReleaseAt = l.Release(&s, op.Now, op.N)
	}
	if s.added == added {
		return dst[:0], 0, false, nil
	}
	return encodeLog(dst[:0], &s), l.Window + time.Second, true, nil
}

// encodeLog appends the log's entries in the window: a tag, the latest
// instant seen, the number of entries, then each entry's instant (as the
// difference from the previous, the first from 0) and units, as uvarints.
// Expired entries were dropped by the op that ran before.
func encodeLog(dst []byte, s *SlidingLogState) []byte {
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

func decodeLog(s *SlidingLogState, b []byte) error {
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
	if !ok1 || !ok2 || latest > math.MaxInt64 || size > maxLogUnits {
		return bad("bad header")
	}
	s.latest, s.seen = int64(latest), true
	var at int64
	for range size {
		d, ok1 := next()
		n, ok2 := next()
		if !ok1 || !ok2 || n == 0 || n > maxLogUnits || d > uint64(math.MaxInt64-at) || (at+int64(d)) > s.latest {
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

// memState is one MemStore value.
type memState struct {
	value   []byte
	expires int64 // Unix ns
}

// stateMem holds MemStore's shared states.
type stateMem struct {
	mu sync.Mutex
	m  map[uint64]memState
}

// DoState performs ops on states held in memory, through StateOp.Apply
// as a value store does; it fails only an op whose own arguments are
// invalid.
func (s *MemStore) DoState(_ context.Context, ops []StateOp) {
	now := s.clock.Now().UnixNano()
	st := &s.states
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		st.m = make(map[uint64]memState)
	}
	for i := range ops {
		op := &ops[i]
		k := op.Key ^ uint64(op.Kind)<<62 // a key's bucket and log apart
		cur, ok := st.m[k]
		if ok && cur.expires <= now {
			cur, ok = memState{}, false
		}
		val, ttl, write, err := op.Apply(cur.value, nil)
		op.Err = err
		if err != nil || !write {
			continue
		}
		st.m[k] = memState{value: val, expires: now + int64(ttl)}
	}
	if len(st.m) > 1024 && len(st.m)%1024 == 0 {
		for k, v := range st.m {
			if v.expires <= now {
				delete(st.m, k)
			}
		}
	}
}
