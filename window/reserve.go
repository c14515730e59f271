package window

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// Reservations and give-backs: what a caller that waits its turn needs
// beyond Decide (package decision's Wait and Reserve).
//
// A future reservation takes units now for use at a later instant, as
// golang.org/x/time/rate's Reserve does within one process. Across a
// shared store only a token or leaky bucket can hold one: its state is one
// theoretical arrival time (TAT), and moving it later by the units' time,
// atomically in the store, is exactly a reservation, which every process
// sharing the bucket then sees. A window counter counts units in the
// window that holds the instant they are counted at: units counted now for
// use in a later window would weigh there as the previous window's,
// decaying, while they are in fact used then, and others would be admitted
// early. A sliding log holds instants that never go back, so an entry
// logged in the future would hold every later operation at it. Those
// algorithms take units only when they conform at once.

// Reservation is the Limiter's answer to Reserve.
type Reservation struct {
	// OK: the units are taken in the store, to be used from At on.
	OK bool
	// At, Unix ns, when OK: the instant from which the units conform (not
	// before the now asked at). When not OK: the instant from which a
	// reservation of the same units within the same delay would be taken
	// if nothing else arrived; 0 when none ever would (cost above the
	// bucket's capacity, or above what the delay allows).
	At int64
	// Remaining is the bucket's whole units of room at now after the call.
	Remaining uint64
}

// ErrNotReservable is returned by Reserve for a policy whose algorithm
// cannot hold a future reservation in a shared store (see Reservation).
var ErrNotReservable = errors.New("window: only token and leaky buckets (throttle or delay) hold a reservation for later")

// Reserve takes cost units of key under r, with the given limit, in the
// store, to be used at the earliest instant they conform, if that is no
// later than now + maxDelay; otherwise it takes nothing and says when it
// could. It is for token and leaky buckets of action throttle or delay,
// whatever their mode: the store moves the bucket's theoretical arrival
// time later atomically, and every process sharing the bucket sees it at
// once (in sync mode) or at its next reply (in async mode, as an edge sees
// another's units). For a throttle the units conform when the bucket,
// leaking, has room for them; for a delay rule (a queue) when the
// requests before them have left, within the queue's own bound.
//
// A reserved unit is not admitted early: the bucket counts it from now,
// and refuses other requests until the reserved units have leaked as the
// rule's burst allows. The error is ErrNotReservable for other policies,
// or the store's (the bucket is unknown; nothing is taken).
func (l *Limiter) Reserve(ctx context.Context, now time.Time, r *Policy, key, limit, cost uint64, maxDelay time.Duration) (Reservation, error) {
	if r.Algorithm.IsCounter() || r.Algorithm == policy.SlidingLog || r.Action == policy.Block {
		return Reservation{}, ErrNotReservable
	}
	t := now.UnixNano()
	lb := bucketOf(r, limit)
	n := int64(min(cost, math.MaxInt64))
	if err := lb.Validate(); err != nil {
		return Reservation{}, err
	}
	if n > lb.Capacity {
		return Reservation{}, nil // never
	}
	if n <= 0 {
		return Reservation{OK: true, At: t, Remaining: uint64(lb.Capacity)}, nil
	}
	// The op's bucket admits exactly the reservations within maxDelay: a
	// throttle's level may exceed the capacity by what leaks in maxDelay
	// (the units conform once it has); a queue's units may wait for at
	// most that much before them, and its own capacity bounds it too.
	k := leakedIn(lb, max(maxDelay, 0))
	take := lb
	if r.Action == policy.Delay {
		take.Capacity = n + min(lb.Capacity-n, k)
	} else {
		take.Capacity = lb.Capacity + k
	}
	mu := &l.syncMu[key%syncStripes]
	mu.Lock()
	ops := [1]store.StateOp{{Kind: store.StateGCRA, Key: key, Bucket: take, Now: t, N: n, Conditional: true}}
	cctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	l.store.DoState(cctx, ops[:])
	cancel()
	mu.Unlock()
	l.m.storeOps.Inc()
	op := &ops[0]
	if op.Err != nil {
		l.m.storeErrors.Inc()
		return Reservation{}, fmt.Errorf("window: reserve: %w", op.Err)
	}
	if op.Allowed && r.Mode == policy.Async {
		// This edge's view learns of the reserved units at once (its
		// next reply, which shows them, replaces the view), so that
		// its own decisions do not spend them meanwhile.
		s := l.shardOf(key)
		s.mu.Lock()
		v, _ := s.viewGet(l, key, t, r, lb)
		v.lb.Pour(&v.view, t, n)
		if v.flags&bvKnown == 0 {
			s.enqueueView(key, v) // read what the others took
		}
		s.mu.Unlock()
	}
	after := algo.LeakyBucketState{TAT: op.TAT, Frac: op.Frac}
	res := Reservation{OK: op.Allowed, Remaining: uint64(lb.Remaining(after, t))}
	switch {
	case !op.Allowed && op.ReleaseAt == math.MaxInt64:
		res.At = 0
	case !op.Allowed:
		res.At = op.ReleaseAt
	case r.Action == policy.Delay:
		// When the units before these have left: the state before them.
		res.At = max(t, lb.DrainedTo(after, n))
	default:
		// When the level, these units in, is within the capacity.
		res.At = max(t, lb.DrainedTo(after, lb.Capacity))
	}
	return res, nil
}

