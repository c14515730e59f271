package window

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// gatedStore holds every call until its gate lets it through or the
// call's context ends (then its ops fail, as the Store contract says),
// counting calls and the most in flight at once, as a store with a long
// round trip would.
type gatedStore struct {
	Store
	gate            chan struct{} // a receive lets one call through; closed: all
	calls, inFlight atomic.Int64
	maxInFlight     atomic.Int64
	ops             atomic.Int64
}

func (s *gatedStore) Do(ctx context.Context, ops []Op) {
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
	store := &gatedStore{Store: NewMemStore(clock), gate: make(chan struct{})}
	l := newTestLimiter(t, clock, store, Config{StoreTimeout: 10 * time.Second})
	r := mustRules(t, "rules: [{name: s, limit: 50, window: 1m, mode: sync}]").Rules[0]
	key := r.Hash([]byte("k"))
	const n = 200
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1); d.Allowed && d.Fallback == FallbackNone {
				allowed.Add(1)
			}
		}()
	}
	// Let calls through one at a time while the others queue.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for open := true; open; {
		select {
		case store.gate <- struct{}{}:
			time.Sleep(time.Millisecond) // let decisions queue behind the calls in flight
		case <-done:
			open = false
		}
	}
	if got := allowed.Load(); got != 50 {
		t.Errorf("%d of %d admitted, want exactly 50", got, n)
	}
	if m := store.maxInFlight.Load(); m > maxSyncCalls {
		t.Errorf("%d store calls in flight at once, want at most %d", m, maxSyncCalls)
	}
	calls := store.calls.Load()
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
	t.Logf("%d sync decisions in %d store calls (%d ops)", n, calls, store.ops.Load())
}

// TestSyncDecisionWaitsAtMostItsTimeout: with the store holding every call,
// each sync decision, the senders' and those queued behind them, answers
// by its failure policy within StoreTimeout (plus scheduling slack), and
// nothing is left queued or busy after.
func TestSyncDecisionWaitsAtMostItsTimeout(t *testing.T) {
	clock := newSimClock(t0)
	store := &gatedStore{Store: NewMemStore(clock), gate: make(chan struct{})}
	const timeout = 50 * time.Millisecond
	l := newTestLimiter(t, clock, store, Config{StoreTimeout: timeout})
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
			if d.Fallback == FallbackClosed && !d.Allowed {
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
	if w := time.Duration(worst.Load()); w > timeout+40*time.Millisecond {
		t.Errorf("a decision waited %v, want about %v at most", w, timeout)
	}
	l.sync.mu.Lock()
	q, busy := len(l.sync.queue), l.sync.busy
	l.sync.mu.Unlock()
	if q != 0 || busy != 0 {
		t.Errorf("after: %d queued, %d calls busy, want none", q, busy)
	}
	// The store recovers: decisions are made by the count again.
	close(store.gate)
	if d := l.Decide(context.Background(), clock.Now(), &r.Policy, 99, r.Limit, 1); !d.Allowed || d.Fallback != FallbackNone {
		t.Errorf("a decision after the store recovered: %+v, want allowed by the count", d)
	}
}
