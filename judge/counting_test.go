package judge

import (
	"slices"
	"testing"

	"github.com/poplimit/poplimit/event"
)

// counting makes e an event of a rule that counts by response: login,
// 5 per 60 s; its response counted n units and it settled settleMs after
// it arrived (a limited request counts nothing and settles at once).
func counting(n uint32, settleMs uint32) opt {
	return func(e *event.Event) {
		e.Rule, e.Limit, e.WindowMillis = []byte("login"), 5, 60_000
		e.Counting, e.Counted, e.SettleMicros = true, n, settleMs*1000
	}
}

// arriving is an event with the instant it reaches the judge.
type arriving struct {
	at int64 // Unix ns
	e  event.Event
}

// sent returns events as an edge sends them: a counting rule's admitted
// request when it settles, everything else when decided; sorted by that.
func sent(evs []event.Event) []arriving {
	out := make([]arriving, len(evs))
	for i, e := range evs {
		out[i] = arriving{e.Time + int64(e.SettleMicros)*1000, e}
	}
	slices.SortStableFunc(out, func(a, b arriving) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	return out
}

func ruleRow(r Report, name string) DecisionTally {
	for _, b := range r.ByRule {
		if b.Name == name {
			return b.Enforced
		}
	}
	return DecisionTally{}
}

// TestCountingRule judges a rule that counts by response against the
// units its responses counted, with the admitted requests' events sent
// when they settled, 5 s after they arrived: beyond the allowed lateness,
// while a plain rule's traffic moves the watermark on and the refusals of
// the same keys arrive at once.
func TestCountingRule(t *testing.T) {
	var evs []event.Event
	// Plain traffic every 100 ms for 20 s, well within its limit.
	for ms := int64(0); ms < 20_000; ms += 100 {
		evs = append(evs, ev(ms, 99, A, limit(1000)))
	}
	// Key 1, an attacker: 10 wrong passwords at once. The edge reserves 5
	// and refuses 5; the 5 settle as failures (401) 5 s later. Right.
	evs = append(evs, burst(1000, 5, 1, 1, A, counting(1, 5000))...)
	evs = append(evs, burst(1005, 5, 1, 1, L, counting(0, 0))...)
	// Key 2, an honest user: 8 logins, one after the other, all
	// successful: none counts, none may be refused. Right.
	evs = append(evs, burst(1000, 8, 200, 2, A, counting(0, 5000))...)
	// Key 3, an honest user logging in from 8 tabs at once: the edge
	// reserves 5, refuses 3, and the 5 settle as successes: the 3
	// refusals were caused by units that did not count. Wrongly limited.
	evs = append(evs, burst(2000, 5, 1, 3, A, counting(0, 5000))...)
	evs = append(evs, burst(2005, 3, 1, 3, L, counting(0, 0))...)
	// Key 4: 5 failures, then a sixth attempt admitted when the key had
	// its 5 counted units: wrongly allowed.
	evs = append(evs, burst(3000, 5, 100, 4, A, counting(1, 5000))...)
	evs = append(evs, ev(4000, 4, A, counting(1, 5000)))
	// Key 5: a request of cost 3 whose response counted 2 units, then one
	// of cost 3 admitted with 2 counted: right (2+3 = 5); another of cost
	// 2 admitted: 4+2 = 6, wrongly allowed.
	evs = append(evs, ev(3000, 5, A, counting(2, 5000), cost(3)), ev(3100, 5, A, counting(2, 5000), cost(3)),
		ev(3200, 5, A, counting(2, 5000), cost(2)))

	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	r := j.Report()
	if r.Late != 0 || r.Invalid != 0 || r.Judged != int64(len(evs)) {
		t.Fatalf("judged %d, late %d, invalid %d of %d events; want every one judged (late by reason: %+v)",
			r.Judged, r.Late, r.Invalid, len(evs), r.LateBreakdown)
	}
	got := ruleRow(r, "login")
	if got.Decisions != 35 || got.WronglyAllowed != 2 || got.WronglyLimited != 3 {
		t.Errorf("login: got %d decisions, %d wrongly allowed, %d wrongly limited; want 35, 2, 3",
			got.Decisions, got.WronglyAllowed, got.WronglyLimited)
	}
	if plain := ruleRow(r, "api"); plain.Decisions != 200 || plain.WronglyAllowed+plain.WronglyLimited != 0 {
		t.Errorf("api: got %+v, want 200 decisions, none wrong", plain)
	}
	if r.FalseNegativeKeys != 2 || r.FalsePositiveKeys != 1 {
		t.Errorf("wrong keys: got %d false negative, %d false positive; want 2 and 1", r.FalseNegativeKeys, r.FalsePositiveKeys)
	}
}

// TestCountingWindowSlides: counted units leave the window as a sliding
// window's do, and a counting rule's fixed window starts over on its
// boundary.
func TestCountingWindowSlides(t *testing.T) {
	// 5 failures at 0..400 ms, settled 50 ms later; at 60 000 the first
	// has left (t−W, t]: a sixth is right; a seventh at 60 050 makes 6.
	evs := cat(burst(0, 5, 100, 1, A, counting(1, 50)),
		[]event.Event{ev(60_000, 1, A, counting(1, 50)), ev(60_050, 1, A, counting(1, 50))})
	// The same under a fixed window: all of 60 000's window is new.
	fixed := func(e *event.Event) { e.Algorithm = 1 }
	evs = append(evs, cat(burst(0, 5, 100, 2, A, counting(1, 50), fixed),
		burst(60_000, 5, 10, 2, A, counting(1, 50), fixed), burst(60_100, 1, 0, 2, L, counting(0, 0), fixed))...)
	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	r := j.Report()
	if r.Late != 0 || r.Judged != int64(len(evs)) {
		t.Fatalf("judged %d, late %d of %d", r.Judged, r.Late, len(evs))
	}
	if r.Enforced.WronglyAllowed != 1 || r.Enforced.WronglyLimited != 0 {
		t.Errorf("got %d wrongly allowed, %d wrongly limited; want 1 (the seventh of key 1), 0",
			r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited)
	}
}

// TestCountingBlock: a block rule that counts by response: refusals from
// the block cache are inside the block, a refusal that starts one is
// judged on the counted units.
func TestCountingBlock(t *testing.T) {
	evs := cat(burst(0, 5, 10, 1, A, counting(1, 100), blockRule),
		burst(200, 1, 0, 1, L, counting(0, 0), blockRule),
		burst(300, 4, 10, 1, L, counting(0, 0), blockRule, fromCache),
		// Key 2: 5 successes, then a block refusal that was not due.
		burst(0, 5, 10, 2, A, counting(0, 100), blockRule),
		burst(200, 1, 0, 2, L, counting(0, 0), blockRule))
	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	r := j.Report()
	if r.Enforced.Decisions != 16 || r.Enforced.WronglyAllowed != 0 || r.Enforced.WronglyLimited != 1 {
		t.Errorf("got %+v; want 16 decisions, 1 wrongly limited (key 2's refusal)", r.Enforced)
	}
}

// TestCountingSettledTooLate: an admitted request that settled later than
// SettleLateness + AllowedLateness after the refusals of its key is late,
// and still counted in the key's units.
func TestCountingSettledTooLate(t *testing.T) {
	var evs []event.Event
	for ms := int64(0); ms < 120_000; ms += 100 {
		evs = append(evs, ev(ms, 99, A, limit(1000)))
	}
	evs = append(evs, ev(1000, 1, A, counting(1, 70_000)), ev(1100, 1, L, counting(0, 0)))
	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	if r := j.Report(); r.Late != 1 {
		t.Errorf("late: got %d, want 1 (settled 70 s after its time, past 60 s + 2 s)", r.Late)
	}
}

// TestFlushSettled: a quiet stream's flush leaves a counting rule's events
// that are not yet SettleLateness old, so that their key's admitted
// requests, sent when they settle, are judged in order with them.
func TestFlushSettled(t *testing.T) {
	j := newJudge(t, nil)
	refused := ev(0, 1, L, counting(0, 0))
	j.Add(t0, ev(0, 9, A), refused)
	j.FlushSettled(t0 + 1_000*ms)
	if got := j.Buffered(); got != 1 {
		t.Fatalf("buffered after FlushSettled 1 s on: got %d, want 1 (the counting rule's refusal)", got)
	}
	j.Add(t0+2_000*ms, ev(-500, 1, A, counting(1, 2_500)))
	j.FlushSettled(t0 + 61_000*ms)
	r := j.Report()
	if r.Buffered != 0 || r.Late != 0 || r.Judged != 3 {
		t.Errorf("after 61 s: buffered %d, late %d, judged %d; want 0, 0, 3", r.Buffered, r.Late, r.Judged)
	}
}

// TestCountingSameTick: two attempts on one account within a millisecond
// (the resolution): the edge admits the 5th and reserves its unit, and
// refuses the 6th for it; the 5th settles as a failure after the 6th's
// refusal was sent. Within the tick the judge takes the admission first,
// as the edge did: the refusal is right.
func TestCountingSameTick(t *testing.T) {
	evs := cat(burst(0, 4, 100, 1, A, counting(1, 50)),
		[]event.Event{ev(500, 1, A, counting(1, 3)), ev(500, 1, L, counting(0, 0))})
	evs[4].Time += 100_000 // 0.1 ms into the tick
	evs[5].Time += 150_000
	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	if r := j.Report(); r.Enforced.WronglyLimited != 0 || r.Enforced.Decisions != 6 {
		t.Errorf("got %+v; want 6 decisions, none wrong", r.Enforced)
	}
}

// TestCountingBucket: a token bucket that counts by response holds the
// counted units: successes leave it empty, failures fill it.
func TestCountingBucket(t *testing.T) {
	bucket := func(e *event.Event) { e.Algorithm, e.Burst = 2, 5 } // token_bucket, 5 per minute
	evs := cat(burst(0, 8, 100, 1, A, counting(0, 20), bucket),    // successes: none counts
		burst(1000, 5, 100, 2, A, counting(1, 20), bucket), // 5 failures fill it
		burst(1600, 1, 0, 2, A, counting(1, 20), bucket),   // a 6th admitted: wrongly allowed
		burst(1700, 1, 0, 2, L, counting(0, 0), bucket),    // refused: right
		burst(0, 1, 0, 3, L, counting(0, 0), bucket))       // a fresh key refused: wrongly limited
	j := newJudge(t, nil)
	for _, a := range sent(evs) {
		j.Add(a.at, a.e)
	}
	j.Flush()
	if r := j.Report(); r.Enforced.Decisions != 16 || r.Enforced.WronglyAllowed != 1 || r.Enforced.WronglyLimited != 1 {
		t.Errorf("got %+v; want 16 decisions, 1 wrongly allowed, 1 wrongly limited", r.Enforced)
	}
}
