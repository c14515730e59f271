package faults

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/shardproxy"
)

// outageRules are the rules of the shard outage tests, one per failure
// policy and mode, each 10 requests per second per client IP.
const outageRules = `
rules:
  - {name: open,        path_prefix: /open,   limit: 10, window: 1s}
  - {name: closed,      path_prefix: /closed, limit: 10, window: 1s, fail: closed}
  - {name: sync-open,   path_prefix: /sync,   limit: 10, window: 1s, mode: sync}
  - {name: sync-closed, path_prefix: /login,  limit: 10, window: 1s, mode: sync, fail: closed}
`

var (
	outagePaths = []string{"/open", "/closed", "/sync", "/login"}
	outageRule  = map[string]string{"/open": "open", "/closed": "closed", "/sync": "sync-open", "/login": "sync-closed"}
	phaseNames  = []string{"before", "during", "after"}
)

// TestShardKilled kills a memcached shard (SIGKILL) in the middle of a
// replay and starts it again (empty) six seconds later.
func TestShardKilled(t *testing.T) {
	testShardOutage(t, "killed", func(ps []*testenv.Proc, _ *testenv.Relay) (fail, heal func()) {
		return ps[1].Kill, func() {
			if err := ps[1].Start(); err != nil {
				t.Errorf("restarting the killed shard: %v", err)
			}
		}
	})
}

// TestShardHung makes a memcached shard hang for six seconds in the middle
// of a replay: its relay stops carrying bytes, connections stay open, so
// only timeouts tell.
func TestShardHung(t *testing.T) {
	testShardOutage(t, "hung", func(_ []*testenv.Proc, r *testenv.Relay) (fail, heal func()) {
		return r.Hang, r.Forward
	})
}

