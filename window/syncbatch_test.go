package window

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
	dto "github.com/prometheus/client_model/go"
)

// gatedStore holds every call until its gate lets it through or the
// call's context ends (then its ops fail, as the Store contract says),
// counting calls and the most in flight at once, as a store with a long
// round trip would.
type gatedStore struct {
	store.Store
	gate            chan struct{} // a receive lets one call through; closed: all
	calls, inFlight atomic.Int64
	maxInFlight     atomic.Int64
	ops             atomic.Int64
}

// One part: every call may carry any key.
func (s *gatedStore) Parts() int       { return 1 }
func (s *gatedStore) Place(uint64) int { return 0 }

func (s *gatedStore) Do(ctx context.Context, ops []store.Op) {
	s.calls.Add(1)
	s.ops.Add(int64(len(ops)))
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.maxInFlight.Load(); n > m && !s.maxInFlight.CompareAndSwap(m, n); m = s.maxInFlight.Load() {
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		for i := range ops {
			ops[i].Value, ops[i].Err = 0, ctx.Err()
		}
		return
	}
	s.Store.Do(ctx, ops)
}

// TestSyncDecisionsShareStoreCalls: sync decisions that arrive while
// maxSyncCalls calls are in flight wait and go together in the next call,
// and every decision is still exact: a limit of 50 admits exactly 50 of
// 200 concurrent requests of one key.
func TestSyncDecisionsShareStoreCalls(t *testing.T) {
	clock := newSimClock(t0)
	backend := &gatedStore{Store: store.NewMemStore(clock), gate: make(chan struct{})}
	l := newTestLimiter(t, clock, backend, Config{StoreTimeout: 10 * time.Second})
	r := mustRules(t, "rules: [{name: s, limit: 50, window: 1m, mode: sync}]").Rules[0]
	key := r.Hash([]byte("k"))
	const n = 200
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1); d.Allowed && d.Fallback == store.FallbackNone {
				allowed.Add(1)
			}
		}()
	}
	// Let calls through one at a time while the others queue.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for open := true; open; {
		select {
		case backend.gate <- struct{}{}:
			time.Sleep(time.Millisecond) // let decisions queue behind the calls in flight
		case <-done:
			open = false
		}
	}
	if got := allowed.Load(); got != 50 {
		t.Errorf("%d of %d admitted, want exactly 50", got, n)
	}
	if m := backend.maxInFlight.Load(); m > maxSyncCalls {
		t.Errorf("%d store calls in flight at once, want at most %d", m, maxSyncCalls)
	}
	calls := backend.calls.Load()
	if calls >= n/4 {
		t.Errorf("%d store calls for %d sync decisions, want them shared (fewer than %d)", calls, n, n/4)
	}
	var m dto.Metric
	if err := l.m.syncCalls.Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != uint64(calls) || h.GetSampleSum() != float64(n+n-50) {
		t.Errorf("sync_call_requests: %d calls, %v decisions; want %d and %d (%d increments, %d take-backs)",
			h.GetSampleCount(), h.GetSampleSum(), calls, n+n-50, n, n-50)
	}
	t.Logf("%d sync decisions in %d store calls (%d ops)", n, calls, backend.ops.Load())
}

// TestSyncDecisionWaitsAtMostItsTimeout: with the store holding every call,
// each sync decision, the senders' and those queued behind them, answers
// by its failure policy within its own StoreTimeout (a queued decision
// does not wait out the sender's timeout and then its own: that would take
// twice the timeout), and nothing is left queued or busy after.
func TestSyncDecisionWaitsAtMostItsTimeout(t *testing.T) {
	clock := newSimClock(t0)
	backend := &gatedStore{Store: store.NewMemStore(clock), gate: make(chan struct{})}
	const timeout = 200 * time.Millisecond
	l := newTestLimiter(t, clock, backend, Config{StoreTimeout: timeout})
	r := mustRules(t, "rules: [{name: s, limit: 5, window: 1m, mode: sync, fail: closed}]").Rules[0]
	const n = 40
	var wg sync.WaitGroup
	var worst, closed atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			d := l.Decide(context.Background(), clock.Now(), &r.Policy, uint64(i%3)+1, r.Limit, 1)
			took := int64(time.Since(begin))
			for w := worst.Load(); took > w && !worst.CompareAndSwap(w, took); w = worst.Load() {
			}
			if d.Fallback == store.FallbackClosed && !d.Allowed {
				closed.Add(1)
			}
		}()
		if i == n/2 {
			time.Sleep(timeout / 2) // half arrive while the first are already waiting
		}
	}
	wg.Wait()
	if got := closed.Load(); got != n {
		t.Errorf("%d of %d refused by the closed policy, want all", got, n)
	}
	if w := time.Duration(worst.Load()); w >= 2*timeout {
		t.Errorf("a decision waited %v, want less than two timeouts of %v (each its own only)", w, timeout)
	}
	l.sync[0].mu.Lock()
	q, busy := len(l.sync[0].queue), l.sync[0].busy
	l.sync[0].mu.Unlock()
	if q != 0 || busy != 0 {
		t.Errorf("after: %d queued, %d calls busy, want none", q, busy)
	}
	// The store recovers: decisions are made by the count again.
	close(backend.gate)
	if d := l.Decide(context.Background(), clock.Now(), &r.Policy, 99, r.Limit, 1); !d.Allowed || d.Fallback != store.FallbackNone {
		t.Errorf("a decision after the store recovered: %+v, want allowed by the count", d)
	}
}

