package window

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNewEdgeBurstIsLimitedBySharedCount: a client has 90 of its 100
// admitted on one edge; a burst of 40 at once to an edge that has never seen
// it gets 10, not 40: the first request is decided from this edge's count of
// zero, the others wait for the read of the shared count (one flush).
func TestNewEdgeBurstIsLimitedBySharedCount(t *testing.T) {
	clock := newSimClock(t0.Add(30 * time.Second))
	backend := store.NewMemStore(clock)
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	a := newTestLimiter(t, clock, backend, Config{})
	for range 90 {
		a.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	}
	a.Flush(context.Background(), clock.Now())

	reg := prometheus.NewRegistry()
	b := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, Registerer: reg})
	b.Start()
	var allowed, fallbacks atomic.Int64
	for _, d := range atOnce(40, func() Answer { return b.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1) }) {
		if d.Allowed {
			allowed.Add(1)
		}
		if d.Fallback != store.FallbackNone {
			fallbacks.Add(1)
		}
	}
	if allowed.Load() != 10 || fallbacks.Load() != 0 {
		t.Errorf("a fresh edge admitted %d of a burst of 40 (%d fallbacks) after 90 elsewhere, want 10 (0)", allowed.Load(), fallbacks.Load())
	}
	waited := testutil.ToFloat64(b.m.newKeyRead)
	timedOut := testutil.ToFloat64(b.m.newKeyTimeout)
	t.Logf("burst of 40: %d admitted; %v waited for the read, %v timed out", allowed.Load(), waited, timedOut)
	if timedOut != 0 {
		t.Errorf("%v waits timed out on a working store", timedOut)
	}
}

// atOnce makes n decisions from as many goroutines released together,
// and returns them.
func atOnce(n int, decide func() Answer) []Answer {
	out := make([]Answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = decide()
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// TestNewKeyRefusedLocallyDoesNotWait: when this edge's own count already
// refuses a request, the shared count cannot change that, so the request is
// refused at once, even while the store hangs: a flood of keys that each try
// twice is not slowed to the store's pace.
func TestNewKeyRefusedLocallyDoesNotWait(t *testing.T) {
	backend := &hangingStore{}
	l := newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond, StoreTimeout: time.Second, NewKeyWait: time.Second})
	l.Start()
	r := mustRules(t, "rules: [{name: login, limit: 1, window: 1m}]").Rules[0]
	key := r.Hash([]byte("k"))
	if d := l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1); !d.Allowed {
		t.Fatal("first request of a new key refused")
	}
	// Every wait for a new key's read is counted, by how it ended: none
	// may have begun.
	if d := l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1); d.Allowed {
		t.Errorf("second request: allowed, want refused by this edge's own count")
	}
	if n := testutil.ToFloat64(l.m.newKeyRead) + testutil.ToFloat64(l.m.newKeyTimeout); n != 0 {
		t.Errorf("%v requests waited for the hung store, want none", n)
	}
}

// TestNewKeyWaitIsBounded: with the store hung, a request that would wait
// for a new key's read waits at most NewKeyWait, and is then decided by the
// rule's failure policy once the store's timeout has marked the key failed,
// or from this edge's count.
//
// The store holds every call until the test ends, so that the wait can
// only have ended by NewKeyWait: no store call has answered when the
// request is decided.
func TestNewKeyWaitIsBounded(t *testing.T) {
	backend := newHeldStore()
	reg := prometheus.NewRegistry()
	l := newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond, StoreTimeout: time.Minute,
		NewKeyWait: 30 * time.Millisecond, Registerer: reg})
	t.Cleanup(backend.release) // before the limiter closes
	l.Start()
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1)
	begin := time.Now()
	d := l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1)
	took := time.Since(begin)
	if !d.Allowed || took < 30*time.Millisecond {
		t.Errorf("second request: allowed %v after %v, want admitted from this edge's count after the 30ms wait", d.Allowed, took)
	}
	if n := backend.answered.Load(); n != 0 {
		t.Errorf("store calls answered before the request was decided: %d, want 0 (the store holds them all)", n)
	}
	if n := testutil.ToFloat64(l.m.newKeyTimeout); n != 1 {
		t.Errorf("timed-out waits = %v, want 1", n)
	}
	if n := testutil.ToFloat64(l.m.newKeyRead); n != 0 {
		t.Errorf("waits ended by a read = %v, want 0", n)
	}
}

// heldStore holds every call until release (or the call's context
// ends), counting the calls it answered.
type heldStore struct {
	held     chan struct{}
	once     sync.Once
	answered atomic.Int64
}

func newHeldStore() *heldStore { return &heldStore{held: make(chan struct{})} }

func (s *heldStore) release() { s.once.Do(func() { close(s.held) }) }

