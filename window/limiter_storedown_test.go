package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/store"
)

func TestLimiterFailurePolicies(t *testing.T) {
	clock := newSimClock(t0)
	rs := mustRules(t, `
rules:
  - name: open-async
    limit: 5
    window: 1m
  - name: closed-async
    limit: 5
    window: 1m
    fail: closed
  - name: open-sync
    limit: 5
    window: 1m
    mode: sync
  - name: closed-sync
    limit: 5
    window: 1m
    mode: sync
    fail: closed
`)
	backend := &countingStore{Store: store.NewMemStore(clock)}
	l := newTestLimiter(t, clock, backend, Config{})
	backend.fail.Store(true)
	want := map[string]store.Fallback{"open-async": store.FallbackOpen, "closed-async": store.FallbackClosed, "open-sync": store.FallbackOpen, "closed-sync": store.FallbackClosed}
	for _, r := range rs.Rules {
		key := r.Hash([]byte("k"))
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		l.Flush(context.Background(), clock.Now()) // async learns the store is down
		d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		if d.Fallback != want[r.Name] || d.Allowed != (want[r.Name] == store.FallbackOpen) {
			t.Errorf("%s with the store down: fallback %d allowed %v, want %d %v", r.Name, d.Fallback, d.Allowed, want[r.Name], want[r.Name] == store.FallbackOpen)
		}
	}
	// Pending increments survive the outage and land when it ends.
	backend.fail.Store(false)
	l.Flush(context.Background(), clock.Now())
	r := rs.Rules[0]
	ops := []store.Op{{Key: r.Hash([]byte("k")), Start: t0.UnixMilli()}}
	backend.Store.Do(context.Background(), ops)
	if ops[0].Value != 2 {
		t.Errorf("open-async counter after recovery = %d, want the 2 requests admitted during the outage", ops[0].Value)
	}
	d := l.Decide(context.Background(), clock.Now(), &rs.Rules[1].Policy, rs.Rules[1].Hash([]byte("k")), 5, 1)
	l.Flush(context.Background(), clock.Now())
	d = l.Decide(context.Background(), clock.Now(), &rs.Rules[1].Policy, rs.Rules[1].Hash([]byte("k")), 5, 1)
	if d.Fallback != store.FallbackNone || !d.Allowed {
		t.Errorf("closed-async after recovery: fallback %d allowed %v, want none, true", d.Fallback, d.Allowed)
	}
}

// TestFlusherBacksOffWhileTheStoreIsDown runs the real flusher against a
// store that fails everything: it must not retry every FlushInterval.
func TestFlusherBacksOffWhileTheStoreIsDown(t *testing.T) {
	backend := &countingStore{Store: store.NewMemStore(nil)}
	backend.fail.Store(true)
	l := newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond})
	r := mustRules(t, perMinute).Rules[0]
	now := time.Now()
	for i := 0; i < 100; i++ {
		l.Decide(context.Background(), now, &r.Policy, r.Hash([]byte{byte(i)}), r.Limit, 1)
	}
	l.Start()
	time.Sleep(300 * time.Millisecond)
	// Backing off 1, 2, 4 … ms, 300 ms hold about 9 attempts; without the
	// backoff there would be about 300.
	if n := backend.incrs.Load() / 100; n > 30 {
		t.Errorf("%d flush attempts in 300 ms against a dead store, want a backoff (about 9)", n)
	}
	backend.fail.Store(false)
	time.Sleep(1200 * time.Millisecond) // the longest backoff
	ops := []store.Op{{Key: r.Hash([]byte{7}), Start: algo.WindowStart(now.UnixNano(), int64(time.Minute)) / 1e6}}
	backend.Store.Do(context.Background(), ops)
	if ops[0].Value != 1 {
		t.Errorf("counter after the store came back = %d, want the 1 pending increment", ops[0].Value)
	}
}
