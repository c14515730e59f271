package window

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// dealt runs n requests of one key dealt alternately over two limiters
// on one store, 20 ms apart, each limiter flushing after its own
// decision (as its flusher does within a flush interval): what an edge
// learns of the other's units comes only from the replies to its own
// operations. It returns the requests admitted.
func dealt(t *testing.T, cfg Config, backend store.Store, clock *simClock, n int) (admitted int, ls [2]*Limiter) {
	t.Helper()
	r := &Policy{Limit: 50, Window: time.Minute}
	for i := range ls {
		ls[i] = newTestLimiter(t, clock, backend, cfg)
	}
	const key = 9
	ctx := context.Background()
	for i := range n {
		l := ls[i%2]
		if d := l.Decide(ctx, clock.Now(), r, key, r.Limit, 1); d.Allowed {
			admitted++
		}
		l.Flush(ctx, clock.Now())
		clock.Add(20 * time.Millisecond)
	}
	return admitted, ls
}

// A key dealt over two edges is held to its limit exactly when the
// decisions that the other edge's unseen units could turn take a round
// trip; without it, the edges admit past the limit.
func TestNearLimitHoldsAKeyDealtOverTwoEdges(t *testing.T) {
	without, _ := dealt(t, Config{AsyncNearLimit: true}, store.NewMemStore(nil), newSimClock(t0), 200)
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	with, ls := dealt(t, Config{}, backend, clock, 200)
	syncs := testutil.ToFloat64(ls[0].m.nearSyncs) + testutil.ToFloat64(ls[1].m.nearSyncs)
	t.Logf("limit 50: admitted %d without, %d with near-limit decisions taking a round trip (%v round trips)", without, with, syncs)
	if without <= 50 {
		t.Errorf("with every decision local the two edges admitted %d, want more than the limit of 50 (the case this test is for)", without)
	}
	if with != 50 {
		t.Errorf("with near-limit round trips the two edges admitted %d, want the limit, 50", with)
	}
	// Only the decisions near the limit took a round trip, and every unit
	// admitted is counted once in the store.
	if syncs == 0 || syncs > 100 {
		t.Errorf("%v near-limit round trips, want some and fewer than the 150 decisions past the limit's reach", syncs)
	}
	ops := []store.Op{{Key: 9, Start: t0.UnixMilli()}}
	backend.Do(context.Background(), ops)
	if ops[0].Value != uint64(with) {
		t.Errorf("store counts %d, want the %d admitted", ops[0].Value, with)
	}
}

// A near-limit round trip that fails leaves the decision to the view and
// the rule's failure policy, counted, and loses none of the units it
// carried.
func TestNearLimitFailureFallsBackToTheView(t *testing.T) {
	clock := newSimClock(t0)
	backend := &countingStore{Store: store.NewMemStore(clock)}
	r := mustRules(t, "rules: [{name: k, limit: 50, window: 1m}]").Rules[0]
	key := r.Hash([]byte("203.0.113.9"))
	ctx := context.Background()
	var ls [2]*Limiter
	for i := range ls {
		ls[i] = newTestLimiter(t, clock, backend, Config{})
	}
	// Both edges' replies show the other's units: up to 4 short of the limit.
	admitted := 0
	for i := 0; admitted < 46; i++ {
		l := ls[i%2]
		if l.Decide(ctx, clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			admitted++
		}
		l.Flush(ctx, clock.Now())
		clock.Add(20 * time.Millisecond)
	}
	// An admission left unsent, then the store fails.
	l := ls[0]
	if !l.Decide(ctx, clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
		t.Fatal("the 47th request was refused")
	}
	admitted++
	backend.fail.Store(true)
	var d Answer
	for range 4 {
		clock.Add(20 * time.Millisecond)
		if d = l.Decide(ctx, clock.Now(), &r.Policy, key, r.Limit, 1); d.Allowed {
			admitted++
		}
		if d.Fallback != store.FallbackNone {
			break
		}
	}
	if d.Fallback != store.FallbackOpen || !d.Allowed {
		t.Fatalf("with the store failing near the limit: fallback %d allowed %v, want the view's admission, failing open", d.Fallback, d.Allowed)
	}
	if testutil.ToFloat64(l.m.fallbackOpen) == 0 || testutil.ToFloat64(l.m.storeErrors) == 0 {
		t.Error("the failed round trip or its fallback was not counted")
	}
	backend.fail.Store(false)
	l.Flush(ctx, clock.Now())
	ops := []store.Op{{Key: key, Start: t0.UnixMilli()}}
	backend.Store.Do(ctx, ops)
	if ops[0].Value != uint64(admitted) {
		t.Errorf("store counts %d after recovery, want the %d admitted (the units the failed round trip carried are sent again)", ops[0].Value, admitted)
	}
}

