package window

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// simClock is a clock the test moves by hand.
type simClock struct{ t atomic.Int64 }

func newSimClock(t time.Time) *simClock { c := &simClock{}; c.t.Store(t.UnixNano()); return c }
func (c *simClock) Now() time.Time      { return time.Unix(0, c.t.Load()) }
func (c *simClock) Add(d time.Duration) { c.t.Add(int64(d)) }

// countingStore counts the ops that reach a Store and can be made to fail,
// as a dead memcached shard would.
type countingStore struct {
	store.Store
	incrs, reads, decrs atomic.Int64
	fail                atomic.Bool
}

var errDown = errors.New("store down")

func (s *countingStore) Do(ctx context.Context, ops []store.Op) {
	for i := range ops {
		switch {
		case ops[i].Delta > 0:
			s.incrs.Add(1)
		case ops[i].Delta < 0:
			s.decrs.Add(1)
		default:
			s.reads.Add(1)
		}
	}
	if s.fail.Load() {
		for i := range ops {
			ops[i].Value, ops[i].Err = 0, errDown
		}
		return
	}
	s.Store.Do(ctx, ops)
}

// t0 is a whole hour, so every window of a minute or less starts at it.
var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func newTestLimiter(t testing.TB, clock store.Clock, backend store.Store, cfg Config) *Limiter {
	t.Helper()
	cfg.Clock = clock
	l, err := New(cfg, backend)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

const perMinute = `
rules:
  - name: per-minute
    limit: 100
    window: 1m
`

func TestLimiterBurstAdmitsExactlyTheLimit(t *testing.T) {
	clock := newSimClock(t0.Add(12 * time.Second))
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{})
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("203.0.113.7"))
	allowed := 0
	var last Answer
	for i := 0; i < 150; i++ {
		d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		if d.Allowed {
			allowed++
		} else {
			last = d
		}
	}
	if allowed != 100 {
		t.Fatalf("admitted %d of a burst of 150, want 100", allowed)
	}
	// 100 admitted at one instant: released when they leave the trailing
	// window, a minute later (the key's histogram places them, to its
	// quantum of 14 ns; spread evenly they would weigh 99 1 % into the next
	// window).
	if want := t0.Add(time.Minute + 12*time.Second).UnixNano(); last.ReleaseAt < want || last.ReleaseAt >= want+histQuantum(int64(time.Minute)) {
		t.Errorf("ReleaseAt = %v, want %v", time.Unix(0, last.ReleaseAt).UTC(), time.Unix(0, want).UTC())
	}
	if last.Remaining != 0 || last.Limit != 100 {
		t.Errorf("refused decision: remaining %d limit %d, want 0 100", last.Remaining, last.Limit)
	}
}

func TestLimiterEdgesShareOneLimit(t *testing.T) {
	clock := newSimClock(t0)
	backend := &countingStore{Store: store.NewMemStore(clock)}
	r := mustRules(t, perMinute).Rules[0]
	edges := []*Limiter{
		newTestLimiter(t, clock, backend, Config{}),
		newTestLimiter(t, clock, backend, Config{}),
	}
	key := r.Hash([]byte("client"))
	// 1 request every 10 ms, alternating edges, flushing every 5 ms. An edge
	// learns the global count from the reply to its own increment, so the
	// edge that did not cross the limit admits one more before it knows:
	// over-admission is at most one request per other edge here.
	allowed := 0
	for i := 0; i < 3000; i++ { // 30 s
		if edges[i%2].Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
		for k := 0; k < 2; k++ {
			clock.Add(5 * time.Millisecond)
			for _, e := range edges {
				e.Flush(context.Background(), clock.Now())
			}
		}
	}
	if allowed < 100 || allowed > 101 {
		t.Errorf("two edges admitted %d in 30 s of one window, want the limit once globally: 100, or 101", allowed)
	}
	// The store holds what was admitted.
	ops := []store.Op{{Key: key, Start: t0.UnixMilli()}}
	backend.Store.Do(context.Background(), ops)
	if ops[0].Value != uint64(allowed) {
		t.Errorf("store counter = %d, want the %d admitted", ops[0].Value, allowed)
	}
}

