package window

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// Giving back on the response path. A counting rule's response settles
// its units after the request was decided; units that did not count are
// given back before the next request of the key is decided, or a client
// who logs in twice in a row could be refused for a success. The units
// this edge still holds unsent are taken out of its count; those already
// in the store are taken off by one store operation, which must not
// allocate: a context with a deadline does, so the operation is bounded
// by the store's own timeout (every Store bounds each op by one).

var giveBackOps = sync.Pool{New: func() any { return new([1]store.Op) }}

var giveBackStateOps = sync.Pool{New: func() any { return new([1]store.StateOp) }}

// GiveBackNow gives cost units of key under r back as GiveBack does,
// without allocating: a store operation is bounded by the store's own
// timeout instead of the limiter's StoreTimeout. Counters give back the
// units counted at at; a token or leaky bucket (decided in the store)
// what of them has not leaked, given mark, the decision's Answer.Mark
// (algo.LeakyBucket.GiveBack); a sliding log the units it logged at at
// (algo.SlidingLog.GiveBack: none when the store logged them later).
func (l *Limiter) GiveBackNow(r *Policy, key, limit, cost uint64, at, mark int64) error {
	if r.Algorithm.IsBucket() {
		return l.giveBackBucket(r, key, limit, cost, mark)
	}
	if r.Algorithm == policy.SlidingLog {
		return l.giveBackLog(r, key, limit, cost, at)
	}
	if !r.Algorithm.IsCounter() {
		return ErrNotReservable
	}
	if cost == 0 || l.takeBackUnsent(r, key, cost, at) {
		return nil
	}
	ops := giveBackOps.Get().(*[1]store.Op)
	defer giveBackOps.Put(ops)
	ops[0] = store.Op{Key: key, Start: algo.WindowStart(at, int64(r.Window)) / 1e6, Delta: -int64(min(cost, math.MaxInt64))}
	l.store.Do(context.Background(), ops[:])
	l.m.storeOps.Inc()
	if err := ops[0].Err; err != nil {
		l.m.storeErrors.Inc()
		return fmt.Errorf("window: give back: %w", err)
	}
	return nil
}

// giveBackLog takes cost units logged at at back out of key's shared log
// under r, at the limit the decision ran with.
func (l *Limiter) giveBackLog(r *Policy, key, limit, cost uint64, at int64) error {
	if cost == 0 {
		return nil
	}
	return l.giveBackState(store.StateOp{Kind: store.StateLog, Key: key, Log: logOf(r, limit), Mark: at}, cost)
}

// giveBackBucket takes cost units poured at mark back out of key's shared
// bucket under r, at the limit the decision ran with.
func (l *Limiter) giveBackBucket(r *Policy, key, limit, cost uint64, mark int64) error {
	if cost == 0 || mark == 0 {
		return nil
	}
	return l.giveBackState(store.StateOp{Kind: store.StateGCRA, Key: key, Bucket: bucketOf(r, limit), Mark: mark}, cost)
}

// giveBackState sends op, a log's or a bucket's, as the give-back of cost
// units now, through a pooled array so that settling allocates nothing.
func (l *Limiter) giveBackState(op store.StateOp, cost uint64) error {
	op.Now, op.N, op.GiveBack = l.cfg.Clock.Now().UnixNano(), int64(min(cost, math.MaxInt64)), true
	ops := giveBackStateOps.Get().(*[1]store.StateOp)
	defer giveBackStateOps.Put(ops)
	ops[0] = op
	l.store.DoState(context.Background(), ops[:])
	l.m.storeOps.Inc()
	if err := ops[0].Err; err != nil {
		l.m.storeErrors.Inc()
		return fmt.Errorf("window: give back: %w", err)
	}
	return nil
}