func (s *heldStore) wait(ctx context.Context) error {
	defer s.answered.Add(1)
	select {
	case <-s.held:
		return errHeld
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errHeld = errors.New("held store released")

func (s *heldStore) Do(ctx context.Context, ops []store.Op) {
	err := s.wait(ctx)
	for i := range ops {
		ops[i].Err = err
	}
}

func (s *heldStore) DoState(ctx context.Context, ops []store.StateOp) {
	err := s.wait(ctx)
	for i := range ops {
		ops[i].Err = err
	}
}

func (s *heldStore) Healthy() bool    { return true }
func (s *heldStore) Whole() bool      { return true }
func (s *heldStore) Parts() int       { return 0 }
func (s *heldStore) Place(uint64) int { return -1 }

// hangingStore answers nothing until the call's context ends, as a shard
// that stopped answering without closing its connections.
type hangingStore struct{}

func (hangingStore) Do(ctx context.Context, ops []store.Op) {
	<-ctx.Done()
	for i := range ops {
		ops[i].Err = ctx.Err()
	}
}

func (hangingStore) DoState(ctx context.Context, ops []store.StateOp) {
	<-ctx.Done()
	for i := range ops {
		ops[i].Err = ctx.Err()
	}
}

// It cannot tell that it hangs, and does not place its keys.
func (hangingStore) Healthy() bool    { return true }
func (hangingStore) Whole() bool      { return true }
func (hangingStore) Parts() int       { return 0 }
func (hangingStore) Place(uint64) int { return -1 }

// batchStore records the largest batch it was handed.
type batchStore struct {
	store.Store
	mu      sync.Mutex
	calls   int
	largest int
}

func (s *batchStore) Do(ctx context.Context, ops []store.Op) {
	s.mu.Lock()
	s.calls++
	s.largest = max(s.largest, len(ops))
	s.mu.Unlock()
	s.Store.Do(ctx, ops)
}

// TestFlushBatchesAreBounded: 10,000 keys queued for one flush go to the
// store in batches of at most MaxFlushOps (plus the rest of one key's ops),
// and every increment arrives.
func TestFlushBatchesAreBounded(t *testing.T) {
	clock := newSimClock(t0.Add(30 * time.Second))
	mem := store.NewMemStore(clock)
	backend := &batchStore{Store: mem}
	l := newTestLimiter(t, clock, backend, Config{MaxFlushOps: 100, Shards: 4})
	r := mustRules(t, perMinute).Rules[0]
	const keys = 10000
	for i := range keys {
		l.Decide(context.Background(), clock.Now(), &r.Policy, uint64(i)*0x9e3779b97f4a7c15, r.Limit, 1)
	}
	st := l.Flush(context.Background(), clock.Now())
	if st.Keys != keys || st.Failed != 0 {
		t.Errorf("flush: %+v, want %d keys, none failed", st, keys)
	}
	if backend.largest > 102 || backend.calls < st.Ops/102 {
		t.Errorf("%d ops in %d batches, the largest %d: want at most 100 + 2 each", st.Ops, backend.calls, backend.largest)
	}
	for i := range keys {
		ops := []store.Op{{Key: uint64(i) * 0x9e3779b97f4a7c15, Start: t0.UnixMilli()}}
		mem.Do(context.Background(), ops)
		if ops[0].Value != 1 {
			t.Fatalf("key %d: store counter %d, want 1", i, ops[0].Value)
		}
	}
	t.Logf("%d keys: %d ops in %d batches of at most %d", keys, st.Ops, backend.calls, backend.largest)
}

// TestReturningKeyDoesNotWait: a key back after a window or more without
// requests starts over like a new one: its first request is decided at
// once, never waiting for the store.
func TestReturningKeyDoesNotWait(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, hangingStore{}, Config{FlushInterval: time.Millisecond, StoreTimeout: time.Second, NewKeyWait: time.Second})
	l.Start()
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	clock.Add(3 * time.Minute)
	d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	if !d.Allowed {
		t.Errorf("first request after 3 idle windows: refused, want admitted")
	}
	if n := testutil.ToFloat64(l.m.newKeyRead) + testutil.ToFloat64(l.m.newKeyTimeout); n != 0 {
		t.Errorf("%v requests waited for the hung store, want none", n)
	}
}

// TestSyncRereadsPreviousWindowWithinGrace: a sync decision at the start of
// a window reads the previous window's count; an increment for it that
// lands later within the grace (another edge's request decided just before
// the window ended) is seen by the next decision, which reads it again.
func TestSyncRereadsPreviousWindowWithinGrace(t *testing.T) {
	clock := newSimClock(t0.Add(time.Minute)) // a window starts
	backend := store.NewMemStore(clock)
	r := mustRules(t, "rules: [{name: s, limit: 10, window: 1m, mode: sync}]").Rules[0]
	key := r.Hash([]byte("k"))
	// 8 admitted in the previous window, spread over it.
	ops := []store.Op{{Key: key, Start: t0.UnixMilli(), Delta: 8, TTL: 2 * time.Minute}}
	backend.Do(context.Background(), ops)
	l := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, StoreTimeout: 100 * time.Millisecond})
	// At the window's start the estimate is 8 + this one: admitted.
	if d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1); !d.Allowed {
		t.Fatal("first request of the window refused with 8 of 10 in the previous one")
	}
	// Another edge's increment for the previous window lands now.
	ops = []store.Op{{Key: key, Start: t0.UnixMilli(), Delta: 1, TTL: 2 * time.Minute}}
	backend.Do(context.Background(), ops)
	clock.Add(10 * time.Millisecond) // within the 105 ms grace
	// 9 × (1 − 10ms/1m) + 1 + this one > 10: refused, if the previous
	// window was read again (with the 8 first read, 9.999: admitted).
	if d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1); d.Allowed {
		t.Error("second request admitted: the previous window's late increment was not read")
	}
}

