package window

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// simClock is a clock the test moves by hand.
type simClock struct{ t atomic.Int64 }

func newSimClock(t time.Time) *simClock { c := &simClock{}; c.t.Store(t.UnixNano()); return c }
func (c *simClock) Now() time.Time      { return time.Unix(0, c.t.Load()) }
func (c *simClock) Add(d time.Duration) { c.t.Add(int64(d)) }

// countingStore counts the ops that reach a Store and can be made to fail,
// as a dead memcached shard would.
type countingStore struct {
	Store
	incrs, reads, decrs atomic.Int64
	fail                atomic.Bool
}

var errDown = errors.New("store down")

func (s *countingStore) Do(ctx context.Context, ops []Op) {
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

func newTestLimiter(t testing.TB, clock Clock, store Store, cfg Config) *Limiter {
	t.Helper()
	cfg.Clock = clock
	l, err := New(cfg, store)
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
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{})
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("203.0.113.7"))
	allowed := 0
	var last Decision
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
	store := &countingStore{Store: NewMemStore(clock)}
	r := mustRules(t, perMinute).Rules[0]
	edges := []*Limiter{
		newTestLimiter(t, clock, store, Config{}),
		newTestLimiter(t, clock, store, Config{}),
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
	ops := []Op{{Key: key, Start: t0.UnixMilli()}}
	store.Store.Do(context.Background(), ops)
	if ops[0].Value != uint64(allowed) {
		t.Errorf("store counter = %d, want the %d admitted", ops[0].Value, allowed)
	}
}

func TestLimiterOverAdmissionBoundedByFlushInterval(t *testing.T) {
	// Requests every 1 ms alternating edges, flushes every 5 ms: before an
	// edge learns of the other's admissions it may admit what arrives
	// within one flush interval: about rate × interval = 5 requests.
	clock := newSimClock(t0)
	store := NewMemStore(clock)
	r := mustRules(t, perMinute).Rules[0]
	edges := []*Limiter{newTestLimiter(t, clock, store, Config{}), newTestLimiter(t, clock, store, Config{})}
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
	store := &countingStore{Store: NewMemStore(clock)}
	l := newTestLimiter(t, clock, store, Config{FlushInterval: 5 * time.Millisecond, StoreTimeout: 100 * time.Millisecond})
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	// A new key's previous window is read once; its current window's
	// global count comes back with its first increment. Then it is only
	// incremented.
	for i := 0; i < 20; i++ {
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
	}
	if got := store.reads.Load(); got != 1 {
		t.Errorf("reads for a new key = %d, want 1 (its previous window; the increment's reply is the current one)", got)
	}
	if got := store.incrs.Load(); got != 20 {
		t.Errorf("increments = %d, want 20 (one per flush with traffic)", got)
	}
	// Into the next window: the previous window is read once, only after
	// the grace of one flush interval plus the store timeout.
	clock.t.Store(t0.Add(time.Minute).UnixNano())
	store.reads.Store(0)
	for i := 0; i < 40; i++ { // 200 ms
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
		if elapsed := clock.Now().Sub(t0.Add(time.Minute)); elapsed < 105*time.Millisecond && store.reads.Load() != 0 {
			t.Fatalf("previous window read %v into the window, before the 105ms grace", elapsed)
		}
	}
	if got := store.reads.Load(); got != 1 {
		t.Errorf("reads of the previous window = %d, want 1", got)
	}
}

func TestLimiterNewEdgeStartsFromSharedCounters(t *testing.T) {
	clock := newSimClock(t0.Add(30 * time.Second))
	store := NewMemStore(clock)
	r := mustRules(t, perMinute).Rules[0]
	key := r.Hash([]byte("k"))
	a := newTestLimiter(t, clock, store, Config{})
	for i := 0; i < 90; i++ {
		a.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
	}
	a.Flush(context.Background(), clock.Now())
	b := newTestLimiter(t, clock, store, Config{})
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
	store := NewMemStore(clock)
	l := newTestLimiter(t, clock, store, Config{})
	r := mustRules(t, `
rules:
  - name: mitigate
    limit: 10
    window: 10s
    action: block
    timeout: 1m
`).Rules[0]
	key := r.Hash([]byte("abuser"))
	var d Decision
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
	ops := []Op{{Key: key, Start: t0.UnixMilli()}}
	store.Do(context.Background(), ops)
	if ops[0].Value != 100 {
		t.Errorf("store counter = %d, want all 100 attempts", ops[0].Value)
	}
}

