package judge

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// Scripted traces. Times are milliseconds after t0, a multiple of every
// window used here, so fixed windows start at 0, 10 000, 20 000 ms.
const (
	t0 = int64(1_700_000_000) * int64(time.Second)
	ms = int64(time.Millisecond)
)

type opt func(*event.Event)

// ev returns a throttle decision of key at atMs: limit 10 per 10 s, cost 1,
// rule "api", edge 1, enforced, async, from the limiter.
func ev(atMs int64, key uint64, d event.Admission, opts ...opt) event.Event {
	e := event.Event{Time: t0 + atMs*ms, KeyHash: key, Rule: []byte("api"), Cost: 1,
		Limit: 10, WindowMillis: 10_000, Decision: d, Edge: 1}
	for _, o := range opts {
		o(&e)
	}
	return e
}

// burst returns n decisions of key from fromMs, stepMs apart.
func burst(fromMs int64, n int, stepMs int64, key uint64, d event.Admission, opts ...opt) []event.Event {
	evs := make([]event.Event, n)
	for i := range evs {
		evs[i] = ev(fromMs+int64(i)*stepMs, key, d, opts...)
	}
	return evs
}

func limit(n uint32) opt       { return func(e *event.Event) { e.Limit = n } }
func win(ms uint32) opt        { return func(e *event.Event) { e.WindowMillis = ms } }
func onEdge(id uint16) opt     { return func(e *event.Event) { e.Edge = id } }
func cost(n uint32) opt        { return func(e *event.Event) { e.Cost = n } }
func estimate(v float32) opt   { return func(e *event.Event) { e.Estimate = v } }
func rule(name string) opt     { return func(e *event.Event) { e.Rule = []byte(name) } }
func blockRule(e *event.Event) { e.Action = policy.Block }
func fromCache(e *event.Event) { e.FromBlockCache, e.Decision = true, event.Limited }
func shadow(e *event.Event)    { e.Shadow = true }
func fallback(e *event.Event)  { e.Fallback = true }
func syncMode(e *event.Event)  { e.Mode = policy.Sync }

const (
	A = event.Allowed
	L = event.Limited
)

func cat(parts ...[]event.Event) []event.Event { return slices.Concat(parts...) }

// outcome is what the table tests compare: decisions, wrongly allowed and
// wrongly limited per class, and the rest of the headline counts.
type outcome struct {
	Enforced, Shadow, Fallback [3]int64
	Late, Invalid              int64
	FalseNegativeKeys          int64
	FalsePositiveKeys          int64
}

func tri(t DecisionTally) [3]int64 { return [3]int64{t.Decisions, t.WronglyAllowed, t.WronglyLimited} }

func outcomeOf(r Report) outcome {
	return outcome{
		Enforced: tri(r.Enforced), Shadow: tri(r.Shadow), Fallback: tri(r.Fallback),
		Late: r.Late, Invalid: r.Invalid,
		FalseNegativeKeys: r.FalseNegativeKeys, FalsePositiveKeys: r.FalsePositiveKeys,
	}
}

func newJudge(t testing.TB, mod func(*Config)) *Judge {
	t.Helper()
	cfg := DefaultConfig()
	// Events arrive at instant 0 here, which is no clock of their epoch:
	// no hold (TestHold tests it) and no clock bounds (TestClockBounds).
	cfg.Hold, cfg.MaxClockSkew, cfg.MaxEventAge = 0, 0, 0
	if mod != nil {
		mod(&cfg)
	}
	j, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// run feeds events one at a time in the order given (arrival order),
// flushes, checks the report's invariants and returns it.
func run(t *testing.T, mod func(*Config), events []event.Event) Report {
	t.Helper()
	j := newJudge(t, mod)
	for _, e := range events {
		j.Add(0, e)
	}
	j.Flush()
	r := j.Report()
	if r.Buffered != 0 {
		t.Errorf("buffered after Flush: got %d, want 0", r.Buffered)
	}
	if got, want := r.Judged+r.Late+r.Invalid, r.Events; got != want || r.Events != int64(len(events)) {
		t.Errorf("judged+late+invalid: got %d, want events %d (given %d)", got, want, len(events))
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("Report does not marshal: %v", err)
	}
	return r
}
