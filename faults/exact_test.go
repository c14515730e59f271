package faults

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"

	"github.com/poplimit/poplimit/judge"
)

// recorder is an decision.Emitter that keeps every decision event with the true
// time it was made, and passes it on to next, if set. Safe for concurrent
// use once skews is set.
type recorder struct {
	next decision.Emitter
	// skews are the clock skews of the edges, by edge id: an event's time
	// is its edge's clock, which is the true time plus the skew.
	skews map[uint16]time.Duration
	mu    sync.Mutex
	recs  []rec
}

// rec is one decision: the edge's event, and the true wall-clock time (Unix
// ns) at which the edge decided, which its own clock may not agree with.
type rec struct {
	ev event.Event
	at int64
}

func (r *recorder) Emit(e *event.Event) bool {
	at := e.Time - int64(r.skews[e.Edge])
	r.mu.Lock()
	r.recs = append(r.recs, rec{ev: *e, at: at})
	r.mu.Unlock()
	if r.next != nil {
		return r.next.Emit(e)
	}
	return true
}

// snapshot returns the decisions recorded so far, in true-time order.
func (r *recorder) snapshot() []rec {
	r.mu.Lock()
	out := slices.Clone(r.recs)
	r.mu.Unlock()
	sortByAt(out)
	return out
}

// sortByAt sorts recs by time, keeping the order of equal times.
func sortByAt(recs []rec) {
	slices.SortStableFunc(recs, func(a, b rec) int { return cmpInt(a.at, b.at) })
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// verdict is what the exact sliding window says of one decision.
type verdict struct {
	overAdmitted   bool    // allowed, and admitting it made the exact admitted count in (t−W, t] exceed the limit
	wronglyLimited bool    // refused while the client had sent no more than the limit in (t−W, t], this one included
	overshoot      float64 // of an over-admitted decision: the exact count it made, over the limit (> 1)
}

// exact judges throttle decisions in recs (in true-time order) against the
// exact sliding window, by the rules of package judge (times floored to its
// 1 ms resolution), using the true times. Shadow decisions and block rules
// are left unjudged. It gives the same totals as the judge and, unlike it,
// a verdict per decision, to split them by client and phase.
func exact(recs []rec) []verdict {
	type unit struct {
		at   int64
		cost uint64
	}
	type state struct {
		admitted, attempted   []unit
		admittedN, attemptedN uint64
	}
	type keyID struct {
		rule string
		key  uint64
	}
	states := map[keyID]*state{}
	out := make([]verdict, len(recs))
	for i := range recs {
		e := &recs[i].ev
		if e.Shadow || e.Action != policy.Throttle || e.Limit == 0 || e.WindowMillis == 0 {
			continue
		}
		id := keyID{string(e.Rule), e.KeyHash}
		s := states[id]
		if s == nil {
			s = &state{}
			states[id] = s
		}
		t := recs[i].at - recs[i].at%int64(time.Millisecond) // the judge's resolution
		from := t - int64(e.WindowMillis)*int64(time.Millisecond)
		for len(s.admitted) > 0 && s.admitted[0].at <= from {
			s.admittedN -= s.admitted[0].cost
			s.admitted = s.admitted[1:]
		}
		for len(s.attempted) > 0 && s.attempted[0].at <= from {
			s.attemptedN -= s.attempted[0].cost
			s.attempted = s.attempted[1:]
		}
		c := uint64(e.Cost)
		if e.Decision == event.Allowed {
			out[i].overAdmitted = s.admittedN+c > uint64(e.Limit)
			if out[i].overAdmitted {
				out[i].overshoot = float64(s.admittedN+c) / float64(e.Limit)
			}
			s.admitted = append(s.admitted, unit{t, c})
			s.admittedN += c
		} else {
			out[i].wronglyLimited = s.attemptedN+c <= uint64(e.Limit)
		}
		s.attempted = append(s.attempted, unit{t, c})
		s.attemptedN += c
	}
	return out
}

// tally counts decisions and what the exact window says of them.
type tally struct {
	Decisions, Allowed, Limited  int
	OverAdmitted, WronglyLimited int
	Fallback, FromBlockCache     int
	MaxOvershoot                 float64 // the largest exact count an over-admission made, over the limit
}

func (t *tally) add(r *rec, v verdict) {
	t.Decisions++
	if r.ev.Decision == event.Allowed {
		t.Allowed++
	} else {
		t.Limited++
	}
	if v.overAdmitted {
		t.OverAdmitted++
		t.MaxOvershoot = max(t.MaxOvershoot, v.overshoot)
	}
	if v.wronglyLimited {
		t.WronglyLimited++
	}
	if r.ev.Fallback {
		t.Fallback++
	}
	if r.ev.FromBlockCache {
		t.FromBlockCache++
	}
}

func (t tally) String() string {
	return fmt.Sprintf("%d decisions: %d allowed, %d limited; %d admitted beyond the limit (%.2f%%, worst %.2f× the limit), %d refused within it; %d fallbacks",
		t.Decisions, t.Allowed, t.Limited, t.OverAdmitted, pct(t.OverAdmitted, t.Decisions), t.MaxOvershoot, t.WronglyLimited, t.Fallback)
}

// worse reports whether k of n decisions admitted beyond the limit is a
// worse share than k0 of n0 by more than margin percentage points plus
// three standard errors of the difference of the two shares. A phase of a
// few hundred decisions moves that share by several points by chance
// alone (0.08 of 135 and of 300: 2.8 points of standard error), so a fixed
// margin would fail now and then with nothing wrong.
func worse(k, n, k0, n0 int, margin float64) bool {
	p, p0 := pct(k, n), pct(k0, n0)
	se := 0.0
	if n > 0 && n0 > 0 {
		se = math.Sqrt(p*(100-p)/float64(n) + p0*(100-p0)/float64(n0))
	}
	return p > p0+margin+3*se
}

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// judgeReport runs the aggregator's judge over recs, with their true times
// as event times, and returns its report after judging everything.
func judgeReport(t testing.TB, recs []rec) judge.Report {
	t.Helper()
	cfg := judge.DefaultConfig()
	cfg.Hold = 0
	j, err := judge.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]event.Event, 0, 1024)
	for i := range recs {
		e := recs[i].ev
		e.Time = recs[i].at
		batch = append(batch, e)
		if len(batch) == cap(batch) {
			j.Add(e.Time, batch...)
			batch = batch[:0]
		}
	}
	j.Add(time.Now().UnixNano(), batch...)
	j.Flush()
	return j.Report()
}

