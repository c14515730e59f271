package faults

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
)

// TestClockSkew measures how accuracy degrades when one of two edges has a
// clock ahead of the other's (edge.Options.ClockSkew, cmd/edge -clock-skew) by
// 0 (the reference), 10, 100 and 1000 ms. Each skew gets its own pair of
// edges over the same two memcached shards and its own copy of one trace
// (Zipf clients, a steady abuser at twice the limit and one at 1.5 times
// it), every client alternating between the two edges; the four
// pairs run at once, each under a rule of its own name (so their counters
// are distinct). The judge measures each pair's decisions against the exact
// sliding window at the true times; it is also given the times the edges
// stamped, which is what an aggregator in production sees.
//
// The window is 2 s here and 10 s in the full version: what matters is the
// skew as a fraction of the window, and both are reported.
func TestClockSkew(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	servers := shardsNamed(addrs...)
	win := pick(2*time.Second, 10*time.Second)
	limit := int(10 * win.Seconds()) // 10 per second
	dur := 6 * win
	skews := []time.Duration{0, 10 * time.Millisecond, 100 * time.Millisecond, time.Second}

	type level struct {
		skew    time.Duration
		rec     recorder
		targets []string
	}
	levels := make([]*level, len(skews))
	for i, skew := range skews {
		lv := &level{skew: skew}
		lv.rec.skews = map[uint16]time.Duration{2: skew}
		rules := fmt.Sprintf("rules: [{name: skew-%dms, limit: %d, window: %dms}]", skew.Milliseconds(), limit, win.Milliseconds())
		for id := 1; id <= 2; id++ {
			s := edgeSpec{id: id, rules: rules, servers: servers, events: &lv.rec}
			if id == 2 {
				s.skew = skew
			}
			lv.targets = append(lv.targets, serve(t, newEdge(t, s)).addr)
		}
		levels[i] = lv
	}
	trace := func() loadtest.Trace {
		z, err := loadtest.Zipf(loadtest.ZipfConfig{Seed: 7, Clients: 500, Rate: 150, Duration: dur})
		if err != nil {
			t.Fatal(err)
		}
		parts := []loadtest.Trace{z}
		rates := []float64{2, 1.5}
		for i, r := range rates {
			a, err := loadtest.Abuser(loadtest.AbuserConfig{Seed: uint64(i), IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}),
				Rate: r * float64(limit) / win.Seconds(), Duration: dur, Jitter: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, a)
		}
		return loadtest.Mix(parts...)
	}
	var reqs []loadtest.TraceRequest
	for r, err := range trace() {
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}

	var wg sync.WaitGroup
	reports := make([]*loadtest.ReplayReport, len(levels))
	for i, lv := range levels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, reports[i] = replay(t, context.Background(), loadtest.ReplayConfig{Targets: lv.targets, Spread: loadtest.RoundRobin,
				Align: win, MaxOutstanding: 500, ConnsPerTarget: 16}, reqs)
		}()
	}
	wg.Wait()

	rows := [][]string{{"skew", "skew/window", "decisions", "wrongly allowed", "wrongly limited", "wrong", "worst key over its limit", "mean rel. error", "as the aggregator sees it (edge times): wrong"}}
	wrong := make([]float64, len(levels))
	for i, lv := range levels {
		rep := reports[i]
		if rep.Completed != rep.Sent || len(rep.Errors) > 0 {
			t.Errorf("skew %v: %d sent, %d completed, errors %v", lv.skew, rep.Sent, rep.Completed, rep.Errors)
		}
		recs, _, r := judged(t, &lv.rec)
		// The same decisions at the times the edges stamped them.
		stamped := make([]rec, len(recs))
		for j := range recs {
			stamped[j] = rec{ev: recs[j].ev, at: recs[j].ev.Time}
		}
		sortByAt(stamped)
		rs := judgeReport(t, stamped)
		wrong[i] = r.Enforced.WrongRatio
		e := r.Enforced
		rows = append(rows, []string{lv.skew.String(), fmt.Sprintf("%.3f", lv.skew.Seconds()/win.Seconds()), fmt.Sprint(e.Decisions),
			fmt.Sprintf("%d (%.3f%%)", e.WronglyAllowed, 100*e.WronglyAllowedRatio),
			fmt.Sprintf("%d (%.3f%%)", e.WronglyLimited, 100*e.WronglyLimitedRatio),
			fmt.Sprintf("%.3f%%", 100*e.WrongRatio), worstOver(r), fmt.Sprintf("%.1f%%", 100*r.MeanRelativeError),
			fmt.Sprintf("%.3f%% (%d late)", 100*rs.Enforced.WrongRatio, rs.Late)})
		if r.Enforced.Decisions < int64(len(reqs))*9/10 {
			t.Errorf("skew %v: %d decisions judged of %d requests", lv.skew, r.Enforced.Decisions, len(reqs))
		}
	}
	t.Logf("clock skew of one edge of two, window %v, limit %d, %d requests per skew:%s", win, limit, len(reqs), table(rows))
	// What must hold: a skew of the order of the flush interval changes
	// nothing beyond the noise between two runs of the same trace.
	for i, r := range reports {
		if why := overloaded(r); why != "" {
			t.Logf("accuracy not judged: the machine was overloaded (skew %v): %s", skews[i], why)
			return
		}
	}
	// The short version runs under -race beside whatever else the machine
	// does, with a 2 s window: a starved scheduler alone can move it by a
	// few points, so it holds the skew to 5; the full version to 1.
	tol := 0.05
	if full() {
		tol = 0.01
	}
	if d := wrong[1] - wrong[0]; d > tol {
		t.Errorf("10 ms of skew: %.3f%% wrong, %.3f%% without: want within %.0f points", 100*wrong[1], 100*wrong[0], 100*tol)
	}
}

// worstOver returns the largest exact count over the limit among the keys
// wrongly allowed, as "1.20×", from the judge's report.
func worstOver(r judge.Report) string {
	w := 0.0
	for _, k := range r.TopFalseNegatives {
		w = max(w, k.Ratio)
	}
	if w == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", w)
}
