package loadtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
)

// nearLimit is a small near-limit workload: 40 clients of 20 per second,
// for 30 s.
func nearLimit(t testing.TB) loadtest.Trace {
	return must(t)(loadtest.NearLimit(loadtest.NearLimitConfig{Seed: 3, Clients: 40, Limit: 20, Window: time.Second, Duration: 30 * time.Second}))
}

// runPoP decides the trace through a simulated PoP and judges it.
func runPoP(t *testing.T, cfg loadtest.OfflineConfig, tr loadtest.Trace) (*loadtest.OfflineReport, judge.Report, map[int]int64) {
	t.Helper()
	jc := judge.DefaultConfig()
	jc.Hold, jc.MaxClockSkew, jc.MaxEventAge = 0, 0, 0
	j, err := judge.New(jc, nil)
	if err != nil {
		t.Fatal(err)
	}
	perEdge := map[int]int64{}
	cfg.Rules = parseRules(t, "rules: [{name: r, limit: 20, window: 1s}]")
	cfg.OnEvent = func(e *event.Event) { j.Add(e.Time, *e) }
	cfg.OnDecision = func(d loadtest.OfflineDecision) { perEdge[d.Edge]++ }
	rep, err := loadtest.Offline(context.Background(), cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	j.Flush()
	return rep, j.Report(), perEdge
}

// A simulated PoP is deterministic, deals requests as its spread says, and
// every edge decides; a client dealt over every edge is judged across them.
func TestOfflinePoP(t *testing.T) {
	tr := nearLimit(t)
	one, oneJ, _ := runPoP(t, loadtest.OfflineConfig{}, tr)
	for _, spread := range []loadtest.Spread{loadtest.ByClient, loadtest.RoundRobin} {
		cfg := loadtest.OfflineConfig{Edges: 2, Spread: spread, RTT: time.Millisecond}
		a, aj, per := runPoP(t, cfg, tr)
		b, bj, _ := runPoP(t, cfg, tr)
		if a.Allowed != b.Allowed || a.StoreOps != b.StoreOps || aj.Enforced != bj.Enforced {
			t.Errorf("%v: two runs differ: allowed %d/%d, store ops %d/%d, %+v / %+v", spread, a.Allowed, b.Allowed, a.StoreOps, b.StoreOps, aj.Enforced, bj.Enforced)
		}
		if a.Requests != one.Requests || a.Edges != 2 || len(per) != 2 || per[0] == 0 || per[1] == 0 {
			t.Errorf("%v: %d requests over %d edges, per edge %v; want %d over both", spread, a.Requests, a.Edges, per, one.Requests)
		}
		if spread == loadtest.RoundRobin && (per[0]-per[1] > 1 || per[1]-per[0] > 1) {
			t.Errorf("round-robin dealt %v", per)
		}
		if aj.Enforced.Decisions != a.Requests || a.StoreOps == 0 {
			t.Errorf("%v: judged %d of %d decisions, %d store ops", spread, aj.Enforced.Decisions, a.Requests, a.StoreOps)
		}
		// Two edges cannot be more exact than one deciding everything, and
		// stay within a few per cent of the limit on this workload.
		if aj.Enforced.WronglyAllowed < oneJ.Enforced.WronglyAllowed {
			t.Errorf("%v: %d wrongly allowed through two edges, fewer than one edge's %d", spread, aj.Enforced.WronglyAllowed, oneJ.Enforced.WronglyAllowed)
		}
		if r := aj.Enforced.WrongRatio; r > 0.05 {
			t.Errorf("%v: %.2f %% wrong", spread, 100*r)
		}
	}
}

// The round trip to the store makes an edge see the others' units late:
// over the same trace dealt round-robin, a longer one admits more wrongly.
func TestOfflinePoPRoundTrip(t *testing.T) {
	tr := nearLimit(t)
	_, fast, _ := runPoP(t, loadtest.OfflineConfig{Edges: 2, Spread: loadtest.RoundRobin}, tr)
	_, slow, _ := runPoP(t, loadtest.OfflineConfig{Edges: 2, Spread: loadtest.RoundRobin, RTT: 50 * time.Millisecond}, tr)
	if slow.Enforced.WronglyAllowed <= fast.Enforced.WronglyAllowed {
		t.Errorf("wrongly allowed: %d with a 50 ms round trip, %d with none; want more with it", slow.Enforced.WronglyAllowed, fast.Enforced.WronglyAllowed)
	}
}

// NearLimit's clients: a quarter near their limit, a tenth bursting over
// it, the rest under it; one seed, one trace.
func TestNearLimit(t *testing.T) {
	cfg := loadtest.NearLimitConfig{Seed: 9, Clients: 400, Limit: 10, Window: time.Second, Duration: 20 * time.Second}
	count := func() map[string]int {
		n := map[string]int{}
		for r, err := range must(t)(loadtest.NearLimit(cfg)) {
			if err != nil {
				t.Fatal(err)
			}
			n[r.IP.String()]++
		}
		return n
	}
	a, b := count(), count()
	if len(a) != len(b) {
		t.Fatalf("two traces of one seed differ: %d and %d clients", len(a), len(b))
	}
	var under, near, over int
	for ip, n := range a {
		if b[ip] != n {
			t.Fatalf("client %s: %d and %d requests from one seed", ip, n, b[ip])
		}
		switch per := float64(n) / 20 / 10; { // per second, over the limit
		case per < 0.6:
			under++
		case per < 1.6:
			near++
		default:
			over++
		}
	}
	if near < 70 || near > 130 || over < 20 || over > 60 || under < 200 {
		t.Errorf("clients under / near / over their limit: %d / %d / %d, want about 260 / 100 / 40", under, near, over)
	}
}

// Over a trace dealt round-robin, an edge that decides on its view alone
// admits past the limit what the other edge admitted since its last
// reply; guessing it (-async-near-limit -guess-peers) admits fewer, and
// deciding the requests that the others' units could turn by a round
// trip (the default) makes fewer wrong decisions than either.
func TestOfflinePoPNearLimit(t *testing.T) {
	tr := nearLimit(t)
	cfg := loadtest.OfflineConfig{Edges: 2, Spread: loadtest.RoundRobin, RTT: time.Millisecond, AsyncNearLimit: true}
	_, local, _ := runPoP(t, cfg, tr)
	cfg.GuessPeers = true
	_, guess, _ := runPoP(t, cfg, tr)
	cfg.AsyncNearLimit, cfg.GuessPeers = false, false
	_, near, _ := runPoP(t, cfg, tr)
	t.Logf("round-robin, wrongly allowed / limited: local %d / %d, guessing %d / %d, near-limit round trips %d / %d",
		local.Enforced.WronglyAllowed, local.Enforced.WronglyLimited, guess.Enforced.WronglyAllowed, guess.Enforced.WronglyLimited,
		near.Enforced.WronglyAllowed, near.Enforced.WronglyLimited)
	if guess.Enforced.WronglyAllowed >= local.Enforced.WronglyAllowed {
		t.Errorf("wrongly allowed: %d guessing the others' units, %d not; want fewer guessing", guess.Enforced.WronglyAllowed, local.Enforced.WronglyAllowed)
	}
	wrong := func(r judge.DecisionTally) int64 { return r.WronglyAllowed + r.WronglyLimited }
	if wrong(near.Enforced) >= wrong(local.Enforced) || wrong(near.Enforced) >= wrong(guess.Enforced) {
		t.Errorf("wrong decisions: %d with near-limit round trips, %d local, %d guessing; want the fewest with round trips",
			wrong(near.Enforced), wrong(local.Enforced), wrong(guess.Enforced))
	}
}

// The store's operations by kind: increments and reads in every PoP, and
// near-limit round trips (the edges' own count of them, some of the
// increments) for the dealt clients: a few at clients' onsets while each
// client is held by one edge, many round-robin, none with AsyncNearLimit.
func TestOfflinePoPStoreOpsByKind(t *testing.T) {
	tr := nearLimit(t)
	var syncs []int64
	for _, cfg := range []loadtest.OfflineConfig{
		{Edges: 2, Spread: loadtest.ByClient, RTT: time.Millisecond},
		{Edges: 2, Spread: loadtest.RoundRobin, RTT: time.Millisecond},
		{Edges: 2, Spread: loadtest.RoundRobin, RTT: time.Millisecond, AsyncNearLimit: true},
	} {
		rep, _, _ := runPoP(t, cfg, tr)
		k := rep.StoreOpsByKind
		if k.Increments == 0 || k.Reads == 0 || k.NearLimitSyncs > k.Increments {
			t.Errorf("%v async-near-limit %v: by kind %+v", cfg.Spread, cfg.AsyncNearLimit, k)
		}
		syncs = append(syncs, k.NearLimitSyncs)
	}
	if syncs[1] == 0 || syncs[0]*10 > syncs[1] || syncs[2] != 0 {
		t.Errorf("near-limit round trips: %d by client, %d round-robin, %d round-robin with async-near-limit; want many round-robin, a tenth of that at most by client, none without them", syncs[0], syncs[1], syncs[2])
	}
}
