package window

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Sync decisions share store calls, per part of the store. A sync
// decision needs the store's reply before it can answer, so alone it is a
// store call: one round trip, one write and one read on the store's
// connection, per request. Under load many wait at once, and one call can
// carry them all: at most maxSyncCalls store calls of sync decisions are in
// flight per part; a decision that finds them all busy queues, and when a
// call returns, the first queued decision sends every queued decision's
// ops as the next call (group commit). At low load nothing queues and a
// decision is one call; under load a call carries as many decisions as
// arrived during one round trip.
//
// A part is what the store says fails on its own (Store.Parts, Place): a
// memcached shard. A call carries the decisions of one part only, so a
// hung shard holds up its own decisions and no other's.
//
// Each decision still waits at most its own deadline (StoreTimeout, or its
// context's if earlier): the call it is in is bounded by the deadline of
// its oldest member, the one that sends it; a decision whose deadline
// passes while it is queued leaves the queue, and one whose call outlives
// it abandons its outcome to the sender. Ops on one key in one call keep
// their order: the store applies them in the order they were queued.
// Only counter ops (Store.Do) are combined: the sync decisions of a
// bucket or a log take turns per key on an edge (stateSync), so they
// queue per key, not per part, and a call of them would carry about one.

// maxSyncCalls bounds the store calls of sync decisions in flight at once
// per part of the store: one call filling while another is on its way.
// BENCHMARKS.md has the measurements behind the value.
const maxSyncCalls = 2

// A syncCall is one sync decision's store ops on their way.
type syncCall struct {
	ops      [2]store.Op
	n        int
	deadline time.Time
	// wake (capacity 1) tells the waiting decision that its ops have their
	// outcome (true) or that it is to send the next call (false).
	wake  chan bool
	state atomic.Int32
}

const (
	callQueued    int32 = iota // in the queue
	callLead                   // taken off the queue to send the next call; wake holds false
	callInFlight               // in a call being sent
	callDone                   // outcome written; wake holds true
	callAbandoned              // its decision stopped waiting: the sender recycles it
)

// combiner is the queue of sync decisions waiting for a store call.
type combiner struct {
	mu    sync.Mutex
	queue []*syncCall
	busy  int // store calls in flight, and senders designated
	max   int // store calls in flight at most

	send    func(ctx context.Context, ops []store.Op) // the store call
	timeout time.Duration                             // a decision's wait at most (StoreTimeout)
	maxOps  int                                       // ops in one call at most (MaxFlushOps)
	sizes   prometheus.Observer                       // decisions per call
	timers  *sync.Pool                                // *time.Timer, the limiter's

	calls   sync.Pool // *syncCall
	batches sync.Pool // *[]*syncCall, the decisions of one call
	bufs    sync.Pool // *[]Op, the ops of one call
}

func (c *combiner) get() *syncCall {
	sc, _ := c.calls.Get().(*syncCall)
	if sc == nil {
		sc = &syncCall{wake: make(chan bool, 1)}
	}
	sc.state.Store(callQueued)
	return sc
}

func (c *combiner) put(sc *syncCall) {
	clear(sc.ops[:])
	sc.n = 0
	c.calls.Put(sc)
}

// do performs ops (one or two, of one sync decision) on the store, in a
// call shared with the sync decisions queued meanwhile, and writes their
// outcomes into ops. It returns when they have their outcome or the
// decision's deadline has passed (then the ops not answered fail with
// context.DeadlineExceeded).
func (c *combiner) do(ctx context.Context, ops []store.Op) {
	sc := c.get()
	sc.n = copy(sc.ops[:], ops)
	sc.deadline = time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(sc.deadline) {
		sc.deadline = d
	}
	c.mu.Lock()
	if c.busy < c.max {
		c.busy++
		c.mu.Unlock()
		c.lead(ctx, sc)
		copy(ops, sc.ops[:sc.n])
		c.put(sc)
		return
	}
	c.queue = append(c.queue, sc)
	c.mu.Unlock()

	tm, _ := c.timers.Get().(*time.Timer)
	if tm == nil {
		tm = time.NewTimer(time.Until(sc.deadline))
	} else {
		tm.Reset(time.Until(sc.deadline))
	}
	defer func() { tm.Stop(); c.timers.Put(tm) }()
	select {
	case done := <-sc.wake:
		if !done {
			// This decision sends the next call: the queue's oldest, its
			// deadline the earliest.
			c.lead(ctx, sc)
		}
		copy(ops, sc.ops[:sc.n])
		c.put(sc)
		return
	case <-tm.C:
	case <-ctx.Done():
	}
	// The deadline passed, or the request went away.
	c.mu.Lock()
	switch sc.state.Load() {
	case callQueued:
		for i, q := range c.queue {
			if q == sc {
				c.remove(i)
				break
			}
		}
		c.mu.Unlock()
		c.failAll(ops)
		c.put(sc)
		return
	case callLead:
		// Chosen to send the next call, too late for its own ops: hand
		// the turn on.
		<-sc.wake
		c.handOn()
		c.mu.Unlock()
		c.failAll(ops)
		c.put(sc)
		return
	}
	c.mu.Unlock()
	// In flight: the call's deadline is no later than this one's, so its
	// outcome is due now; if it is not written yet, give it up.
	if sc.state.CompareAndSwap(callInFlight, callAbandoned) {
		c.failAll(ops)
		return // the sender recycles sc
	}
	<-sc.wake // done meanwhile: the sender is sending true
	copy(ops, sc.ops[:sc.n])
	c.put(sc)
}