// leakedIn returns the whole units lb leaks in d, bounded so that a bucket
// of lb.Capacity more still validates (its level fits int64 and drains
// within algo.MaxDrain).
func leakedIn(lb algo.LeakyBucket, d time.Duration) int64 {
	d = min(d, algo.MaxDrain/2)
	hi, lo := bits.Mul64(uint64(d), uint64(lb.Rate))
	var k uint64
	if hi >= uint64(lb.Per) {
		k = math.MaxInt64
	} else {
		k, _ = bits.Div64(hi, lo, uint64(lb.Per))
	}
	// (Capacity + k) × Per + Rate must fit in an int64, and drain within
	// algo.MaxDrain: Capacity + k ≤ algo.MaxDrain/2 × Rate / Per is within it.
	bound := (math.MaxInt64-lb.Rate)/int64(lb.Per) - lb.Capacity
	hi, lo = bits.Mul64(uint64(algo.MaxDrain/2), uint64(lb.Rate))
	if hi < uint64(lb.Per) {
		q, _ := bits.Div64(hi, lo, uint64(lb.Per))
		bound = min(bound, int64(min(q, math.MaxInt64))-lb.Capacity)
	}
	return max(0, min(int64(min(k, math.MaxInt64)), bound))
}

// GiveBack takes cost units back from key's count under r: units a
// counter (sliding or fixed window) took at at (Unix ns) for a request
// that did not go. Units this edge has not sent yet are taken out of its
// own count; units already in the store are taken off the counter of
// at's window (clamped at zero), which every edge reads at its next reply.
// This edge's own view keeps counting them until then, which can only
// refuse more. Other algorithms cannot give units back (a bucket's store
// operations only pour, a log's only log): ErrNotReservable.
func (l *Limiter) GiveBack(ctx context.Context, r *Policy, key, cost uint64, at int64) error {
	if !r.Algorithm.IsCounter() {
		return ErrNotReservable
	}
	if cost == 0 || l.takeBackUnsent(r, key, cost, at) {
		return nil
	}
	start := algo.WindowStart(at, int64(r.Window))
	ops := [1]store.Op{{Key: key, Start: start / 1e6, Delta: -int64(min(cost, math.MaxInt64))}}
	cctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	l.store.Do(cctx, ops[:])
	cancel()
	l.m.storeOps.Inc()
	if err := ops[0].Err; err != nil {
		l.m.storeErrors.Inc()
		return fmt.Errorf("window: give back: %w", err)
	}
	return nil
}

// takeBackUnsent takes cost units counted at at out of this edge's unsent
// units of key, when it holds that many in at's window, and reports
// whether it did.
func (l *Limiter) takeBackUnsent(r *Policy, key, cost uint64, at int64) bool {
	start := algo.WindowStart(at, int64(r.Window))
	s := l.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.lookup(key); e != nil && e.start == start && uint64(e.pend) >= cost {
		e.pend -= uint32(cost)
		e.own -= uint16(min(uint64(e.own), cost))
		return true
	}
	return false
}
