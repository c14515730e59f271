package window

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// heavyOnsetTrace is a synthetic trace that stresses what distribution can
// add to the estimate: 200 light clients, and 20 heavy ones at 1.5 to 3
// times their limit, each starting at its own second of a window (the
// onset that the two-counter estimate gets wrong), over three windows.
func heavyOnsetTrace(seed uint64) []traceLine {
	r := rand.New(rand.NewPCG(seed, 1))
	var lines []traceLine
	add := func(ip string, start, rate, until float64) {
		for at := start; at < until; at += r.ExpFloat64() * 1000 / rate {
			lines = append(lines, traceLine{At: at, IP: ip})
		}
	}
	for i := range 200 {
		add(fmt.Sprintf("10.0.%d.%d", i/250, i%250), r.Float64()*5000, 0.5+r.Float64()*4, 30000)
	}
	for i := range 20 {
		add(fmt.Sprintf("10.9.0.%d", i), float64(i%10)*1000+r.Float64()*1000, 10*(1.5+1.5*r.Float64()), 30000)
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].At < lines[j].At })
	return lines
}

// Two edges with each client pinned to one of them decide as one edge
// does: the shared counts add nothing wrong of their own, at any phase.
// (A two-edge run once added wrongly limited decisions that one edge did
// not make; this bounds what distribution may add.)
func TestTwoEdgesPinnedDecideAsOne(t *testing.T) {
	lines := heavyOnsetTrace(7)
	phases := []time.Duration{0, 2500 * time.Millisecond, 5 * time.Second, 7500 * time.Millisecond}
	if raceEnabled {
		phases = phases[1:3] // the race detector is slow; the mid-window phases are the hard ones
	}
	for _, phase := range phases {
		c := replayConfig{limit: 100, window: 10 * time.Second, phase: phase, flush: 5 * time.Millisecond}
		one := replayTrace(t, lines, c)
		c.edges, c.pinned = 2, true
		two := replayTrace(t, lines, c)
		t.Logf("phase %v: one edge %d/%d wrongly allowed/limited (worst %.2f×), two pinned %d/%d (worst %.2f×) of %d",
			phase, one.wrongAllowed, one.wrongLimited, one.worst, two.wrongAllowed, two.wrongLimited, two.worst, one.decisions)
		// What distribution may add: the other edge's admissions reach a
		// view within a flush, so at most a few decisions per heavy key.
		if extra := two.wrongAllowed + two.wrongLimited - one.wrongAllowed - one.wrongLimited; extra > 20 {
			t.Errorf("phase %v: two pinned edges made %d more wrong decisions than one", phase, extra)
		}
		if two.wrong() > 0.001 || two.worst > 1.10 {
			t.Errorf("phase %v: two pinned edges %.4f %% wrong, worst key %.2f×; want ≤ 0.1 %% and ≤ 1.10×", phase, 100*two.wrong(), two.worst)
		}
	}
}