// A decision near the limit that takes its round trip allocates no more
// than a sync rule's decision does (the store call's deadline: a context
// and its timer, over MemStore as over memcached).
func TestNearLimitAllocatesAsASyncDecision(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops sync.Pool items at random: allocation counts say nothing under it")
	}
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	a := newTestLimiter(t, clock, backend, Config{Shards: 1})
	b := newTestLimiter(t, clock, backend, Config{Shards: 1})
	r := &Policy{Limit: 4, Window: time.Minute}
	sr := &Policy{Limit: 1 << 30, Window: time.Minute, Mode: policy.Sync}
	ctx := context.Background()
	const keys = 1000
	// Each key: A, B and A again admitted one unit each, so that A's
	// replies show B's units and its view has room for one.
	for _, l := range []*Limiter{a, b, a} {
		for k := range uint64(keys) {
			l.Decide(ctx, clock.Now(), r, k+1, r.Limit, 1)
			l.Decide(ctx, clock.Now(), sr, k+1+keys, sr.Limit, 1)
		}
		l.Flush(ctx, clock.Now())
		clock.Add(time.Second)
	}
	now := clock.Now()
	mallocs := func(f func(k uint64)) uint64 {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for k := range uint64(keys) {
			f(k + 1)
		}
		runtime.ReadMemStats(&ms1)
		return ms1.Mallocs - ms0.Mallocs
	}
	before := testutil.ToFloat64(a.m.nearSyncs)
	near := mallocs(func(k uint64) {
		if !a.Decide(ctx, now, r, k, r.Limit, 1).Allowed {
			t.Fatalf("key %d refused", k)
		}
	})
	if n := testutil.ToFloat64(a.m.nearSyncs) - before; n != keys {
		t.Fatalf("%v of %d decisions took the round trip, want all", n, keys)
	}
	sync := mallocs(func(k uint64) { a.Decide(ctx, now, sr, k+keys, sr.Limit, 1) })
	t.Logf("allocations per decision: near the limit %.2f, a sync rule's %.2f", float64(near)/keys, float64(sync)/keys)
	if near > sync+keys/20 { // (the tables' amortized growth aside)
		t.Errorf("a near-limit decision allocates %.2f times, a sync rule's %.2f: want no more", float64(near)/keys, float64(sync)/keys)
	}
}