func TestLimiterSyncModeIsExactAcrossEdges(t *testing.T) {
	clock := newSimClock(t0)
	store := &countingStore{Store: NewMemStore(clock)}
	r := mustRules(t, `
rules:
  - name: login
    limit: 5
    window: 1m
    mode: sync
    fail: closed
`).Rules[0]
	a := newTestLimiter(t, clock, store, Config{})
	b := newTestLimiter(t, clock, store, Config{})
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
	ops := []Op{{Key: key, Start: t0.UnixMilli()}}
	store.Store.Do(context.Background(), ops)
	if ops[0].Value != 5 {
		t.Errorf("store counter = %d, want 5 (refused increments taken back)", ops[0].Value)
	}
}

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
	store := &countingStore{Store: NewMemStore(clock)}
	l := newTestLimiter(t, clock, store, Config{})
	store.fail.Store(true)
	want := map[string]Fallback{"open-async": FallbackOpen, "closed-async": FallbackClosed, "open-sync": FallbackOpen, "closed-sync": FallbackClosed}
	for _, r := range rs.Rules {
		key := r.Hash([]byte("k"))
		l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		l.Flush(context.Background(), clock.Now()) // async learns the store is down
		d := l.Decide(context.Background(), clock.Now(), &r.Policy, key, r.Limit, 1)
		if d.Fallback != want[r.Name] || d.Allowed != (want[r.Name] == FallbackOpen) {
			t.Errorf("%s with the store down: fallback %d allowed %v, want %d %v", r.Name, d.Fallback, d.Allowed, want[r.Name], want[r.Name] == FallbackOpen)
		}
	}
	// Pending increments survive the outage and land when it ends.
	store.fail.Store(false)
	l.Flush(context.Background(), clock.Now())
	r := rs.Rules[0]
	ops := []Op{{Key: r.Hash([]byte("k")), Start: t0.UnixMilli()}}
	store.Store.Do(context.Background(), ops)
	if ops[0].Value != 2 {
		t.Errorf("open-async counter after recovery = %d, want the 2 requests admitted during the outage", ops[0].Value)
	}
	d := l.Decide(context.Background(), clock.Now(), &rs.Rules[1].Policy, rs.Rules[1].Hash([]byte("k")), 5, 1)
	l.Flush(context.Background(), clock.Now())
	d = l.Decide(context.Background(), clock.Now(), &rs.Rules[1].Policy, rs.Rules[1].Hash([]byte("k")), 5, 1)
	if d.Fallback != FallbackNone || !d.Allowed {
		t.Errorf("closed-async after recovery: fallback %d allowed %v, want none, true", d.Fallback, d.Allowed)
	}
}

func TestLimiterMemoryIsBounded(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{MaxKeys: 1024, Shards: 4})
	r := mustRules(t, perMinute).Rules[0]
	var key [8]byte
	for i := 0; i < 100_000; i++ {
		key[0], key[1], key[2] = byte(i), byte(i>>8), byte(i>>16)
		l.Decide(context.Background(), clock.Now(), &r.Policy, r.Hash(key[:]), r.Limit, 1)
		if i%1000 == 0 {
			clock.Add(5 * time.Millisecond)
			l.Flush(context.Background(), clock.Now())
		}
	}
	if n := l.Keys(); n > 1024 {
		t.Errorf("a flood of 100,000 keys left %d views, want at most MaxKeys = 1024", n)
	}
	for i := range l.shards {
		s := &l.shards[i]
		if len(s.slab) > s.max || cap(s.slab) > s.max {
			t.Errorf("shard slab len %d cap %d over its bound %d", len(s.slab), cap(s.slab), s.max)
		}
	}
	// Idle keys go after two windows.
	for i := 0; i < 200; i++ {
		clock.Add(time.Second)
		l.Flush(context.Background(), clock.Now())
	}
	if n := l.Keys(); n != 0 {
		t.Errorf("%d views left after 200 s idle, want 0", n)
	}
}

