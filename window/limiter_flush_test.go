package window

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// BenchmarkFlush measures one flush of the async path as the flusher runs
// it under load: 10,000 keys known, 200 decisions over 150 of them between
// two flushes 5 ms apart (about 40,000 decisions a second), a memory store.
// ns/op is per flush; the idle sweep's share of it is what sweepEvery
// bounds.
func BenchmarkFlush(b *testing.B) {
	clock := newSimClock(t0)
	l := newTestLimiter(b, clock, store.NewMemStore(clock), Config{})
	r := mustRules(b, "rules: [{name: b, limit: 1000000000, window: 1m}]").Rules[0]
	keys := make([]uint64, 10_000)
	for i := range keys {
		keys[i] = r.Hash([]byte{byte(i), byte(i >> 8)})
	}
	ctx := context.Background()
	for _, k := range keys {
		l.Decide(ctx, clock.Now(), &r.Policy, k, r.Limit, 1)
	}
	l.Flush(ctx, clock.Now())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clock.Add(5 * time.Millisecond)
		now := clock.Now()
		for n := range 200 {
			l.Decide(ctx, now, &r.Policy, keys[(i+n%150)%len(keys)], r.Limit, 1)
		}
		i += 37
		l.Flush(ctx, now)
	}
}

// hintStore records, per flush, whether increments came hinted New.
type hintStore struct {
	*store.MemStore
	mu    sync.Mutex
	hints []bool // one per increment, in order
}

func (s *hintStore) Do(ctx context.Context, ops []store.Op) {
	s.mu.Lock()
	for _, op := range ops {
		if op.Delta > 0 {
			s.hints = append(s.hints, op.New)
		}
	}
	s.mu.Unlock()
	s.MemStore.Do(ctx, ops)
}

// TestFlushHintsNewCounters: a key's first increment of a window is hinted
// New (the store may create its counter in the same round trip); those
// after the store's reply showed it counted are not; the first of the next
// window is again.
func TestFlushHintsNewCounters(t *testing.T) {
	clock := newSimClock(t0.Add(50 * time.Second))
	backend := &hintStore{MemStore: store.NewMemStore(clock)}
	l := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, NewKeyWait: -1, MaxDefer: -1}) // every unit at the next flush
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	step := func() {
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
	}
	for range 3 {
		step()
	}
	clock.t.Store(t0.Add(time.Minute).UnixNano())
	step()
	step()
	if want := []bool{true, false, false, true, false}; !slices.Equal(backend.hints, want) {
		t.Errorf("hints of a key's increments, flush by flush (3 in one window, 2 in the next): %v, want %v", backend.hints, want)
	}
}