// lead sends lead's ops and those of the decisions queued, as one store
// call bounded by lead's deadline, delivers every outcome, and then hands
// the turn to the next queued decision, if any.
func (c *combiner) lead(ctx context.Context, lead *syncCall) {
	opsp, _ := c.bufs.Get().(*[]store.Op)
	if opsp == nil {
		s := make([]store.Op, 0, 64)
		opsp = &s
	}
	batch, _ := c.batches.Get().(*[]*syncCall)
	if batch == nil {
		s := make([]*syncCall, 0, 64)
		batch = &s
	}
	ops := append((*opsp)[:0], lead.ops[:lead.n]...)
	c.mu.Lock()
	lead.state.Store(callInFlight)
	take := 0
	for take < len(c.queue) && len(ops)+c.queue[take].n <= c.maxOps {
		sc := c.queue[take]
		sc.state.Store(callInFlight)
		ops = append(ops, sc.ops[:sc.n]...)
		*batch = append(*batch, sc)
		take++
	}
	c.queue = append(c.queue[:0], c.queue[take:]...)
	clear(c.queue[len(c.queue) : len(c.queue)+take])
	c.mu.Unlock()

	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), lead.deadline)
	c.send(cctx, ops)
	cancel()
	c.sizes.Observe(float64(1 + len(*batch)))
	at := copy(lead.ops[:lead.n], ops)
	lead.state.Store(callDone)
	for _, sc := range *batch {
		at += copy(sc.ops[:sc.n], ops[at:])
		if sc.state.CompareAndSwap(callInFlight, callDone) {
			sc.wake <- true
		} else {
			c.put(sc) // abandoned by its decision
		}
	}
	clear(*batch)
	*batch = (*batch)[:0]
	c.batches.Put(batch)
	clear(ops)
	*opsp = ops[:0]
	c.bufs.Put(opsp)

	c.mu.Lock()
	c.handOn()
	c.mu.Unlock()
}

// handOn gives a finished sender's turn to the oldest queued decision, or
// frees it. c.mu must be held.
func (c *combiner) handOn() {
	if len(c.queue) == 0 {
		c.busy--
		return
	}
	next := c.queue[0]
	c.remove(0)
	next.state.Store(callLead)
	next.wake <- false
}

// remove takes the queue's i-th decision out. c.mu must be held.
func (c *combiner) remove(i int) {
	n := len(c.queue) - 1
	copy(c.queue[i:], c.queue[i+1:])
	c.queue[n] = nil
	c.queue = c.queue[:n]
}

func (c *combiner) failAll(ops []store.Op) {
	for i := range ops {
		ops[i].Value, ops[i].Err = 0, context.DeadlineExceeded
	}
}

// initCombiners sets up the limiter's queues of sync decisions, one per
// part of its store; a store of Parts 0 gets none.
func (l *Limiter) initCombiners() {
	n := l.store.Parts()
	if n < 1 {
		return
	}
	l.sync = make([]combiner, n)
	for i := range l.sync {
		l.sync[i] = combiner{
			send:    l.store.Do,
			timeout: l.cfg.StoreTimeout, maxOps: l.cfg.MaxFlushOps, max: maxSyncCalls,
			sizes: l.m.syncCalls, timers: &l.timers,
		}
	}
}

// syncDo performs the ops of one sync decision (one key's, so one part's)
// within StoreTimeout: in a call shared with the decisions of the same
// part that wait meanwhile, or, when the store says no part, in a call of
// their own.
func (l *Limiter) syncDo(ctx context.Context, ops []store.Op) {
	if c := l.combinerFor(ops); c != nil {
		c.do(ctx, ops)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	l.store.Do(ctx, ops)
	cancel()
	l.m.syncCalls.Observe(1)
}

// combinerFor returns the queue of the part ops are on (one key's, so
// one part's), or nil.
func (l *Limiter) combinerFor(ops []store.Op) *combiner {
	if len(l.sync) == 0 || len(ops) == 0 {
		return nil
	}
	part := l.store.Place(ops[0].Key)
	if part < 0 || part >= len(l.sync) {
		return nil
	}
	return &l.sync[part]
}
