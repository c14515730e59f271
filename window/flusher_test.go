package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestIdleFlusherParks: a started limiter with nothing to flush stops
// waking every FlushInterval (no store calls, one park while idle), and the
// first decision after the idle spell is flushed at once.
func TestIdleFlusherParks(t *testing.T) {
	backend := &countingStore{Store: store.NewMemStore(store.SystemClock)}
	l := newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond, StoreTimeout: 20 * time.Millisecond})
	l.Start()
	r := mustRules(t, "rules: [{name: a, limit: 100, window: 1s}]").Rules[0]
	ctx := context.Background()
	l.Decide(ctx, time.Now(), &r.Policy, r.Hash([]byte("k")), r.Limit, 1)
	calls := func() int64 { return backend.incrs.Load() + backend.reads.Load() + backend.decrs.Load() }
	parks := func() float64 { return testutil.ToFloat64(l.m.flusherParks) }
	// Parked now, after the increment: it may also have parked once
	// before the decision woke it, which alone is no proof it is asleep.
	parked := func() bool { return backend.incrs.Load() == 1 && parks() >= 1 && l.park.parked.Load() }
	deadline := time.Now().Add(5 * time.Second)
	for !parked() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !parked() {
		t.Fatalf("after one decision: %d increments sent, %v parks; want 1 and the flusher parked", backend.incrs.Load(), parks())
	}
	c0, p0 := calls(), parks()
	time.Sleep(100 * time.Millisecond) // 100 flush intervals
	if c, p := calls(), parks(); c != c0 || p != p0 {
		t.Errorf("idle for 100 intervals: %d store ops and %v parks more, want none (the flusher sleeps)", c-c0, p-p0)
	}
	begin := time.Now()
	l.Decide(ctx, time.Now(), &r.Policy, r.Hash([]byte("k")), r.Limit, 1)
	for backend.incrs.Load() != 2 && time.Since(begin) < 5*time.Second {
		time.Sleep(100 * time.Microsecond)
	}
	if backend.incrs.Load() != 2 {
		t.Fatalf("the decision after the idle spell was never flushed")
	}
	t.Logf("flushed %v after the decision that woke the flusher", time.Since(begin).Round(time.Microsecond))
}
