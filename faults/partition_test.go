package faults

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/loadtest"
)

// TestPartition splits two edges so that each reaches only part of the
// shards, the classic interview question's "half the API servers see one copy, half see another":
// edge 1 loses shard 2 and edge 2 loses shard 0 (their relays go silent;
// both still reach shard 1), for 8 s here and 30 s in the full version, then
// heals. Each edge ejects the shard it lost and counts that shard's keys on
// the others, where the other edge does not look: a key of shard 0 or 2 is
// counted in two places. Each edge sees its store split and, once its
// replies show a key counted by itself alone, holds it to the share of the
// limit it had before (window's split store), so that a client on a lost
// shard gets about its limit, not up to the limit from each edge. What
// every client experienced is logged before, during and after; in the
// partition no client may get more than 1.15 times its allowance nor be
// refused within its limit, and after the heal the edges must converge by
// themselves (the shards return to both rings on their retry timer) and
// decide as well as before.
func TestPartition(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	var relays [2][]*testenv.Relay
	var edges []*inEdge
	var targets []string
	var rec recorder
	const rules = `
rules:
  - {name: async, path_prefix: /a, limit: 10, window: 1s}
  - {name: sync,  path_prefix: /s, limit: 10, window: 1s, mode: sync}
`
	for e := range 2 {
		var ra []string
		for _, a := range addrs {
			r := testenv.NewRelay(t, a)
			relays[e] = append(relays[e], r)
			ra = append(ra, r.Addr)
		}
		// The same shard names through different addresses: both edges
		// build the same ring.
		ed := newEdge(t, edgeSpec{id: e + 1, rules: rules, servers: shardsNamed(ra...), events: &rec})
		edges, targets = append(edges, ed), append(targets, serve(t, ed).addr)
	}
	servers := shardsNamed(addrs...)

	const limit, win = 10, time.Second
	warm, before := 2*win, 3*time.Second
	split := pick(8*time.Second, 30*time.Second)
	after := pick(10*time.Second, 20*time.Second)
	total := warm + before + split + after
	// 24 clients, half per rule, at 1.5 times the limit, alternating
	// between the edges (a load balancer in front of the PoP).
	var clients []client
	home := map[uint64]int{}
	keyOwner := map[uint64]int{}
	for i := range 24 {
		c := client{ip: clientIP(100 + i), path: "/a", rate: 15}
		if i%2 == 1 {
			c.path = "/s"
		}
		_, key := c.ruleKey(edges[0].rules)
		home[key] = homeShard(t, servers, key)
		keyOwner[key] = i
		clients = append(clients, c)
	}
	// For the page, two more classes of clients: 12 within their limit (6
	// requests/s) and 12 at it (10/s), half per rule. The checks below are
	// of the 24 over it.
	nOver := len(clients)
	for i := range 24 {
		c := client{ip: clientIP(200 + i), path: "/a", rate: 6}
		if i >= 12 {
			c.rate = limit
		}
		if i%2 == 1 {
			c.path = "/s"
		}
		_, key := c.ruleKey(edges[0].rules)
		home[key] = homeShard(t, servers, key)
		keyOwner[key] = len(clients)
		clients = append(clients, c)
	}
	reqs, owner := steady(clients, total, 2)

	start := alignedStart(win)
	var splitAt, healAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(start.Add(warm + before)))
		splitAt = time.Now()
		relays[0][2].Hang()
		relays[1][0].Hang()
		time.Sleep(split)
		healAt = time.Now()
		relays[0][2].Forward()
		relays[1][0].Forward()
	}()
	// Watch the rings heal.
	var converged atomic.Int64 // Unix ns
	go func() {
		<-done
		for time.Since(healAt) < 20*time.Second {
			if edges[0].mc.Ring().Live() == 3 && edges[1].mc.Ring().Live() == 3 {
				converged.Store(time.Now().UnixNano())
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	results, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin, Align: win}, reqs)
	<-done
	testenv.WaitFor(t, 20*time.Second, "both rings whole again", func() bool { return converged.Load() != 0 })
	convergedAt := time.Unix(0, converged.Load())
	t.Logf("replay: %d sent, %d completed, errors %v, statuses %v", rep.Sent, rep.Completed, rep.Errors, rep.Statuses)
	t.Logf("partition at +%.2fs for %v; healed at +%.2fs; both rings whole at +%.2fs (%.2fs after the heal, no action taken)",
		splitAt.Sub(start).Seconds(), split, healAt.Sub(start).Seconds(), convergedAt.Sub(start).Seconds(), convergedAt.Sub(healAt).Seconds())
	if rep.Completed != rep.Sent || len(rep.Errors) > 0 {
		t.Errorf("replay: %d sent, %d completed, errors %v: want every request answered", rep.Sent, rep.Completed, rep.Errors)
	}

	// Per client and phase: the "after" phase is split at the moment the
	// rings were whole again plus one window (the counters split during the
	// partition weigh in the sliding window for one more window).
	settled := convergedAt.Add(win)
	bounds := []time.Time{start.Add(warm), splitAt, healAt, settled, start.Add(total)}
	phases := []string{"before", "partition", "healing", "healed"}
	recs, vs, _ := judged(t, &rec)
	per := make([][4]tally, len(clients))
	admitted := make([][4]int, len(clients))
	for i := range recs {
		r := &recs[i]
		ci := keyOwner[r.ev.KeyHash]
		ph := phaseOf(bounds, r.at)
		if ph < 0 {
			continue
		}
		per[ci][ph].add(r, vs[i])
		if r.ev.Decision == event.Allowed {
			admitted[ci][ph]++
		}
	}
	worst, worstClient := 0.0, -1
	rows := [][]string{{"client", "rule", "counters on", "reached by"}}
	for _, p := range phases {
		rows[0] = append(rows[0], p+": admitted/allowance, beyond limit, refused within")
	}
	for ci, c := range clients {
		rule, key := c.ruleKey(edges[0].rules)
		reach := []string{"edge 1 only", "both edges", "edge 2 only"}[home[key]]
		row := []string{c.ip.String(), rule, fmt.Sprintf("shard %d", home[key]), reach}
		for ph := range phases {
			allowance := limit * bounds[ph+1].Sub(bounds[ph]).Seconds() / win.Seconds()
			g := per[ci][ph]
			row = append(row, fmt.Sprintf("%d/%.0f, %d, %d", admitted[ci][ph], allowance, g.OverAdmitted, g.WronglyLimited))
			if r := float64(admitted[ci][ph]) / allowance; ph == 1 && r > worst {
				worst, worstClient = r, ci
			}
		}
		rows = append(rows, row)
	}
	t.Logf("per client (counters on shard 0: edge 2 cannot reach them; shard 2: edge 1 cannot; shard 1: both can):%s", table(rows))

	// Summary per class of client and phase.
	type class struct {
		rule   string
		shared bool
	}
	sum := map[class]*[4]tally{}
	over := map[class]*[4]float64{}
	for ci, c := range clients[:nOver] {
		rule, key := c.ruleKey(edges[0].rules)
		k := class{rule, home[key] == 1}
		if sum[k] == nil {
			sum[k], over[k] = &[4]tally{}, &[4]float64{}
		}
		for ph := range phases {
			s := &sum[k][ph]
			g := per[ci][ph]
			s.Decisions += g.Decisions
			s.Allowed += g.Allowed
			s.OverAdmitted += g.OverAdmitted
			s.WronglyLimited += g.WronglyLimited
			s.MaxOvershoot = max(s.MaxOvershoot, g.MaxOvershoot)
			over[k][ph] += float64(admitted[ci][ph]) - limit*bounds[ph+1].Sub(bounds[ph]).Seconds()/win.Seconds()
		}
	}
	rows = [][]string{{"rule", "counters", "phase", "decisions", "admitted beyond limit (worst)", "admitted − allowance", "refused within limit"}}
	for _, k := range []class{{"async", false}, {"async", true}, {"sync", false}, {"sync", true}} {
		if sum[k] == nil {
			continue
		}
		where := "on a shard one edge lost"
		if k.shared {
			where = "on the shard both reach"
		}
		for ph, p := range phases {
			g := sum[k][ph]
			rows = append(rows, []string{k.rule, where, p, fmt.Sprint(g.Decisions),
				fmt.Sprintf("%d (%.1f%%, %.1f×)", g.OverAdmitted, pct(g.OverAdmitted, g.Decisions), g.MaxOvershoot),
				fmt.Sprintf("%+.0f", over[k][ph]), fmt.Sprint(g.WronglyLimited)})
		}
	}
	t.Logf("per class of client:%s", table(rows))

	t.Logf("in the partition: worst client %.2f× its allowance (%s)", worst, clients[worstClient].ip)

	// The page: per class, admitted per second through each edge against
	// the allowance, for the clients whose counters sat on a lost shard.
	classes := []clientClass{
		{name: "within their limit", id: "within", rate: 6, allowance: 6},
		{name: "at their limit", id: "at", rate: limit, allowance: limit},
		{name: "over their limit", id: "over", rate: 15, allowance: limit},
	}
	for ci, c := range clients {
		_, key := c.ruleKey(edges[0].rules)
		if home[key] == 1 {
			continue // both edges reach its counters: the split does not touch it
		}
		for k := range classes {
			if classes[k].rate == c.rate {
				classes[k].members = append(classes[k].members, ci)
			}
		}
	}
	var series []sideSeries
	want := make([]int64, len(classes))
	phaseTable := map[string][][]string{}
	at := func(tm time.Time) float64 { return tm.Sub(start).Seconds() }
	for k := range classes {
		cl := &classes[k]
		series = append(series, sides(results, owner, cl, start, total))
		in := map[int]bool{}
		for _, ci := range cl.members {
			in[ci] = true
		}
		for i := range recs {
			if r := &recs[i]; r.ev.Decision == event.Allowed && in[keyOwner[r.ev.KeyHash]] {
				want[k]++
			}
		}
		var rows [][]string
		for side, name := range []string{"through edge 1", "through edge 2", "both edges"} {
			row := []string{name}
			for ph := range phases {
				var n int
				for i := range results {
					r := &results[i]
					if in[owner[i]] && r.Status >= 200 && r.Status < 300 && (side == 2 || r.Target == side) &&
						!r.Scheduled.Before(bounds[ph]) && r.Scheduled.Before(bounds[ph+1]) {
						n++
					}
				}
				row = append(row, fmt.Sprintf("%.2f", float64(n)/float64(max(1, len(cl.members)))/bounds[ph+1].Sub(bounds[ph]).Seconds()))
			}
			rows = append(rows, row)
		}
		rows = append(rows, append([]string{"allowance"}, slices.Repeat([]string{fmt.Sprintf("%g", cl.allowance)}, len(phases))...))
		phaseTable[cl.id] = rows
		t.Logf("clients %s (%d on a lost shard), admitted per second per client, %v:%s", cl.name, len(cl.members), phases, table(rows))
	}
	settings := [][2]string{
		{"rules", "async: 10 per 1s on /a; sync: 10 per 1s on /s (mode: sync); sliding window"},
		{"edges", "2, over 3 memcached shards; every client dealt round-robin over both"},
		{"split", "edge 1 loses shard 2, edge 2 loses shard 0; both keep shard 1"},
		{"timeline", fmt.Sprintf("partition at +%.2fs for %v, healed at +%.2fs, both rings whole at +%.2fs", at(splitAt), split, at(healAt), at(convergedAt))},
		{"clients", "12 within their limit (6/s), 12 at it (10/s), 24 over it (15/s); half per rule"},
	}
	writePartitionPage(t, partitionPage(classes, series, settings, at(splitAt), at(healAt), at(settled), phases, phaseTable), classes, want)

	// Convergence: once healed, every class is decided as well as before.
	if why := overloaded(rep); why != "" {
		t.Logf("accuracy not judged: the machine was overloaded: %s", why)
		return
	}
	// In the partition: each edge held to its share.
	if worst > 1.15 {
		t.Errorf("in the partition a client got %.2f× its allowance (%s): want ≤ 1.15×, each edge held to its share", worst, clients[worstClient].ip)
	}
	for k, s := range sum {
		if s[1].WronglyLimited > 0 {
			t.Errorf("%+v in the partition: %d refused within the limit", k, s[1].WronglyLimited)
		}
	}
	for k, s := range sum {
		b, h := s[0], s[3]
		if h.Decisions == 0 {
			t.Errorf("%+v: no decisions after the heal settled", k)
			continue
		}
		if worse(h.OverAdmitted, h.Decisions, b.OverAdmitted, b.Decisions, 5) || h.WronglyLimited > 0 {
			t.Errorf("%+v after the heal settled: %v; before the partition %.1f%% admitted beyond the limit: want no worse", k, h, pct(b.OverAdmitted, b.Decisions))
		}
		if ex := over[k][3] / (float64(h.Decisions) / 15); ex > limit/5 {
			t.Errorf("%+v after the heal settled: %+.1f admitted over the allowance per client-second, want about none", k, ex)
		}
	}
}