// partedStore is a MemStore in two parts, odd keys on part 1, whose part 1
// hangs while hung is set: a call with any op of part 1 waits for its
// context, as a call to a hung memcached shard does.
type partedStore struct {
	*store.MemStore
	hung  atomic.Bool
	mixed atomic.Int64 // calls that carried ops of both parts
}

func (s *partedStore) Parts() int           { return 2 }
func (s *partedStore) Place(key uint64) int { return int(key % 2) }

func (s *partedStore) Do(ctx context.Context, ops []store.Op) {
	var parts [2]bool
	for _, op := range ops {
		parts[op.Key%2] = true
	}
	if parts[0] && parts[1] {
		s.mixed.Add(1)
	}
	if parts[1] && s.hung.Load() {
		<-ctx.Done()
		for i := range ops {
			ops[i].Value, ops[i].Err = 0, ctx.Err()
		}
		return
	}
	time.Sleep(200 * time.Microsecond) // a round trip, so decisions queue
	s.MemStore.Do(ctx, ops)
}

// TestSyncSharingKeepsPartsApart: with part 1 of the store hung, sync
// decisions of keys on part 0 are all decided by their counts, however
// many queue while part 1's calls wait out their timeout, and no call
// mixes the parts. With one queue for both parts, the calls in flight
// would wait on part 1 and part 0's decisions behind them fall back.
func TestSyncSharingKeepsPartsApart(t *testing.T) {
	clock := newSimClock(t0)
	backend := &partedStore{MemStore: store.NewMemStore(clock)}
	backend.hung.Store(true)
	l := newTestLimiter(t, clock, backend, Config{StoreTimeout: 300 * time.Millisecond})
	r := mustRules(t, "rules: [{name: s, limit: 1000000, window: 1m, mode: sync, fail: closed}]").Rules[0]
	const n = 400
	var wg sync.WaitGroup
	var healthyFallbacks, hungFallbacks, healthy atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := uint64(i) // even on part 0, odd on part 1
			d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
			switch {
			case key%2 == 1 && d.Fallback != store.FallbackNone:
				hungFallbacks.Add(1)
			case key%2 == 0 && d.Fallback != store.FallbackNone:
				healthyFallbacks.Add(1)
			case key%2 == 0:
				healthy.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := healthyFallbacks.Load(); got != 0 {
		t.Errorf("%d decisions of part 0 fell back while part 1 hung, want none (%d decided by count)", got, healthy.Load())
	}
	if got := hungFallbacks.Load(); got != n/2 {
		t.Errorf("%d of %d decisions of the hung part fell back, want all", got, n/2)
	}
	if m := backend.mixed.Load(); m != 0 {
		t.Errorf("%d store calls mixed the two parts, want none", m)
	}
	var m dto.Metric
	if err := l.m.syncCalls.Write(&m); err != nil {
		t.Fatal(err)
	}
	// Every decision of part 0 is in a call; one of the hung part whose
	// deadline passed while it queued is in none.
	h := m.GetHistogram()
	if h.GetSampleSum() < n/2 || h.GetSampleSum() > n || h.GetSampleCount() >= n/4 {
		t.Errorf("sync_call_requests: %d calls for %v decisions; want %d to %d decisions in fewer than %d calls",
			h.GetSampleCount(), h.GetSampleSum(), n/2, n, n/4)
	}
	t.Logf("%d sync decisions in %d store calls", n, h.GetSampleCount())
}

// TestSyncWithoutPlacerCallsEach: a store that does not place its keys
// (Parts 0) gets a store call per sync decision.
func TestSyncWithoutPlacerCallsEach(t *testing.T) {
	clock := newSimClock(t0)
	gated := &gatedStore{Store: store.NewMemStore(clock), gate: make(chan struct{})}
	close(gated.gate)
	backend := unplacedStore{gated}
	l := newTestLimiter(t, clock, backend, Config{})
	r := mustRules(t, "rules: [{name: s, limit: 1000000, window: 1m, mode: sync}]").Rules[0]
	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Decide(context.Background(), clock.Now(), &r.Policy, uint64(i%5)+1, r.Limit, 1)
		}()
	}
	wg.Wait()
	if len(l.sync) != 0 {
		t.Errorf("%d sync queues for a store of Parts 0, want none", len(l.sync))
	}
	if c := gated.calls.Load(); c < n {
		t.Errorf("%d store calls for %d sync decisions, want one each", c, n)
	}
}

// unplacedStore is gatedStore that does not place its keys.
type unplacedStore struct{ s *gatedStore }

func (u unplacedStore) Do(ctx context.Context, ops []store.Op)           { u.s.Do(ctx, ops) }
func (u unplacedStore) DoState(ctx context.Context, ops []store.StateOp) { u.s.DoState(ctx, ops) }
func (u unplacedStore) Healthy() bool                                    { return u.s.Healthy() }
func (u unplacedStore) Whole() bool                                      { return u.s.Whole() }
func (u unplacedStore) Parts() int                                       { return 0 }
func (u unplacedStore) Place(uint64) int                                 { return -1 }
