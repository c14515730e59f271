package window

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// readLog is a Store that records the reads of ended windows.
type readLog struct {
	store.Store
	clock *simClock
	mu    sync.Mutex
	prev  map[uint64]int // key → reads of a window that had ended
}

func (s *readLog) Do(ctx context.Context, ops []store.Op) {
	s.mu.Lock()
	for _, op := range ops {
		if op.Delta == 0 && op.Start*1e6+int64(10*time.Second) <= s.clock.Now().UnixNano() {
			s.prev[op.Key]++
		}
	}
	s.mu.Unlock()
	s.Store.Do(ctx, ops)
}

// twoEdgesReadLogged is two edges over one store that logs the reads of
// ended 10 s windows, at t0 (which starts one).
func twoEdgesReadLogged(t *testing.T) (*simClock, *readLog, *Limiter, *Limiter) {
	clock := newSimClock(t0)
	backend := &readLog{Store: store.NewMemStore(clock), clock: clock, prev: map[uint64]int{}}
	return clock, backend, newTestLimiter(t, clock, backend, Config{}), newTestLimiter(t, clock, backend, Config{})
}

// A key whose units were this edge's alone until its window's last half
// (a client a balancer holds on one edge) is not read again when the
// window ends: this edge's view of it is the store's count. A key the
// other edge also counted is, and so is one this edge last heard of early
// in the window, whose client may have gone on elsewhere; that read brings
// the other edge's units into the estimate.
func TestAKeyHeldByOneEdgeSkipsTheReadOfItsLastWindow(t *testing.T) {
	clock, backend, a, b := twoEdgesReadLogged(t)
	r := &Policy{Limit: 100, Window: 10 * time.Second}
	ctx := context.Background()
	const held, dealt, moved = 1, 2, 3
	// Two windows: held and moved only on a, dealt on both.
	for w := range 2 {
		for step := range 50 {
			now := clock.Now()
			a.Decide(ctx, now, r, held, r.Limit, 1)
			a.Decide(ctx, now, r, dealt, r.Limit, 1)
			if step%2 == 0 {
				b.Decide(ctx, now, r, dealt, r.Limit, 1)
			}
			switch {
			case w == 0 || step < 10:
				a.Decide(ctx, now, r, moved, r.Limit, 1)
			case step < 40:
				// In the second window moved's client goes to b after 2 s.
				b.Decide(ctx, now, r, moved, r.Limit, 1)
			}
			a.Flush(ctx, now)
			b.Flush(ctx, now)
			clock.Add(200 * time.Millisecond)
		}
	}
	// The third window: each key comes back to a, which flushes past the
	// grace.
	readsBefore := map[uint64]int{}
	for k, n := range backend.prev {
		readsBefore[k] = n
	}
	for _, k := range []uint64{held, dealt, moved} {
		a.Decide(ctx, clock.Now(), r, k, r.Limit, 1)
	}
	for range 3 {
		clock.Add(50 * time.Millisecond)
		a.Flush(ctx, clock.Now())
	}
	est := a.Decide(ctx, clock.Now(), r, moved, r.Limit, 1).Estimate
	for k, want := range map[uint64]int{held: 0, dealt: 1, moved: 1} {
		if got := backend.prev[k] - readsBefore[k]; got != want {
			t.Errorf("key %d: %d reads of the ended window by a, want %d", k, got, want)
		}
	}
	// moved: 10 units on a then 30 on b in the ended window, about 99 % of
	// which still weigh; a's own 2 in this window.
	if est < 39 {
		t.Errorf("moved: estimate %.1f, want the other edge's 30 units counted (about 41)", est)
	}
}

// A key an edge meets once in its window costs the store one operation,
// the increment whose reply is the window's count: its previous window is
// read only at a second decision here. That read brings in the other
// edges' units of the window that ended: a client that comes to this edge
// at its limit, after one request, is decided on them from the flush after
// its second request on (which is decided without them).
func TestAKeySeenOnceIsNotReadInItsPreviousWindow(t *testing.T) {
	clock, backend, a, b := twoEdgesReadLogged(t)
	r := &Policy{Limit: 100, Window: 10 * time.Second}
	ctx := context.Background()
	const moved = 1
	for range 100 {
		a.Decide(ctx, clock.Now(), r, moved, r.Limit, 1)
	}
	a.Flush(ctx, clock.Now())
	// Half a second into the next window: about 92 of moved's 100 still
	// weigh when b has read them.
	clock.Add(10*time.Second + 500*time.Millisecond)
	decide := func(key uint64) bool { return b.Decide(ctx, clock.Now(), r, key, r.Limit, 1).Allowed }
	flush := func() {
		for range 3 { // past the grace
			clock.Add(50 * time.Millisecond)
			b.Flush(ctx, clock.Now())
		}
	}
	for k := uint64(100); k < 150; k++ {
		if !decide(k) {
			t.Fatalf("key %d: its one request refused", k)
		}
	}
	if !decide(moved) {
		t.Fatal("moved: the first request on b refused (it is decided on b's empty view)")
	}
	flush()
	for k := uint64(100); k < 150; k++ {
		if n := backend.prev[k]; n != 0 {
			t.Fatalf("key %d, seen once: %d reads of its previous window, want 0", k, n)
		}
	}
	second := b.Decide(ctx, clock.Now(), r, moved, r.Limit, 1).Estimate
	flush()
	third := b.Decide(ctx, clock.Now(), r, moved, r.Limit, 1).Estimate
	if n := backend.prev[moved]; n != 1 || third < 90 {
		t.Errorf("moved: %d reads of the window at its limit on a, want 1 (from its second decision on b); third request's estimate %.1f, want a's units counted (over 90)",
			n, third)
	}
	t.Logf("moved's estimate on b: %.1f at its second request, %.1f at its third", second, third)
}
