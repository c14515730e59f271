package edge

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// Stack is the decision core with what it decides over: the limiter and
// the concurrency slots, over one store. NewStack is the one assembly of
// it. Build calls it for a live edge, whose limiter flushes and whose
// slots renew in loops of their own on the system clock; the offline
// simulator calls it with a simulated clock, and then no loop runs: Step
// runs, at each simulated instant, what those loops would have run by
// then, at the same intervals.
type Stack struct {
	Limiter *window.Limiter
	Slots   *slots.Slots
	Core    *decision.Core

	stepped                bool
	flushEvery, renewEvery int64 // ns
	nextFlush, nextRenew   int64 // Unix ns; 0: at the first Step
	phase                  int64 // ns
}

// StackDeps are what a Stack is built over besides Options.
type StackDeps struct {
	Store      store.Store         // required
	Blocks     decision.BlockCache // required
	Events     decision.Emitter    // nil: no decision events
	Registerer prometheus.Registerer
	// Clock, when set, is a simulated clock: nothing runs by itself, and
	// the caller calls Step (see Stack). The loops then tick at Phase past
	// each multiple of their interval, so that the edges of a simulated
	// PoP need not flush in step. Unset, the stack reads Options.Clock
	// (plus ClockSkew) and its loops run by themselves.
	Clock store.Clock
	Phase time.Duration
	// Observe and Wait are the core's hooks (decision.CoreConfig).
	Observe func(r *rules.Rule, key []byte, e *event.Event)
	Wait    func(d time.Duration)
	// Global is the other PoPs' counts (decision.CoreDeps.Global).
	Global decision.GlobalView
}

// NewStack builds the decision core by rs over d, with o's settings: the
// limiter's (o.Limiter), the slots' (o.Slots), the edge's id and whether
// it proxies (load shedding applies then). Close it when done.
func NewStack(o Options, rs *rules.Rules, d StackDeps) (*Stack, error) {
	if d.Store == nil || d.Blocks == nil {
		return nil, errors.New("edge: NewStack: a Store and a BlockCache are required")
	}
	o = o.withDefaults()
	clock := d.Clock
	if clock == nil {
		clock = o.clock()
	}
	lc := o.Limiter
	lc.Registerer, lc.Clock = d.Registerer, clock
	lim, err := window.New(lc, d.Store)
	if err != nil {
		return nil, err
	}
	s := &Stack{Limiter: lim, Slots: slots.New(o.Slots, d.Store), stepped: d.Clock != nil,
		flushEvery: int64(lim.Config().FlushInterval), renewEvery: int64(o.Slots.RenewInterval), phase: int64(d.Phase)}
	s.Core, err = decision.NewCore(decision.CoreConfig{EdgeID: o.EdgeID, Upstream: o.Server.Mode == httpedge.Proxy,
		Observe: d.Observe, Wait: d.Wait, Pop: o.Pop, GlobalShare: o.GlobalShare,
		Clock: clock, RetryJitter: o.RetryJitter, BodyKeyBytes: o.BodyKeyBytes, SettleTimeout: o.SettleTimeout, MaxHeld: o.MaxReservations}, rs,
		decision.CoreDeps{Limiter: lim, Blocks: d.Blocks, Slots: s.Slots, Events: d.Events, Registerer: d.Registerer, Global: d.Global})
	if err != nil {
		s.Close(context.Background())
		return nil, err
	}
	if !s.stepped {
		lim.Start()
		s.Slots.Start(0, clock)
	}
	return s, nil
}

// Step runs what the limiter's flusher and the slots' renewer would have
// run by now, each tick at its own instant, when the Stack runs on a
// simulated clock (the caller sets the clock to each tick as Due gives
// it, when other stacks share the store); it does nothing otherwise.
// Steps must come in time order.
func (s *Stack) Step(ctx context.Context, now time.Time) {
	if !s.stepped {
		return
	}
	t := now.UnixNano()
	s.start(t)
	for {
		switch next := min(s.nextFlush, s.nextRenew); {
		case next > t:
			return
		case next == s.nextFlush:
			s.Limiter.Flush(ctx, time.Unix(0, next))
			s.nextFlush += s.flushEvery
		default:
			s.Slots.Renew(ctx, time.Unix(0, next))
			s.nextRenew += s.renewEvery
		}
	}
}

// Due returns when the next tick of a stepped Stack's loops falls, given
// that it is now t (Unix ns) or later.
func (s *Stack) Due(t int64) int64 {
	s.start(t)
	return min(s.nextFlush, s.nextRenew)
}

// start places the first ticks at or after t, at the stack's phase.
func (s *Stack) start(t int64) {
	if s.nextFlush == 0 {
		s.nextFlush = firstTick(t, s.flushEvery, s.phase)
		s.nextRenew = firstTick(t, s.renewEvery, s.phase)
	}
}

// firstTick is the first instant at or after t that is phase past a
// multiple of every.
func firstTick(t, every, phase int64) int64 {
	k := t - phase
	k -= ((k % every) + every) % every
	if k+phase < t {
		k += every
	}
	return k + phase
}

// Close stops the slots' renewer and the limiter, whose last flush sends
// the counts it holds within ctx.
func (s *Stack) Close(ctx context.Context) error {
	s.Slots.Close()
	return s.Limiter.Close(ctx)
}