func TestLimiterConcurrentUse(t *testing.T) {
	clock := newSimClock(t0)
	store := NewMemStore(clock)
	l := newTestLimiter(t, clock, store, Config{FlushInterval: time.Millisecond})
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
		ops := []Op{{Key: r.Hash([]byte{byte(i)}), Start: t0.UnixMilli()}}
		store.Do(context.Background(), ops)
		sum += ops[0].Value
	}
	if sum != 5000 {
		t.Errorf("store counters after Close sum to %d, want 5000", sum)
	}
}

func TestLimiterDecideDoesNotAllocate(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{})
	rs := mustRules(t, `
rules:
  - name: big
    limit: 1000000000
    window: 1m
  - name: block
    limit: 1
    window: 1m
    action: block
`)
	key := rs.Rules[0].Hash([]byte("k"))
	l.Decide(context.Background(), clock.Now(), &rs.Rules[0].Policy, key, rs.Rules[0].Limit, 1)
	now := clock.Now()
	if n := testing.AllocsPerRun(1000, func() {
		l.Decide(context.Background(), now, &rs.Rules[0].Policy, key, rs.Rules[0].Limit, 1)
	}); n != 0 {
		t.Errorf("async Decide: %v allocs/op, want 0", n)
	}
	bk := rs.Rules[1].Hash([]byte("k"))
	if n := testing.AllocsPerRun(1000, func() { l.Record(now, &rs.Rules[1].Policy, bk, 1) }); n != 0 {
		t.Errorf("Record: %v allocs/op, want 0", n)
	}
}

func BenchmarkDecideAsync(b *testing.B) {
	clock := newSimClock(t0)
	l := newTestLimiter(b, clock, NewMemStore(clock), Config{})
	r := mustRules(b, "rules: [{name: b, limit: 1000000000, window: 1m}]").Rules[0]
	key := r.Hash([]byte("203.0.113.7"))
	now := clock.Now()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l.Decide(ctx, now, &r.Policy, key, r.Limit, 1)
	}
}

func BenchmarkDecideAsyncParallel(b *testing.B) {
	clock := newSimClock(t0)
	l := newTestLimiter(b, clock, NewMemStore(clock), Config{})
	r := mustRules(b, "rules: [{name: b, limit: 1000000000, window: 1m}]").Rules[0]
	keys := make([]uint64, 1024)
	for i := range keys {
		keys[i] = r.Hash([]byte{byte(i), byte(i >> 8)})
	}
	now := clock.Now()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.Decide(ctx, now, &r.Policy, keys[i&1023], r.Limit, 1)
			i++
		}
	})
}

// TestLimiterStateAlgorithms: token and leaky buckets and sliding logs
// admit their burst at one instant and release a refusal after now, and
// their state is the store's: after a flush the store's bucket (or log)
// has no room left, and no window counter was touched.
func TestLimiterStateAlgorithms(t *testing.T) {
	clock := newSimClock(t0)
	store := &countingStore{Store: NewMemStore(clock)}
	l := newTestLimiter(t, clock, store, Config{})
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
		var last Decision
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
		ops := []StateOp{{Kind: stateKind(r.Algorithm), Key: key, Bucket: bucketOf(&r.Policy, r.Limit), Log: logOf(&r.Policy, r.Limit), Now: clock.Now().UnixNano()}}
		store.DoState(context.Background(), ops)
		if ops[0].Err != nil || ops[0].Remaining != 0 {
			t.Errorf("%s: the store's state after a flush: room %d, err %v; want 0, nil", tc.rule, ops[0].Remaining, ops[0].Err)
		}
	}
	if n := store.incrs.Load() + store.reads.Load(); n != 0 {
		t.Errorf("buckets and logs sent %d counter operations, want 0", n)
	}
}