// checkAgainstJudge fails t unless the exact evaluator and the judge agree
// on the enforced totals of recs (fallbacks are tallied apart by the judge).
// phaseOf returns the phase of an event at time at (Unix ns): p for an
// event from bounds[p] on, the last phase running on past its end bound;
// -1 before bounds[0].
func phaseOf(bounds []time.Time, at int64) int {
	for p := len(bounds) - 2; p >= 0; p-- {
		if at >= bounds[p].UnixNano() {
			return p
		}
	}
	return -1
}

// judged returns the recorded decisions in time order with their exact
// verdicts, once it has checked that the aggregator's judge agrees.
func judged(t testing.TB, r *recorder) ([]rec, []verdict, judge.Report) {
	t.Helper()
	recs := r.snapshot()
	vs := exact(recs)
	return recs, vs, checkAgainstJudge(t, recs, vs)
}

func checkAgainstJudge(t testing.TB, recs []rec, vs []verdict) judge.Report {
	t.Helper()
	r := judgeReport(t, recs)
	var enf tally
	for i := range recs {
		if !recs[i].ev.Fallback && !recs[i].ev.Shadow {
			enf.add(&recs[i], vs[i])
		}
	}
	if r.Enforced.WronglyAllowed != int64(enf.OverAdmitted) || r.Enforced.WronglyLimited != int64(enf.WronglyLimited) ||
		r.Enforced.Decisions != int64(enf.Decisions) {
		t.Errorf("the judge and the exact evaluator disagree: judge %d decisions, %d wrongly allowed, %d wrongly limited; exact %d, %d, %d",
			r.Enforced.Decisions, r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited, enf.Decisions, enf.OverAdmitted, enf.WronglyLimited)
	}
	return r
}
