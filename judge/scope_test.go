package judge

import (
	"testing"

	"github.com/poplimit/poplimit/event"
)

func inPop(name string) opt { return func(e *event.Event) { e.Pop = []byte(name) } }

var global opt = func(e *event.Event) { e.Global = true }

// A key's limit of scope pop holds in each PoP apart: 8 admissions in each
// of two PoPs under a limit of 10 are all correct. Of scope global it holds
// across them: the same 16 admissions are 6 too many. The report and the
// metrics break both down by scope and by PoP.
func TestScopes(t *testing.T) {
	twoPops := func(opts ...opt) []event.Event {
		return cat(burst(0, 8, 100, 1, A, append(opts, inPop("fra1"))...),
			burst(50, 8, 100, 1, A, append(opts, inPop("ams2"))...))
	}
	r := run(t, nil, twoPops())
	if got := outcomeOf(r); got.Enforced != [3]int64{16, 0, 0} {
		t.Errorf("scope pop, 8 + 8 under 10 in two PoPs: got %v, want 16 decisions, none wrong", got.Enforced)
	}
	r = run(t, nil, twoPops(global))
	if got := outcomeOf(r); got.Enforced != [3]int64{16, 6, 0} {
		t.Errorf("scope global, 8 + 8 under 10 in two PoPs: got %v, want 16 decisions, 6 wrongly allowed", got.Enforced)
	}
	if len(r.ByScope) != 1 || r.ByScope[0].Name != "global" || r.ByScope[0].Enforced.WronglyAllowed != 6 {
		t.Errorf("ByScope: got %+v, want one row, global, 6 wrongly allowed", r.ByScope)
	}
	pops := map[string]int64{}
	for _, b := range r.ByPop {
		pops[b.Name] = b.Enforced.Decisions
	}
	if len(pops) != 2 || pops["fra1"] != 8 || pops["ams2"] != 8 {
		t.Errorf("ByPop: got %+v, want fra1 and ams2, 8 decisions each", r.ByPop)
	}
}
