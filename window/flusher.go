package window

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/store"
)

// maxFlushBackoff bounds how long the flusher waits between attempts while
// every operation of its flushes fails.
const maxFlushBackoff = time.Second

// Start runs the background flusher until Close. It flushes every
// FlushInterval, at the limiter clock's time. While a store is down (every
// operation of a flush failed) it backs off, doubling the wait up to one
// second, so a dead store does not make every edge spin on retries; pending
// increments wait meanwhile and go out with the first flush that succeeds.
// A request waiting for a new key's shared count (NewKeyWait) wakes it for
// a flush at once.
func (l *Limiter) Start() {
	l.started.Store(true)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		t := time.NewTicker(l.cfg.FlushInterval)
		defer t.Stop()
		var backoff time.Duration
		var next time.Time
		woke := false // from a park: flush at once
		for {
			if !woke {
				select {
				case <-l.done:
					return
				case <-l.poke: // a request waits for a new key's read
				case <-t.C:
				}
			}
			woke = false
			now := time.Now()
			if now.Before(next) {
				continue // the store is down: waiting requests time out
			}
			st := l.Flush(context.Background(), l.cfg.Clock.Now())
			if st.Ops > 0 && st.Failed == st.Ops {
				backoff = min(max(2*backoff, l.cfg.FlushInterval), maxFlushBackoff)
				next = now.Add(backoff)
				l.m.flushBackoffs.Inc()
				l.down.Store(true)
			} else {
				backoff, next = 0, time.Time{}
				l.down.Store(false)
			}
			if st.Ops == 0 {
				var closed bool
				if woke, closed = l.parkFlusher(t); closed {
					return
				}
			}
		}
	}()
}

// flusherPark lets the flusher sleep while there is nothing to flush, so
// an idle limiter does not wake every FlushInterval: the first entry
// queued afterwards wakes it.
type flusherPark struct {
	parked atomic.Bool
	poke   chan struct{}
}

// wake wakes the flusher if it is parked. The shard's lock is held, which
// orders the queue's growth before the flusher's last look at it.
func (p *flusherPark) wake() {
	if p.parked.Load() {
		select {
		case p.poke <- struct{}{}:
		default:
		}
	}
}

// parkFlusher parks the flusher while every queue is empty, stopping its
// ticker meanwhile, and reports whether it parked and was woken (the
// flusher then flushes at once) or the limiter was closed. A flush
// that sent nothing calls it; entries waiting for their grace, failed
// increments and reads due stay queued, so a limiter with anything left
// to do never parks. Idle entries are not swept while it is parked: the
// table is bounded by MaxKeys, and the sweep goes on with the traffic.
func (l *Limiter) parkFlusher(t *time.Ticker) (woke, closed bool) {
	l.park.parked.Store(true)
	defer l.park.parked.Store(false)
	// A poke left from while the flusher ran is stale: whoever poked had
	// queued its key first, which the look below finds. Drained, it
	// cannot wake the park at once for nothing.
	select {
	case <-l.poke:
	default:
	}
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		busy := len(s.queue) > 0 || len(s.vqueue) > 0 || len(s.lazy) > 0
		s.mu.Unlock()
		if busy {
			return false, false
		}
	}
	t.Stop()
	defer t.Reset(l.cfg.FlushInterval)
	l.m.flusherParks.Inc()
	select {
	case <-l.done:
		return false, true
	case <-l.poke:
		return true, false
	}
}

// Close stops the flusher and flushes what is pending one last time, within
// ctx. It returns the error of that last flush, if any ops failed.
func (l *Limiter) Close(ctx context.Context) error {
	var err error
	l.close.Do(func() {
		close(l.done)
		l.wg.Wait()
		l.closing.Store(true)
		if n := l.Flush(ctx, l.cfg.Clock.Now()); n.Failed > 0 {
			err = fmt.Errorf("window: close: %d of %d flush ops failed", n.Failed, n.Ops)
		}
	})
	return err
}

// FlushStats counts what one Flush sent.
type FlushStats struct {
	Keys   int // keys whose increments were sent
	Ops    int // store operations: increments, and reads (one per key)
	Failed int // operations that failed
}

// Flush sends every key's coalesced increments as one increment per key and
// window, reads the previous window of keys whose grace has passed (and the
// current window of keys new here), and folds the replies into the local
// view. The flusher calls it every FlushInterval; tests call it directly
// with simulated time. It may run concurrently with decisions but not with
// itself.
//
// The ops go to the store in batches of at most MaxFlushOps (a key's ops
// are never split), one batch after the other, so the memory a flush holds
// is bounded by the batch and not by the number of keys queued: a flood of
// new keys that outruns the flusher makes flushes longer, not larger.
func (l *Limiter) Flush(ctx context.Context, now time.Time) FlushStats {
	t := now.UnixNano()
	split := !l.store.Whole()
	if split && !l.split.Load() {
		l.splitEnded.Store(l.splitAt.Load())
		l.splitFrom.Store(t)
	}
	l.split.Store(split)
	if split {
		l.splitAt.Store(t)
	}
	opsp := l.ops.Get().(*[]store.Op)
	ops := (*opsp)[:0]
	var st FlushStats
	budget := l.cfg.MaxFlushOps
	for i := range l.shards {
		s := &l.shards[i]
		due := t
		if l.closing.Load() {
			due = lazyAll // a last flush sends every unit
		}
		q := s.take(due)
		for k := 0; ; {
			k, ops = s.collect(l, t, q, k, ops, budget, &st)
			if len(ops) >= budget {
				ops = l.send(ctx, t, ops, &st)
			}
			if k == len(q) {
				break
			}
		}
	}
	if len(ops) > 0 {
		ops = l.send(ctx, t, ops, &st)
	}
	*opsp = ops
	l.ops.Put(opsp)
	l.flushStates(ctx, t, &st)
	return st
}

// send performs one batch of a flush and folds its replies into the local
// view; it returns ops emptied for the next batch.
func (l *Limiter) send(ctx context.Context, t int64, ops []store.Op, st *FlushStats) []store.Op {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	begin := time.Now()
	l.store.Do(ctx, ops)
	l.m.flushSeconds.Observe(time.Since(begin).Seconds())
	cancel()
	// Ops are grouped by shard in collect's order.
	failed := 0
	for i := 0; i < len(ops); {
		s := l.shardOf(ops[i].Key)
		j := i
		for j < len(ops) && l.shardOf(ops[j].Key) == s {
			j++
		}
		failed += s.apply(l, t, ops[i:j])
		i = j
	}
	l.wake()
	st.Ops += len(ops)
	st.Failed += failed
	l.m.flushOps.Observe(float64(len(ops)))
	l.m.storeOps.Add(float64(len(ops)))
	l.m.storeErrors.Add(float64(failed))
	clear(ops) // drop error values
	return ops[:0]
}