func TestLimiterOverAdmissionBoundedByFlushInterval(t *testing.T) {
	// Requests every 1 ms alternating edges, flushes every 5 ms: before an
	// edge learns of the other's admissions it may admit what arrives
	// within one flush interval: about rate × interval = 5 requests.
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	r := mustRules(t, perMinute).Rules[0]
	edges := []*Limiter{newTestLimiter(t, clock, backend, Config{}), newTestLimiter(t, clock, backend, Config{})}
	key := r.Hash([]byte("client"))
	allowed := 0
	for i := 0; i < 1000; i++ {
		if edges[i%2].Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
		clock.Add(time.Millisecond)
		if i%5 == 4 {
			for _, e := range edges {
				e.Flush(context.Background(), clock.Now())
			}
		}
	}
	if allowed < 100 || allowed > 105 {
		t.Errorf("admitted %d, want between 100 and 100 + rate×flush interval = 105", allowed)
	}
}

func TestLimiterReadsPreviousWindowOnceAfterGrace(t *testing.T) {
	clock := newSimClock(t0.Add(50 * time.Second))
	backend := &countingStore{Store: store.NewMemStore(clock)}
	l := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, StoreTimeout: 100 * time.Millisecond})
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	// A new key's previous window is read once; its current window's
	// global count comes back with its first increment. Then it is only
	// incremented. Another edge counts it too (a key held by this edge
	// alone is not read again at the window's end: prevread_test.go).
	for i := 0; i < 20; i++ {
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		if i%5 == 4 {
			backend.Store.Do(context.Background(), []store.Op{{Key: key, Start: t0.UnixMilli(), Delta: 1, TTL: 2 * time.Minute}})
		}
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
	}
	if got := backend.reads.Load(); got != 1 {
		t.Errorf("reads for a new key = %d, want 1 (its previous window; the increment's reply is the current one)", got)
	}
	if got := backend.incrs.Load(); got != 20 {
		t.Errorf("increments = %d, want 20 (one per flush with traffic)", got)
	}
	// Into the next window: the previous window is read once, only after
	// the grace of one flush interval plus the store timeout.
	clock.t.Store(t0.Add(time.Minute).UnixNano())
	backend.reads.Store(0)
	for i := 0; i < 40; i++ { // 200 ms
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
		if elapsed := clock.Now().Sub(t0.Add(time.Minute)); elapsed < 105*time.Millisecond && backend.reads.Load() != 0 {
			t.Fatalf("previous window read %v into the window, before the 105ms grace", elapsed)
		}
	}
	if got := backend.reads.Load(); got != 1 {
		t.Errorf("reads of the previous window = %d, want 1", got)
	}
}

func TestLimiterNewEdgeStartsFromSharedCounters(t *testing.T) {
	clock := newSimClock(t0.Add(30 * time.Second))
	backend := store.NewMemStore(clock)
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	a := newTestLimiter(t, clock, backend, Config{})
	for i := 0; i < 90; i++ {
		a.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	}
	a.Flush(context.Background(), clock.Now())
	b := newTestLimiter(t, clock, backend, Config{})
	b.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1) // unknown yet: admitted
	b.Flush(context.Background(), clock.Now())                              // reads the shared count
	allowed := 0
	for i := 0; i < 50; i++ {
		if b.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
	}
	if allowed != 9 {
		t.Errorf("new edge admitted %d more after 91 elsewhere, want 9", allowed)
	}
}

func TestLimiterBlockCountsEveryRequest(t *testing.T) {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	l := newTestLimiter(t, clock, backend, Config{})
	r := mustRules(t, `
rules:
  - name: mitigate
    limit: 10
    window: 10s
    action: block
    timeout: 1m
`).Rules[0]
	key := r.Hash([]byte("abuser"))
	var d Answer
	for i := 0; i < 11; i++ {
		d = l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	}
	if d.Allowed {
		t.Fatal("11th request of 10 per 10s admitted")
	}
	if want := clock.Now().Add(time.Minute).UnixNano(); d.ReleaseAt != want {
		t.Errorf("block ReleaseAt = %d, want now + timeout = %d", d.ReleaseAt, want)
	}
	// The edge answers the next 89 from its block cache and records them.
	for i := 0; i < 89; i++ {
		l.Record(clock.Now(), &r.Policy, key, 1)
	}
	l.Flush(context.Background(), clock.Now())
	ops := []store.Op{{Key: key, Start: t0.UnixMilli()}}
	backend.Do(context.Background(), ops)
	if ops[0].Value != 100 {
		t.Errorf("store counter = %d, want all 100 attempts", ops[0].Value)
	}
}

