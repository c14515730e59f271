package edge

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/rules"
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
	Slots   *window.Slots
	Core    *decision.Core

	stepped                bool
	flushEvery, renewEvery int64 // ns
	lastFlush, lastRenew   int64 // Unix ns
}

// StackDeps are what a Stack is built over besides Options.
type StackDeps struct {
	Store      window.Store        // required
	Blocks     decision.BlockCache // required
	Events     decision.Emitter    // nil: no decision events
	Registerer prometheus.Registerer
	// Clock, when set, is a simulated clock: nothing runs by itself, and
	// the caller calls Step (see Stack).
	Clock window.Clock
	// Observe and Wait are the core's hooks (decision.CoreConfig).
	Observe func(r *rules.Rule, key []byte, e *pipeline.Event)
	Wait    func(d time.Duration)
}

// NewStack builds the decision core by rs over d, with o's settings: the
// limiter's (o.Limiter), the slots' (o.Slots), the edge's id and whether
// it proxies (load shedding applies then). Close it when done.
func NewStack(o Options, rs *rules.Rules, d StackDeps) (*Stack, error) {
	if d.Store == nil || d.Blocks == nil {
		return nil, errors.New("edge: NewStack: a Store and a BlockCache are required")
	}
	o = o.withDefaults()
	lc := o.Limiter
	lc.Registerer, lc.Clock = d.Registerer, d.Clock
	lim, err := window.New(lc, d.Store)
	if err != nil {
		return nil, err
	}
	s := &Stack{Limiter: lim, Slots: window.NewSlots(o.Slots, d.Store), stepped: d.Clock != nil,
		flushEvery: int64(lim.Config().FlushInterval), renewEvery: int64(o.Slots.RenewInterval)}
	s.Core, err = decision.NewCore(decision.CoreConfig{EdgeID: o.EdgeID, Upstream: o.Server.Mode == httpedge.Proxy,
		Observe: d.Observe, Wait: d.Wait}, rs,
		decision.CoreDeps{Limiter: lim, Blocks: d.Blocks, Slots: s.Slots, Events: d.Events, Registerer: d.Registerer})
	if err != nil {
		s.Close(context.Background())
		return nil, err
	}
	if !s.stepped {
		lim.Start()
		s.Slots.Start(0, nil)
	}
	return s, nil
}

// Step runs what the limiter's flusher and the slots' renewer would have
// run by now, when the Stack runs on a simulated clock; it does nothing
// otherwise. Steps must come in time order.
func (s *Stack) Step(ctx context.Context, now time.Time) {
	if !s.stepped {
		return
	}
	t := now.UnixNano()
	if t-s.lastFlush >= s.flushEvery {
		s.Limiter.Flush(ctx, now)
		s.lastFlush = t
	}
	if t-s.lastRenew >= s.renewEvery {
		s.Slots.Renew(ctx, now)
		s.lastRenew = t
	}
}

// Close stops the slots' renewer and the limiter, whose last flush sends
// the counts it holds within ctx.
func (s *Stack) Close(ctx context.Context) error {
	s.Slots.Close()
	return s.Limiter.Close(ctx)
}
