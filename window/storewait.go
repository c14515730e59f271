package window

import (
	"context"
	"time"
)

// step is what one look at a key's view under its shard's lock came to.
// A strategy writes its decision into the Decision it is given, field by
// field, and asks for a wait through the decision's waits.
type step uint8

const (
	stepDecided  step = iota // decided on the view
	stepFellBack             // decided on a view the store could not refresh
	stepWait                 // wait for the store's reply (waits.ask), then look again
	stepSync                 // decide by one store round trip: the others could fill the room (sync.go)
)

// waits is what an async decision has spent waiting for the store, and
// the wait its last step asked for.
type waits struct {
	may      bool      // another wait is allowed
	near     bool      // a counter near its limit may be decided by a round trip (not Config.AsyncNearLimit)
	deadline time.Time // when every wait of the decision ends; zero: none yet

	// The wait asked for. again lets a decision wait again after a reply
	// that still leaves it waiting, until its deadline; without it a
	// decision waits once.
	again  bool
	poke   bool          // wake the flusher at once for the reply
	budget time.Duration // the decision's waits in all, taken from the first
	seq    uint32        // state views: the reply awaited follows reply seq
}

func (w *waits) waited() bool { return !w.deadline.IsZero() }

// ask records the wait a step asks for.
func (w *waits) ask(again, poke bool, budget time.Duration, seq uint32) {
	w.again, w.poke, w.budget, w.seq = again, poke, budget, seq
}

// waitForStore makes the wait w asks for and returns the time to decide
// at after it: the limiter clock's, if later than t, so that decisions
// keep the order of their times. The wait ends with the reply, the
// decision's deadline, its context or the limiter's close; only a reply
// lets a decision that may wait again do so.
func (l *Limiter) waitForStore(ctx context.Context, w *waits, t int64, key uint64, counter bool) int64 {
	if w.poke {
		select {
		case l.poke <- struct{}{}:
		default: // a flush is already due
		}
	}
	now := time.Now()
	if w.deadline.IsZero() {
		w.deadline = now.Add(w.budget)
	}
	replied := l.await(ctx, w.deadline.Sub(now), key, counter, w.seq)
	w.may = w.again && replied && time.Now().Before(w.deadline)
	return max(t, l.cfg.Clock.Now().UnixNano())
}

// wake tells the requests waiting for a read that a flush batch has been
// applied.
func (l *Limiter) wake() {
	if l.waiting.Load() == 0 {
		return // a waiter counts itself before it takes the channel
	}
	ch := make(chan struct{})
	close(*l.flushed.Swap(&ch))
}

// await waits, at most wait, while key's view still waits for the store
// (awaiting, under the shard's lock), and reports whether that ended: the
// reply came, the key's store operations failed, or its view is gone.
func (l *Limiter) await(ctx context.Context, wait time.Duration, key uint64, counter bool, seq uint32) (replied bool) {
	tm, _ := l.timers.Get().(*time.Timer)
	if tm == nil {
		tm = time.NewTimer(wait)
	} else {
		tm.Reset(wait)
	}
	l.waiting.Add(1)
	defer func() { l.waiting.Add(-1); tm.Stop(); l.timers.Put(tm) }()
	s := l.shardOf(key)
	for {
		ch := *l.flushed.Load() // before looking, so no wake-up is missed
		s.mu.Lock()
		c := s.awaiting(key, counter, seq)
		s.mu.Unlock()
		if !c {
			l.m.newKeyRead.Inc()
			return true
		}
		select {
		case <-ch:
		case <-tm.C:
			l.m.newKeyTimeout.Inc()
			return false
		case <-ctx.Done():
			l.m.newKeyTimeout.Inc()
			return false
		case <-l.done:
			return false
		}
	}
}

// awaiting reports whether key's view still waits for the store: a
// counter's for the read of its current window, a state's for the reply
// after reply seq. s.mu must be held.
func (s *shard) awaiting(key uint64, counter bool, seq uint32) bool {
	if counter {
		e := s.lookup(key)
		return e != nil && e.flags&(flagNeedCurr|flagFailed) == flagNeedCurr
	}
	v := s.views[key]
	return v != nil && v.seq == seq && v.flags&bvFailed == 0
}
