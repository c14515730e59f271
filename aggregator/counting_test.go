package aggregator

import (
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
)

// countingLogin makes e an event of a rule that counts failed logins by
// response, 5 per 60 s: its response counted n units, and it settled
// settleMs after its time.
func countingLogin(n uint32, settleMs uint32) func(*event.Event) {
	return func(e *event.Event) {
		e.Rule, e.Limit, e.WindowMillis = []byte("failed-logins"), 5, 60_000
		e.Counting, e.Counted, e.SettleMicros = true, n, settleMs*1000
	}
}

// emitSettled sends the trace as edges send a counting rule's events: an
// admitted request's when it settles, everything else when decided.
func (tr *trace) emitSettled(t testing.TB, producers map[uint16]*pipeline.Producer) {
	t.Helper()
	evs := slices.Clone(tr.events)
	sentAt := func(e *event.Event) int64 { return e.Time + int64(e.SettleMicros)*1000 }
	slices.SortStableFunc(evs, func(a, b event.Event) int { return int(sentAt(&a) - sentAt(&b)) })
	for i := range evs {
		if !producers[evs[i].Edge].Emit(&evs[i]) {
			t.Fatalf("Emit %d: got false, want true", i)
		}
	}
}

// TestCountingKnownAnswer sends a counting rule's decisions through two
// edges' producers, the embedded broker and the consumer group: the
// judge holds them against the units their responses counted.
func TestCountingKnownAnswer(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Judge.AllowedLateness = time.Minute // the trace is emitted at once: order it by time
	a := startAggregator(t, cfg)
	tr := newTrace()
	A, L := event.Allowed, event.Limited
	tr.add(0, 5, 1, 1, A, countingLogin(1, 3000))    // key 1: 5 wrong passwords reserved at once,
	tr.add(5, 5, 1, 1, L, countingLogin(0, 0))       // 5 refused: right, the 5 counted
	tr.add(0, 12, 100, 2, A, countingLogin(0, 300))  // key 2: 12 successful logins: none counts, right
	tr.add(0, 5, 1, 3, A, countingLogin(0, 3000))    // key 3: 5 successes reserved at once,
	tr.add(5, 2, 1, 3, L, countingLogin(0, 0))       // 2 refused by reserved units that did not count: wrong
	tr.add(0, 5, 100, 4, A, countingLogin(1, 200))   // key 4: 5 failures,
	tr.add(1000, 1, 0, 4, A, countingLogin(0, 200))  // a sixth admitted at the limit: wrongly allowed
	tr.add(2000, 2, 10, 4, L, countingLogin(0, 0))   // then refused: right
	tr.add(0, 3, 100, 5, A, countingLogin(1, 100))   // key 5: 3 failures, then
	tr.add(400, 2, 100, 5, A, countingLogin(1, 100)) // 2 more, 5 counted: right
	producers := map[uint16]*pipeline.Producer{1: newProducer(t, a.Brokers()), 2: newProducer(t, a.Brokers())}
	tr.emitSettled(t, producers)
	for _, p := range producers {
		closeProducer(t, p)
	}
	testenv.WaitFor(t, 30*time.Second, "every event consumed", func() bool {
		return getReport(t, a, false).Events >= int64(len(tr.events))
	})
	r := getReport(t, a, true)
	if r.Judged != int64(len(tr.events)) || r.Late != 0 {
		t.Fatalf("judged %d, late %d; want %d, 0", r.Judged, r.Late, len(tr.events))
	}
	got := judge.DecisionTally{Decisions: r.Enforced.Decisions, WronglyAllowed: r.Enforced.WronglyAllowed, WronglyLimited: r.Enforced.WronglyLimited}
	if want := (judge.DecisionTally{Decisions: 42, WronglyAllowed: 1, WronglyLimited: 2}); got != want {
		t.Errorf("enforced: got %+v, want %+v", got, want)
	}
	if r.FalseNegativeKeys != 1 || r.FalsePositiveKeys != 1 {
		t.Errorf("false negative, positive keys: got %d, %d, want 1, 1", r.FalseNegativeKeys, r.FalsePositiveKeys)
	}
}

// TestCountingIdleFlush: when the stream goes quiet, the aggregator judges
// what it buffered but keeps a counting rule's refusal until the admitted
// requests of its key, sent when they settle, can have come: a request
// admitted before the refusal and settled after the quiet is judged
// before it, not late.
func TestCountingIdleFlush(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.IdleFlush = 100 * time.Millisecond
	cfg.Judge.SettleLateness = 10 * time.Second
	a := startAggregator(t, cfg)
	p := newProducer(t, a.Brokers())
	now := time.Now()
	plain := event.Event{Time: now.Add(-time.Second).UnixNano(), KeyHash: 9, Rule: []byte("api"), Cost: 1,
		Limit: 10, WindowMillis: 10_000, Edge: 1}
	refused := event.Event{Time: now.Add(-time.Second).UnixNano(), KeyHash: 1, Cost: 1, Edge: 1, Decision: event.Limited}
	countingLogin(0, 0)(&refused)
	if !p.Emit(&plain) || !p.Emit(&refused) {
		t.Fatal("Emit: got false")
	}
	testenv.WaitFor(t, 20*time.Second, "the plain event judged on idle", func() bool {
		return getReport(t, a, false).Judged >= 1
	})
	if r := getReport(t, a, false); r.Buffered != 1 {
		t.Fatalf("buffered after the idle flush: got %d, want 1 (the counting rule's refusal)", r.Buffered)
	}
	admitted := event.Event{Time: now.Add(-1500 * time.Millisecond).UnixNano(), KeyHash: 1, Cost: 1, Edge: 1}
	countingLogin(1, 1200)(&admitted)
	if !p.Emit(&admitted) {
		t.Fatal("Emit: got false")
	}
	testenv.WaitFor(t, 30*time.Second, "all three judged", func() bool {
		r := getReport(t, a, false)
		return r.Judged+r.Late >= 3
	})
	if r := getReport(t, a, false); r.Late != 0 || r.Judged != 3 || r.Enforced.WronglyLimited != 1 {
		t.Errorf("late %d, judged %d, wrongly limited %d; want 0, 3, 1 (the refusal, with 1 unit of 5 counted)",
			r.Late, r.Judged, r.Enforced.WronglyLimited)
	}
}