// Concurrent decisions of one key that both running edges know, near-limit
// round trips among them, count every admitted unit once and hold the
// limit (run under -race by the test command).
func TestNearLimitConcurrent(t *testing.T) {
	backend := store.NewMemStore(nil)
	var ls [2]*Limiter
	for i := range ls {
		ls[i] = newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond})
		ls[i].Start()
	}
	r := &Policy{Limit: 200, Window: time.Hour}
	const key = 7
	var admitted atomic.Int64
	// The key known to both edges first, dealt over them, far from its limit.
	for i := range 100 {
		if ls[i%2].Decide(context.Background(), time.Now(), r, key, r.Limit, 1).Allowed {
			admitted.Add(1)
		}
		time.Sleep(2 * time.Millisecond)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				if ls[(g+i)%2].Decide(context.Background(), time.Now(), r, key, r.Limit, 1).Allowed {
					admitted.Add(1)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	syncs := testutil.ToFloat64(ls[0].m.nearSyncs) + testutil.ToFloat64(ls[1].m.nearSyncs)
	for _, l := range ls {
		l.Close(context.Background())
	}
	ops := []store.Op{{Key: key, Start: algo.WindowStart(time.Now().UnixNano(), int64(time.Hour)) / 1e6}}
	backend.Do(context.Background(), ops)
	t.Logf("1300 requests over two edges, limit 200: %d admitted, %v near-limit round trips, store %d", admitted.Load(), syncs, ops[0].Value)
	if n := admitted.Load(); n > 208 || n < 190 {
		t.Errorf("%d admitted, want the limit of 200 (within the 8 decisions in flight at once)", n)
	}
	if ops[0].Value != uint64(admitted.Load()) {
		t.Errorf("store counts %d, want the %d admitted", ops[0].Value, admitted.Load())
	}
}

// gateStore holds the first call that increments, once armed, until
// released: a round trip out.
type gateStore struct {
	store.Store
	armed      atomic.Bool
	held, free chan struct{}
}

func (s *gateStore) Do(ctx context.Context, ops []store.Op) {
	if len(ops) > 0 && ops[0].Delta > 0 && s.armed.CompareAndSwap(true, false) {
		close(s.held)
		<-s.free
	}
	s.Store.Do(ctx, ops)
}

// A request decided by a round trip counts in the view while the round
// trip is out, so that a decision made on the view meanwhile (a
// concurrent request's, on a key whose replies say it is this edge's
// alone) does not admit into the room this one takes; the reply settles
// it. Without it, concurrent requests of one key on one edge were
// admitted one past the limit now and then.
func TestRoundTripCountsInTheViewWhileOut(t *testing.T) {
	ctx := context.Background()
	clock := newSimClock(t0)
	backend := &gateStore{Store: store.NewMemStore(clock), held: make(chan struct{}), free: make(chan struct{})}
	l := newTestLimiter(t, clock, backend, Config{})
	pol := &Policy{Limit: 10, Window: 10 * time.Second}
	const key = 3
	for range 9 {
		l.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1)
	}
	l.Flush(ctx, clock.Now())
	view := func() uint64 {
		s := l.shardOf(key)
		s.mu.Lock()
		defer s.mu.Unlock()
		_, curr := s.lookup(key).view()
		return curr
	}
	backend.armed.Store(true)
	done := make(chan Answer)
	go func() {
		d, _ := l.counterSync(ctx, clock.Now().UnixNano(), pol, key, pol.Limit, 1)
		done <- d
	}()
	<-backend.held
	if v := view(); v != 10 {
		t.Errorf("the view counts %d while the round trip for the tenth unit is out, want 10", v)
	}
	close(backend.free)
	if d := <-done; !d.Allowed {
		t.Fatal("the tenth unit refused")
	}
	if v := view(); v != 10 {
		t.Errorf("the view counts %d after the reply, want 10", v)
	}
}

// TestABurstAtABoundaryCountsTheOthersLastUnits: a client dealt over two
// edges sends its limit in a window, the last units through the other
// edge just before the window ends, then bursts on this edge just after:
// all of those units still count, and the burst is refused whole. This
// edge learns the other's last units of the window that ended only from a
// read of it, made once its grace is over, so the near-limit round trip
// reads it until then; without that read this edge admitted 3 of the
// burst past the limit.
func TestABurstAtABoundaryCountsTheOthersLastUnits(t *testing.T) {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	var ls [2]*Limiter
	for i := range ls {
		ls[i] = newTestLimiter(t, clock, backend, Config{})
	}
	r := &Policy{Limit: 20, Window: time.Second}
	const key = 0xb0
	ctx := context.Background()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// 20 units from 500 ms, dealt; the last 3 through edge 2 at 990-994 ms.
	for i := range 17 {
		clock.t.Store(at(500 + 20*i).UnixNano())
		ls[i%2].Decide(ctx, clock.Now(), r, key, r.Limit, 1)
		for _, l := range ls {
			l.Flush(ctx, clock.Now())
		}
	}
	for i := range 3 {
		clock.t.Store(at(990 + 2*i).UnixNano())
		ls[1].Decide(ctx, clock.Now(), r, key, r.Limit, 1)
	}
	clock.t.Store(at(996).UnixNano())
	ls[1].Flush(ctx, clock.Now()) // edge 2's units land; edge 1 has nothing to send
	admitted := 0
	for i := range 10 {
		clock.t.Store(at(1010 + 2*i).UnixNano())
		if ls[0].Decide(ctx, clock.Now(), r, key, r.Limit, 1).Allowed {
			admitted++
		}
	}
	if admitted > 0 {
		t.Errorf("edge 1 admitted %d of a burst 10 ms into the window after the client's 20: want none (its 20 are all in the trailing window)", admitted)
	}
}