func TestLimiterSyncModeIsExactAcrossEdges(t *testing.T) {
	clock := newSimClock(t0)
	backend := &countingStore{Store: store.NewMemStore(clock)}
	r := mustRules(t, `
rules:
  - name: login
    limit: 5
    window: 1m
    mode: sync
    fail: closed
`).Rules[0]
	a := newTestLimiter(t, clock, backend, Config{})
	b := newTestLimiter(t, clock, backend, Config{})
	key := r.Hash([]byte("user@example.com"))
	allowed := 0
	for i := 0; i < 20; i++ { // no flushes at all
		e := a
		if i%2 == 1 {
			e = b
		}
		if e.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1).Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("sync mode admitted %d across two edges, want exactly 5", allowed)
	}
	ops := []store.Op{{Key: key, Start: t0.UnixMilli()}}
	backend.Store.Do(context.Background(), ops)
	if ops[0].Value != 5 {
		t.Errorf("store counter = %d, want 5 (refused increments taken back)", ops[0].Value)
	}
}

func TestLimiterConcurrentUse(t *testing.T) {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	l := newTestLimiter(t, clock, backend, Config{FlushInterval: time.Millisecond})
	l.Start()
	r := mustRules(t, perMinute).Rules[0]
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				k := r.Hash([]byte{byte(i % 50)})
				if l.Decide(context.Background(), clock.Now(), &r.Policy, k, r.Limit, 1).Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := allowed.Load(); got != 50*100 {
		t.Errorf("admitted %d over 50 keys, want 5000", got)
	}
	var sum uint64
	for i := 0; i < 50; i++ {
		ops := []store.Op{{Key: r.Hash([]byte{byte(i)}), Start: t0.UnixMilli()}}
		backend.Do(context.Background(), ops)
		sum += ops[0].Value
	}
	if sum != 5000 {
		t.Errorf("store counters after Close sum to %d, want 5000", sum)
	}
}

// TestLimiterStateAlgorithms: token and leaky buckets and sliding logs
// admit their burst at one instant and release a refusal after now, and
// their state is the store's: after a flush the store's bucket (or log)
// has no room left, and no window counter was touched.
func TestLimiterStateAlgorithms(t *testing.T) {
	clock := newSimClock(t0)
	backend := &countingStore{Store: store.NewMemStore(clock)}
	l := newTestLimiter(t, clock, backend, Config{})
	rs := mustRules(t, `
rules:
  - name: bucket
    algorithm: token_bucket
    limit: 10
    window: 1s
    burst: 20
  - name: leaky
    algorithm: leaky_bucket
    limit: 10
    window: 1s
    burst: 5
  - name: log
    algorithm: sliding_log
    limit: 3
    window: 1m
`)
	for _, tc := range []struct {
		rule string
		want int // admitted of a burst of 30 at one instant
	}{{"bucket", 20}, {"leaky", 5}, {"log", 3}} {
		r := rs.Lookup(tc.rule)
		key := r.Hash([]byte("k"))
		got := 0
		var last Answer
		for i := 0; i < 30; i++ {
			d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
			if d.Allowed {
				got++
			} else {
				last = d
			}
		}
		if got != tc.want {
			t.Errorf("%s: admitted %d of a burst of 30, want %d", tc.rule, got, tc.want)
		}
		if last.ReleaseAt <= clock.Now().UnixNano() {
			t.Errorf("%s: refusal released at %d, not after now", tc.rule, last.ReleaseAt)
		}
		l.Flush(context.Background(), clock.Now())
		ops := []store.StateOp{{Kind: stateKind(r.Algorithm), Key: key, Bucket: bucketOf(&r.Policy, r.Limit), Log: logOf(&r.Policy, r.Limit), Now: clock.Now().UnixNano()}}
		backend.DoState(context.Background(), ops)
		if ops[0].Err != nil || ops[0].Remaining != 0 {
			t.Errorf("%s: the store's state after a flush: room %d, err %v; want 0, nil", tc.rule, ops[0].Remaining, ops[0].Err)
		}
	}
	if n := backend.incrs.Load() + backend.reads.Load(); n != 0 {
		t.Errorf("buckets and logs sent %d counter operations, want 0", n)
	}
}