// testShardOutage replays steady traffic through two edges over three
// memcached shards (the second behind a relay) and makes the second shard
// fail in the middle: fault returns how to fail it and how to heal it.
//
// 48 clients, 12 per rule, each at 1.5 times its limit, every client's
// requests alternating between the two edges. The replay starts on a window
// edge; its first two windows are warm-up (a client's first windows have no
// history, and the sliding window's error differs there), then 3 s before
// the fault, 6 s of fault (longer than the 5 s an ejected shard stays out,
// so its first retry fails too), 7 s after it.
func testShardOutage(t *testing.T, what string, fault func([]*testenv.Proc, *testenv.Relay) (fail, heal func())) {
	procs, addrs := testenv.Shards(t, 3)
	relay := testenv.NewRelay(t, addrs[1])
	servers := shardsNamed(addrs[0], relay.Addr, addrs[2])
	const (
		storeTimeout = 100 * time.Millisecond // cmd/edge's default
		limit, win   = 10, time.Second
	)
	var rec recorder
	var edges []*inEdge
	var fronts []*front
	var targets []string
	for id := 1; id <= 2; id++ {
		e := newEdge(t, edgeSpec{id: id, rules: outageRules, servers: servers, storeTimeout: storeTimeout, events: &rec})
		f := serve(t, e)
		edges, fronts, targets = append(edges, e), append(fronts, f), append(targets, f.addr)
	}

	warm, before, outage, after := 2*win, 3*time.Second, 6*time.Second, 7*time.Second
	total := warm + before + outage + after
	var clients []client
	for i := range 48 {
		clients = append(clients, client{ip: clientIP(i + 1), path: outagePaths[i%4], rate: 1.5 * limit / win.Seconds()})
	}
	reqs, owner := steady(clients, total, 1)
	onFailed := make([]bool, len(clients))
	keyOwner := map[uint64]int{}
	nFailed := 0
	for i, c := range clients {
		key := edges[0].rules.Lookup(outageRule[c.path]).Hash(c.ip.AppendTo(nil))
		keyOwner[key] = i
		onFailed[i] = homeShard(t, servers, key) == 1
		if onFailed[i] {
			nFailed++
		}
	}
	t.Logf("%d clients, %d of them with their counters on the shard that fails; %d requests over %v",
		len(clients), nFailed, len(reqs), total)

	// Watch the first edge's ring: when the shard leaves it and returns.
	fail, heal := fault(procs, relay)
	var ejectedAt, restoredAt time.Time // written by the watcher, read once it ended
	var faultNS, healNS atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watch sync.WaitGroup
	// The watcher also notes when it ran late: a gap between its 10 ms
	// ticks of 50 ms or more is a stall of the process or the machine
	// (the race detector, the collector, other work), not of the store.
	type stallAt struct {
		at  time.Time
		gap time.Duration
	}
	var stalls []stallAt // written by the watcher, read once it ended
	watch.Add(1)
	go func() {
		defer watch.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				woke := time.Now()
				if gap := woke.Sub(last); gap >= 50*time.Millisecond {
					stalls = append(stalls, stallAt{woke, gap})
				}
				last = woke
				ejected := !edges[0].mc.Ring().IsLive(1)
				if ejected && ejectedAt.IsZero() {
					ejectedAt = now
				}
				if h := healNS.Load(); !ejected && !ejectedAt.IsZero() && restoredAt.IsZero() && h != 0 && now.UnixNano() > h {
					restoredAt = now
				}
			}
		}
	}()
	start := alignedStart(win)
	go func() {
		time.Sleep(time.Until(start.Add(warm + before)))
		faultNS.Store(time.Now().UnixNano())
		fail()
		time.Sleep(outage)
		healNS.Store(time.Now().UnixNano())
		heal()
	}()
	results, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin, Align: win}, reqs)
	// A returned shard is put back when its retry timeout (5 s) has passed.
	testenv.WaitFor(t, 15*time.Second, "the shard back in both rings", func() bool {
		return edges[0].mc.Ring().IsLive(1) && edges[1].mc.Ring().IsLive(1)
	})
	cancel()
	watch.Wait()
	faultAt, healAt := time.Unix(0, faultNS.Load()), time.Unix(0, healNS.Load())
	t.Logf("replay: %d sent, %d completed, errors %v, statuses %v", rep.Sent, rep.Completed, rep.Errors, rep.Statuses)
	t.Logf("shard %s at +%.2fs, ejected at +%.2fs, back at +%.2fs, in the ring again at +%.2fs",
		what, faultAt.Sub(start).Seconds(), ejectedAt.Sub(start).Seconds(), healAt.Sub(start).Seconds(), restoredAt.Sub(start).Seconds())
	if ejectedAt.Before(faultAt) {
		t.Errorf("the %s shard was never ejected from the ring", what)
	}
	if restoredAt.IsZero() {
		t.Errorf("the %s shard did not return to the ring", what)
	}

	measured := start.Add(warm)
	phaseOf := func(at time.Time) int {
		switch {
		case at.Before(measured):
			return -1
		case at.Before(faultAt):
			return 0
		case at.Before(healAt):
			return 1
		}
		return 2
	}
	phaseLen := []time.Duration{faultAt.Sub(measured), healAt.Sub(faultAt), start.Add(total).Sub(healAt)}

	// Every request answered 200 or 429, as the client saw it; service time
	// on the edge, as the server saw it.
	statuses := map[string]*[3]map[int]int{}
	for i, r := range results {
		ph := phaseOf(r.Scheduled)
		if ph < 0 {
			continue
		}
		path := clients[owner[i]].path
		if statuses[path] == nil {
			statuses[path] = &[3]map[int]int{{}, {}, {}}
		}
		statuses[path][ph][r.Status]++
	}
	lat := map[string]*[3]latencies{}
	for _, f := range fronts {
		for _, h := range f.served() {
			ph := phaseOf(h.start)
			if ph < 0 {
				continue
			}
			if lat[h.path] == nil {
				lat[h.path] = &[3]latencies{}
			}
			lat[h.path][ph] = append(lat[h.path][ph], h.took)
		}
	}
	rows := [][]string{{"rule", "phase", "service time on the edge", "statuses"}}
	for _, path := range outagePaths {
		for ph := range 3 {
			rows = append(rows, []string{outageRule[path], phaseNames[ph], lat[path][ph].String(), fmt.Sprint(statuses[path][ph])})
		}
	}
	t.Logf("requests, shard %s:%s", what, table(rows))
	bound := storeTimeout + shardproxy.DefaultBatchGrace + 100*time.Millisecond
	busy := overloaded(rep)
	for _, path := range outagePaths {
		for ph := range 3 {
			st, l := statuses[path][ph], lat[path][ph]
			for s, n := range st {
				if s != 200 && s != 429 {
					t.Errorf("%s %s: %d answered %d (0: no answer), want only 200 and 429", outageRule[path], phaseNames[ph], n, s)
				}
			}
			if busy != "" {
				continue // the service times include the machine's stalls
			}
			if p99 := l.quantile(0.99); p99 > bound {
				t.Errorf("%s %s: p99 %v, want at most the store timeout plus its batch grace plus a margin (%v)", outageRule[path], phaseNames[ph], p99, bound)
			}
			// The slowest may meet a scheduling stall of this shared
			// machine; it must not have waited for several store timeouts.
			if m := l.max(); m > time.Second {
				t.Errorf("%s %s: slowest request %v, want < 1 s", outageRule[path], phaseNames[ph], m)
			}
		}
	}

	// Decisions, judged against the exact window with the true times.
	recs, vs, _ := judged(t, &rec)
	type group struct {
		rule  string
		phase int
		fail  bool
	}
	groups := map[group]*tally{}
	excess := map[group]float64{} // admitted minus the phase's allowance, summed over clients
	for ci, c := range clients {
		for ph := range 3 {
			excess[group{outageRule[c.path], ph, onFailed[ci]}] -= limit * phaseLen[ph].Seconds() / win.Seconds()
		}
	}
	var fallbacks, openFallbackRefused, openAtLimit, closedFallbackAdmitted int
	for i := range recs {
		r := &recs[i]
		ci, ok := keyOwner[r.ev.KeyHash]
		if !ok {
			t.Fatalf("an event for a key no client has: %+v", r.ev)
		}
		if r.ev.Fallback {
			fallbacks++
			closed := string(r.ev.Rule) == "closed" || string(r.ev.Rule) == "sync-closed"
			if closed && r.ev.Decision == event.Allowed {
				closedFallbackAdmitted++
			}
			// Fail-open decides from the edge's own view of the key (the
			// PoP may admit up to about one limit per edge): it refuses
			// only what that view says is over the limit, never for the
			// failure itself.
			switch {
			case closed || r.ev.Decision == event.Allowed:
			case float64(r.ev.Estimate)+float64(r.ev.Cost) > float64(r.ev.Limit):
				openAtLimit++
			default:
				t.Logf("a fail-open fallback refused below its limit at +%.3fs: %+v", time.Unix(0, r.at).Sub(start).Seconds(), r.ev)
				openFallbackRefused++
			}
		}
		ph := phaseOf(time.Unix(0, r.at))
		if ph < 0 {
			continue
		}
		g := group{string(r.ev.Rule), ph, onFailed[ci]}
		if groups[g] == nil {
			groups[g] = &tally{}
		}
		groups[g].add(r, vs[i])
		if r.ev.Decision == event.Allowed {
			excess[g]++
		}
	}
	rows = [][]string{{"rule", "keys on", "phase", "decisions", "admitted beyond limit (worst)", "admitted − allowance", "refused within limit", "fallbacks"}}
	names := []string{"open", "closed", "sync-open", "sync-closed"}
	for _, name := range names {
		for _, f := range []bool{true, false} {
			for ph := range 3 {
				g := groups[group{name, ph, f}]
				if g == nil {
					t.Fatalf("no decisions for %s, %s the outage", name, phaseNames[ph])
				}
				on := "other shards"
				if f {
					on = what + " shard"
				}
				rows = append(rows, []string{name, on, phaseNames[ph], strconv.Itoa(g.Decisions),
					fmt.Sprintf("%d (%.1f%%, %.2f×)", g.OverAdmitted, pct(g.OverAdmitted, g.Decisions), g.MaxOvershoot),
					fmt.Sprintf("%+.0f", excess[group{name, ph, f}]),
					strconv.Itoa(g.WronglyLimited), strconv.Itoa(g.Fallback)})
			}
		}
	}
	t.Logf("decisions judged exactly, shard %s:%s", what, table(rows))

	// Failure policies: fallbacks answer as the rule says, and are counted.
	t.Logf("fail-open fallbacks refused because the edge's own view had reached the limit: %d", openAtLimit)
	if closedFallbackAdmitted > 0 || openFallbackRefused > 0 {
		t.Errorf("fallbacks: %d fail-closed decisions admitted, %d fail-open refused below the limit of the edge's own view; want none", closedFallbackAdmitted, openFallbackRefused)
	}
	var metricFallbacks, ejections float64
	for _, e := range edges {
		metricFallbacks += testenv.MetricSum(t, e.reg, "poplimit_window_fallbacks_total")
		ejections += testenv.MetricSum(t, e.reg, "poplimit_shardproxy_ejections_total")
	}
	t.Logf("fallbacks: %d decisions by failure policy, poplimit_window_fallbacks_total %v; ejections %v", fallbacks, metricFallbacks, ejections)
	if fallbacks == 0 || metricFallbacks != float64(fallbacks) {
		t.Errorf("fallbacks counted %v, decided %d: want some, all counted", metricFallbacks, fallbacks)
	}
	// Keys of the other shards: decided by their counts, as before the
	// fault: no fallback, nobody refused within the limit, and admissions
	// beyond it no more frequent than before.
	if why := overloaded(rep); why != "" {
		t.Logf("accuracy not judged: the machine was overloaded: %s", why)
		return
	}
	var stalled [3]time.Duration // the longest stall the watcher saw in each phase
	for _, st := range stalls {
		if ph := phaseOf(st.at); ph >= 0 {
			stalled[ph] = max(stalled[ph], st.gap)
		}
	}
	t.Logf("longest stalls of the test process before, during and after the outage: %v", stalled)
	for _, name := range names {
		base := groups[group{name, 0, false}]
		for ph := range 3 {
			g := groups[group{name, ph, false}]
			// A stall of this shared machine past the store timeout makes
			// any key fall back, whatever its shard. When the watcher saw
			// one in the phase, a few fallbacks (1 % of the group's
			// decisions at most, each refusing at most one request within
			// the limit) are the machine's; a shard's failure reaching the
			// others' keys falls back far more often.
			if g.Fallback > 0 && stalled[ph] > 0 && g.Fallback <= g.Decisions/100 && g.WronglyLimited <= g.Fallback {
				t.Logf("%s, keys of other shards, %s the outage: %d fallbacks, in a phase where the test process stalled up to %v: the machine's", name, phaseNames[ph], g.Fallback, stalled[ph])
			} else if g.Fallback > 0 || g.WronglyLimited > 0 {
				t.Errorf("%s, keys of other shards, %s the outage: %v; want no fallback and nobody refused within the limit", name, phaseNames[ph], g)
			}
			if worse(g.OverAdmitted, g.Decisions, base.OverAdmitted, base.Decisions, 5) {
				t.Errorf("%s, keys of other shards, %s the outage: %.1f%% admitted beyond the limit, %.1f%% before", name, phaseNames[ph],
					pct(g.OverAdmitted, g.Decisions), pct(base.OverAdmitted, base.Decisions))
			}
		}
	}
}
