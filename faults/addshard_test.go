package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/shardproxy"
)

// TestAddShard adds a fourth memcached shard under load. A server list is
// fixed for the life of an edge (shardproxy builds a Client per list), so a
// shard is added by restarting the edges with the new list, one after the
// other, behind a front that keeps the clients' connections (a rolling
// restart behind a load balancer). Ketama moves about a quarter of the keys
// to the new shard, where their counters start from zero; while one edge
// has the new list and the other the old, the moved keys are also counted
// in two places. Measured: the keys moved, and the requests admitted beyond
// the limit, for moved and unmoved keys, before, during and after.
func TestAddShard(t *testing.T) {
	_, addrs := testenv.Shards(t, 4)
	old, grown := shardsNamed(addrs[:3]...), shardsNamed(addrs...)
	const (
		limit, win = 10, time.Second
		rules      = `
rules:
  - {name: async, path_prefix: /a, limit: 10, window: 1s}
  - {name: sync,  path_prefix: /s, limit: 10, window: 1s, mode: sync}
`
	)
	var rec recorder
	var fronts []*front
	for id := 1; id <= 2; id++ {
		fronts = append(fronts, serve(t, newEdge(t, edgeSpec{id: id, rules: rules, servers: old, events: &rec})))
	}
	rs := fronts[0].cur.Load().rules

	// 48 clients at 1.5 times their limit, half per rule.
	po, pg := placementOf(t, old), placementOf(t, grown)
	var clients []client
	moved := map[uint64]bool{}
	keyOwner := map[uint64]int{}
	nMoved := 0
	for i := range 48 {
		c := client{ip: clientIP(300 + i), path: "/a", rate: 15}
		if i%2 == 1 {
			c.path = "/s"
		}
		_, key := c.ruleKey(rs)
		keyOwner[key] = i
		moved[key] = po.home(key) != pg.home(key)
		if moved[key] {
			nMoved++
		}
		clients = append(clients, c)
	}
	// The same over many keys, for the expected share.
	sample, toNew := 0, 0
	for k := range uint64(20_000) {
		key := k * 0x9e3779b97f4a7c15
		if a, b := po.home(key), pg.home(key); a != b {
			sample++
			if b == 3 {
				toNew++
			}
		}
	}
	t.Logf("adding a 4th shard to 3 moves %d of the %d clients' keys (%.1f%%); of 20,000 keys, %.1f%% move, %d of them to a shard other than the new one",
		nMoved, len(clients), pct(nMoved, len(clients)), pct(sample, 20_000), sample-toNew)

	warm, before, rolling, after := 2*win, 3*time.Second, time.Second, 6*time.Second
	total := warm + before + rolling + after
	reqs, _ := steady(clients, total, 3)
	start := alignedStart(win)
	// readMoved reads, for the window starting at w0 (Unix ms), the moved
	// keys' counters on their old shard and on the new one.
	oldC, err := shardproxy.New(shardproxy.Config{Servers: old}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer oldC.Close()
	newC, err := shardproxy.New(shardproxy.Config{Servers: grown}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newC.Close()
	var onOld, onNew uint64
	var both int
	readMoved := func(w0 int64) (onOld, onNew uint64, both int) {
		for key, m := range moved {
			if !m {
				continue
			}
			a, errA := oldC.Get(context.Background(), key, w0)
			b, errB := newC.Get(context.Background(), key, w0)
			if errA != nil || errB != nil {
				t.Errorf("reading the counters of a moved key: %v, %v", errA, errB)
			}
			onOld += a[0]
			onNew += b[0]
			if a[0] > 0 && b[0] > 0 {
				both++
			}
		}
		return onOld, onNew, both
	}
	// The restarted edges, with the new list (built now: an edge started
	// with the list opens no connection before its first request).
	next := []*inEdge{
		newEdge(t, edgeSpec{id: 1, rules: rules, servers: grown, events: &rec}),
		newEdge(t, edgeSpec{id: 2, rules: rules, servers: grown, events: &rec}),
	}
	var firstAt, secondAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(start.Add(warm + before)))
		firstAt = time.Now()
		fronts[0].swap(next[0])
		// Near the end of the window in which the edges disagree (edge 1
		// on four shards, edge 2 on three), before the second restart.
		w0 := firstAt.Truncate(win)
		time.Sleep(time.Until(w0.Add(win * 9 / 10)))
		onOld, onNew, both = readMoved(w0.UnixMilli())
		time.Sleep(time.Until(firstAt.Add(rolling)))
		secondAt = time.Now()
		fronts[1].swap(next[1])
	}()
	_, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: []string{fronts[0].addr, fronts[1].addr},
		Spread: loadtest.RoundRobin, Align: win}, reqs)
	<-done
	t.Logf("replay: %d sent, %d completed, errors %v, statuses %v; edge 1 restarted with 4 shards at +%.2fs, edge 2 at +%.2fs",
		rep.Sent, rep.Completed, rep.Errors, rep.Statuses, firstAt.Sub(start).Seconds(), secondAt.Sub(start).Seconds())
	if rep.Completed != rep.Sent || len(rep.Errors) > 0 {
		t.Errorf("replay: %d sent, %d completed, errors %v: want every request answered across the restarts", rep.Sent, rep.Completed, rep.Errors)
	}

	t.Logf("in the window when edge 1 had 4 shards and edge 2 had 3, the moved keys' counters hold %d on their old shards (edge 2) and %d on the new one (edge 1, from zero): %d of the %d moved keys counted in both places",
		onOld, onNew, both, nMoved)
	if both == 0 {
		t.Errorf("no moved key counted on both its old and its new shard while the edges disagreed")
	}

	bounds := []time.Time{start.Add(warm), firstAt, secondAt, secondAt.Add(win), start.Add(total)}
	phases := []string{"before", "rolling restart", "first window after", "after"}
	recs, vs, _ := judged(t, &rec)
	type group struct {
		rule  string
		moved bool
		phase int
	}
	groups := map[group]*tally{}
	excess := map[group]float64{}
	for _, c := range clients {
		rule, key := c.ruleKey(rs)
		m := moved[key]
		for ph := range phases {
			excess[group{rule, m, ph}] -= limit * bounds[ph+1].Sub(bounds[ph]).Seconds() / win.Seconds()
		}
	}
	for i := range recs {
		r := &recs[i]
		ph := phaseOf(bounds, r.at)
		if ph < 0 {
			continue
		}
		g := group{string(r.ev.Rule), moved[r.ev.KeyHash], ph}
		if groups[g] == nil {
			groups[g] = &tally{}
		}
		groups[g].add(r, vs[i])
		if r.ev.Decision == event.Allowed {
			excess[g]++
		}
	}
	rows := [][]string{{"rule", "keys", "phase", "decisions", "admitted beyond limit (worst)", "admitted − allowance", "refused within limit"}}
	for _, rule := range []string{"async", "sync"} {
		for _, m := range []bool{true, false} {
			for ph, p := range phases {
				g := groups[group{rule, m, ph}]
				if g == nil {
					continue
				}
				keys := "unmoved"
				if m {
					keys = "moved"
				}
				rows = append(rows, []string{rule, keys, p, fmt.Sprint(g.Decisions),
					fmt.Sprintf("%d (%.1f%%, %.1f×)", g.OverAdmitted, pct(g.OverAdmitted, g.Decisions), g.MaxOvershoot),
					fmt.Sprintf("%+.0f", excess[group{rule, m, ph}]), fmt.Sprint(g.WronglyLimited)})
			}
		}
	}
	t.Logf("decisions judged exactly:%s", table(rows))

	// Unmoved keys keep their counters: a restarted edge reads them and
	// goes on deciding as before (once it has read them: each key's first
	// request on a restarted edge is decided before its first flush
	// answers, which the rolling-restart row shows); and the moved keys
	// are decided as well as before once a window has passed on the new
	// shard.
	if why := overloaded(rep); why != "" {
		t.Logf("accuracy not judged: the machine was overloaded: %s", why)
		return
	}
	// The share admitted beyond the limit moves with the machine's load
	// (the edges' flushes run late): alone it is 16-18 % for async unmoved
	// keys a window after the restarts, 27-35 % was seen while other work
	// ran. An edge that counted restarted keys from zero would admit up to
	// a whole limit more per key (over 50 %), which this bound (15 points
	// plus three standard errors, 8-11 points at these counts) still
	// catches.
	const noise = 15 // percentage points
	for _, rule := range []string{"async", "sync"} {
		base := groups[group{rule, false, 0}]
		for _, ph := range []int{0, 2, 3} {
			g := groups[group{rule, false, ph}]
			if g == nil || base == nil {
				t.Fatalf("%s: no decisions for unmoved keys in phase %q", rule, phases[ph])
			}
			if worse(g.OverAdmitted, g.Decisions, base.OverAdmitted, base.Decisions, noise) || g.WronglyLimited > 0 {
				t.Errorf("%s, unmoved keys, %s: %v; before: %.1f%% beyond the limit; want no worse", rule, phases[ph], g, pct(base.OverAdmitted, base.Decisions))
			}
		}
		if g, b := groups[group{rule, true, 3}], groups[group{rule, true, 0}]; g != nil && b != nil {
			if worse(g.OverAdmitted, g.Decisions, b.OverAdmitted, b.Decisions, noise) {
				t.Errorf("%s, moved keys, a window after the restarts: %v; before: %.1f%%; want no worse", rule, g, pct(b.OverAdmitted, b.Decisions))
			}
		}
	}
}