// TestFlusherBacksOffWhileTheStoreIsDown runs the real flusher against a
// store that fails everything: it must not retry every FlushInterval.
func TestFlusherBacksOffWhileTheStoreIsDown(t *testing.T) {
	store := &countingStore{Store: NewMemStore(nil)}
	store.fail.Store(true)
	l := newTestLimiter(t, SystemClock, store, Config{FlushInterval: time.Millisecond})
	r := mustRules(t, perMinute).Rules[0]
	now := time.Now()
	for i := 0; i < 100; i++ {
		l.Decide(context.Background(), now, &r.Policy, r.Hash([]byte{byte(i)}), r.Limit, 1)
	}
	l.Start()
	time.Sleep(300 * time.Millisecond)
	// Backing off 1, 2, 4 … ms, 300 ms hold about 9 attempts; without the
	// backoff there would be about 300.
	if n := store.incrs.Load() / 100; n > 30 {
		t.Errorf("%d flush attempts in 300 ms against a dead store, want a backoff (about 9)", n)
	}
	store.fail.Store(false)
	time.Sleep(1200 * time.Millisecond) // the longest backoff
	ops := []Op{{Key: r.Hash([]byte{7}), Start: windowStart(now.UnixNano(), int64(time.Minute)) / 1e6}}
	store.Store.Do(context.Background(), ops)
	if ops[0].Value != 1 {
		t.Errorf("counter after the store came back = %d, want the 1 pending increment", ops[0].Value)
	}
}

// TestFloodDoesNotEvictReturningKeys floods a small key table with
// one-request keys while a few keys keep coming back: the returning keys
// keep their views (a key evicted and recreated would forget what it had
// admitted).
func TestFloodDoesNotEvictReturningKeys(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{MaxKeys: 4096, Shards: 4})
	r := mustRules(t, perMinute).Rules[0]
	legit := []uint64{r.Hash([]byte("a")), r.Hash([]byte("b")), r.Hash([]byte("c"))}
	admitted := make([]int, len(legit))
	var key [8]byte
	for i := 0; i < 200_000; i++ {
		key[0], key[1], key[2], key[3] = byte(i), byte(i>>8), byte(i>>16), 0xfe
		l.Decide(context.Background(), clock.Now(), &r.Policy, r.Hash(key[:]), r.Limit, 1)
		if i%100 == 0 {
			for j, k := range legit {
				if l.Decide(context.Background(), clock.Now(), &r.Policy, k, r.Limit, 1).Allowed {
					admitted[j]++
				}
			}
		}
		if i%1000 == 999 {
			clock.Add(5 * time.Millisecond)
			l.Flush(context.Background(), clock.Now())
		}
	}
	// 2,000 attempts each within one minute against a limit of 100.
	for j, n := range admitted {
		if n != 100 {
			t.Errorf("returning key %d admitted %d under a flood, want its limit of 100 (evicted views forget)", j, n)
		}
	}
}

// BenchmarkFlush measures one flush of the async path as the flusher runs
// it under load: 10,000 keys known, 200 decisions over 150 of them between
// two flushes 5 ms apart (about 40,000 decisions a second), a memory store.
// ns/op is per flush; the idle sweep's share of it is what sweepEvery
// bounds.
func BenchmarkFlush(b *testing.B) {
	clock := newSimClock(t0)
	l := newTestLimiter(b, clock, NewMemStore(clock), Config{})
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
	*MemStore
	mu    sync.Mutex
	hints []bool // one per increment, in order
}

func (s *hintStore) Do(ctx context.Context, ops []Op) {
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
	store := &hintStore{MemStore: NewMemStore(clock)}
	l := newTestLimiter(t, clock, store, Config{FlushInterval: 5 * time.Millisecond, NewKeyWait: -1})
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
	if want := []bool{true, false, false, true, false}; !slices.Equal(store.hints, want) {
		t.Errorf("hints of a key's increments, flush by flush (3 in one window, 2 in the next): %v, want %v", store.hints, want)
	}
}