// TestSyncRefusalDoesNotInflateTheCount: a refused sync throttle increments
// the shared counter and takes its increment back; the edge must not
// remember the count with the refused request in it, or the next window
// weighs a previous window one request larger than what was admitted.
func TestSyncRefusalDoesNotInflateTheCount(t *testing.T) {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	r := mustRules(t, "rules: [{name: s, limit: 4, window: 1m, mode: sync}]").Rules[0]
	key := r.Hash([]byte("k"))
	l := newTestLimiter(t, clock, backend, Config{})
	allowed := 0
	for i := range 5 {
		if i == 2 {
			clock.Add(40 * time.Second)
		}
		if l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
	}
	if allowed != 4 {
		t.Fatalf("first window: %d admitted of 5 under a limit of 4", allowed)
	}
	// Two were admitted at 0 s and two at 40 s (the fifth refused). Half
	// way through the next window the previous one weighs the two at 40 s:
	// two more fit under 4 (a previous window counted as 5 lets one).
	clock.Add(50 * time.Second)
	allowed = 0
	for range 5 {
		if l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("half way through the next window: %d admitted, want 2", allowed)
	}
}

// TestNewKeyDoesNotWaitForADeadStore: while every operation fails and the
// flusher backs off, no read would answer a waiting request, so none waits.
func TestNewKeyDoesNotWaitForADeadStore(t *testing.T) {
	backend := &countingStore{Store: store.NewMemStore(nil)}
	backend.fail.Store(true)
	l := newTestLimiter(t, store.SystemClock, backend, Config{FlushInterval: time.Millisecond, NewKeyWait: time.Second})
	l.Start()
	r := mustRules(t, perMinute).Rules[0]
	// Let the flusher find the store down and back off to a quarter second
	// or more (1, 2, 4, … ms): a waiting request would wait that long.
	l.Decide(context.Background(), time.Now(), &r.Policy, r.Hash([]byte("warm")), r.Limit, 1)
	waitUntil(t, func() bool { return testutil.ToFloat64(l.m.flushBackoffs) >= 9 })
	key := r.Hash([]byte("k"))
	l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1)
	if d := l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1); !d.Allowed {
		t.Errorf("second request of a new key with the store down: refused, want admitted (fail open)")
	}
	if n := testutil.ToFloat64(l.m.newKeyRead) + testutil.ToFloat64(l.m.newKeyTimeout); n != 0 {
		t.Errorf("%v requests waited for the dead store, want none", n)
	}
}

// waitUntil polls cond every millisecond for up to 5 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNewEdgeBurstCountsThePreviousWindow: a client admitted to its limit
// late in a window on one edge bursts at once on another early in the
// next. The requests that wait for the new key's read get the previous
// window's count too, not only the current one's: a handful of the 40 are
// admitted (the estimate's room), not all (a fresh limit).
func TestNewEdgeBurstCountsThePreviousWindow(t *testing.T) {
	clock := newSimClock(t0.Add(9 * time.Second)) // t0 starts a 10 s window
	backend := store.NewMemStore(clock)
	r := &Policy{Limit: 100, Window: 10 * time.Second}
	const key = 7
	a := newTestLimiter(t, clock, backend, Config{})
	for range 100 {
		a.Decide(context.Background(), clock.Now(), r, key, r.Limit, 1)
	}
	a.Flush(context.Background(), clock.Now())
	// 0.5 s into the next window: 95 of the 100 still weigh.
	clock.Add(1500 * time.Millisecond)

	b := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond})
	b.Start()
	var allowed atomic.Int64
	for _, d := range atOnce(40, func() Answer { return b.Decide(context.Background(), clock.Now(), r, key, r.Limit, 1) }) {
		if d.Allowed {
			allowed.Add(1)
		}
	}
	if n := allowed.Load(); n > 7 {
		t.Errorf("a fresh edge admitted %d of a burst of 40 from a client at its limit in the window before, want at most 7 (5 of room, the first request, one for rounding)", n)
	}
	t.Logf("%d of the burst admitted", allowed.Load())
}
