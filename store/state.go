package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/poplimit/poplimit/algo"
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
	Key    uint64           // hash of rule and client key, as Op.Key
	Bucket algo.LeakyBucket // StateGCRA: the bucket (a token bucket's Burst is its Capacity)
	Log    algo.SlidingLog  // StateLog: the log; Limit at most algo.MaxSharedLogLimit
	Now    int64            // Unix ns, the caller's clock
	N      int64            // units; ≤ 0 reads

	Conditional bool
	// GiveBack takes N units back instead of taking them, for a request
	// whose response did not count: for StateGCRA units an earlier pour
	// left the TAT at Mark with (algo.LeakyBucket.GiveBack: what of them
	// has not leaked by Now), for StateLog units logged at the instant
	// Mark (algo.SlidingLog.GiveBack). Allowed is true; a log's ReleaseAt
	// is then Now.
	GiveBack bool
	Mark     int64

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
// algo.MaxSharedLogLimit units in its window; attempts logged past that are
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
		if op.Log.Limit > algo.MaxSharedLogLimit {
			return fmt.Errorf("store: SlidingLog.Limit %d: a shared sliding log takes at most %d per window; use sliding_window for large limits", op.Log.Limit, algo.MaxSharedLogLimit)
		}
		return nil
	default:
		return fmt.Errorf("store: StateOp.Kind %d: unknown", op.Kind)
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

func (op *StateOp) applyGCRA(old, dst []byte) ([]byte, time.Duration, bool, error) {
	var s algo.LeakyBucketState
	if len(old) > 0 {
		if err := algo.DecodeGCRA(&s, old); err != nil {
			return dst[:0], 0, false, err
		}
		if s.Frac < 0 || s.Frac >= op.Bucket.Rate {
			// The rule's rate changed, or the value is not ours: keep
			// the instant, drop the fraction (less than 1 ns).
			s.Frac = 0
		}
	}
	before := s
	lb := op.Bucket
	if op.GiveBack {
		lb.GiveBack(&s, op.Now, op.Mark, op.N)
		op.Allowed = true
		op.Remaining = lb.Remaining(s, op.Now)
		op.ReleaseAt = lb.Release(s, op.Now, 1)
	} else if op.Conditional || op.N <= 0 {
		op.Allowed, op.Remaining, op.ReleaseAt = lb.Allow(&s, op.Now, op.N)
	} else {
		lb.Pour(&s, op.Now, op.N)
		op.Allowed = true
		op.Remaining = lb.Remaining(s, op.Now)
		op.ReleaseAt = lb.Release(s, op.Now, op.N)
	}
	op.TAT, op.Frac = s.TAT, s.Frac
	if s == before {
		return dst[:0], 0, false, nil
	}
	dst = algo.AppendGCRA(dst[:0], s)
	// Kept until the bucket is empty again, and a second more: after that
	// a missing value is the same empty bucket.
	return dst, time.Duration(max(s.TAT-op.Now, 0)) + time.Second, true, nil
}

func (op *StateOp) applyLog(old, dst []byte) ([]byte, time.Duration, bool, error) {
	var s algo.SlidingLogState
	if len(old) > 0 {
		if err := algo.DecodeLog(&s, old); err != nil {
			return dst[:0], 0, false, err
		}
	}
	l := op.Log
	added := s.Added()
	if op.GiveBack {
		l.GiveBack(&s, op.Now, op.Mark, op.N)
		op.Allowed = true
		op.Remaining = l.Remaining(&s, op.Now)
		op.ReleaseAt = l.Release(&s, op.Now, 0)
	} else if op.Conditional || op.N <= 0 {
		op.Allowed, op.Remaining, op.ReleaseAt = l.Allow(&s, op.Now, op.N)
	} else {
		// Attempts past algo.MaxLogUnits in the window are not logged: the
		// key is refused until they leave it anyway, and the value
		// stays bounded.
		l.Add(&s, op.Now, min(op.N, algo.MaxLogUnits-l.Count(&s, op.Now)))
		op.Allowed = true
		op.Remaining = l.Remaining(&s, op.Now)
		op.ReleaseAt = l.Release(&s, op.Now, op.N)
	}
	if s.Added() == added {
		return dst[:0], 0, false, nil
	}
	return algo.AppendLog(dst[:0], &s), l.Window + time.Second, true, nil
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
