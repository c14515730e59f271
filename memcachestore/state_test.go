package memcachestore_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
	"github.com/prometheus/client_golang/prometheus"
)

// These tests run Store.DoState against real memcached shards
// (internal/testenv), several edges (a shardproxy.Client and a
// Store each) sharing them, as the edges of a PoP do.

// stateTimeout is the Timeout of clients in tests that are not about
// timeouts: long enough for a loaded machine and the race detector.
const stateTimeout = 2 * time.Second

// stateClient returns a client over addrs, closed at cleanup.
func stateClient(t testing.TB, addrs []string, timeout time.Duration) *shardproxy.Client {
	t.Helper()
	servers := make([]shardproxy.Server, len(addrs))
	for i, a := range addrs {
		servers[i] = shardproxy.Server{Addr: a}
	}
	c, err := shardproxy.New(shardproxy.Config{Servers: servers, Timeout: timeout}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stateEdges returns n stores, each over a client of its own to addrs,
// counting in reg (when not nil).
func stateEdges(t testing.TB, n int, addrs []string, reg prometheus.Registerer) []*memcachestore.Store {
	t.Helper()
	stores := make([]*memcachestore.Store, n)
	for i := range stores {
		s, err := memcachestore.New(stateClient(t, addrs, stateTimeout), reg)
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	return stores
}

// admission is one admitted op: the caller's instant, when DoState
// returned, and what the store answered.
type admission struct {
	now, end  int64
	remaining int64
	releaseAt int64
}

// runEdges has every store decide conditional ops made by mk, one unit
// each, as fast as it can (a millisecond apart) for d of real time, and
// returns the admitted ops sorted by instant, the attempts, and the ops
// that failed (none is admitted).
func runEdges(t *testing.T, stores []*memcachestore.Store, d time.Duration, mk func(now int64) window.StateOp) (admitted []admission, attempts, failed int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for _, s := range stores {
		wg.Go(func() {
			for time.Now().Before(stop) {
				now := time.Now().UnixNano()
				ops := []window.StateOp{mk(now)}
				s.DoState(context.Background(), ops)
				end := time.Now().UnixNano()
				op := &ops[0]
				mu.Lock()
				attempts++
				switch {
				case op.Err != nil:
					failed++
					if !errors.Is(op.Err, memcachestore.ErrContention) {
						t.Errorf("op at %d: %v", now, op.Err)
					}
					if op.Allowed {
						t.Errorf("op at %d failed (%v) but is allowed", now, op.Err)
					}
				case op.Allowed:
					admitted = append(admitted, admission{now, end, op.Remaining, op.ReleaseAt})
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	slices.SortFunc(admitted, func(a, b admission) int { return int(a.now - b.now) })
	return admitted, attempts, failed
}

// TestStateGCRAEdges: six edges take one unit at a time from one shared
// token bucket (burst 20, 10 a second) on three shards for two seconds:
// in every interval [t1, t2] of the instants admitted, at most
// 20 + 10·(t2 − t1) were (+1 for rounding), and the bucket was kept busy.
func TestStateGCRAEdges(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	stores := stateEdges(t, 6, addrs, nil)
	const burst, rate = 20, 10
	lb := window.LeakyBucket{Rate: rate, Per: time.Second, Capacity: burst}
	key := rand.Uint64()
	const d = 2 * time.Second
	admitted, attempts, failed := runEdges(t, stores, d, func(now int64) window.StateOp {
		return window.StateOp{Kind: window.StateGCRA, Key: key, Bucket: lb, Now: now, N: 1, Conditional: true}
	})
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			span := float64(admitted[j].now-admitted[i].now) / 1e9
			if n := float64(j - i + 1); n > burst+rate*span+1 {
				t.Fatalf("%v admitted in %.3fs (instants %d..%d), more than %v + %v/s", n, span, i, j, burst, rate)
			}
		}
	}
	if len(admitted) > 0 {
		for i, a := range admitted {
			if a.remaining < 0 || a.remaining > burst-1 {
				t.Errorf("admission %d: %d remaining, want 0..%d", i, a.remaining, burst-1)
			}
		}
	}
	// The bucket refills at 10/s and six edges ask every millisecond or so:
	// nearly all of burst + rate·d is taken.
	if low := burst + rate*d.Seconds()/2; float64(len(admitted)) < low {
		t.Errorf("admitted %d over %v, want at least %v of the %v available", len(admitted), d, low, burst+rate*d.Seconds())
	}
	t.Logf("%d of %d attempts admitted, %d failed on contention", len(admitted), attempts, failed)
}

// TestStateLogEdges: six edges log one unit at a time in one shared
// sliding log (5 per 500ms) for two seconds: no window of 500ms holds
// more than 5 admitted, and the store's count agrees with an in-memory
// window.SlidingLog fed the instants admitted.
//
// A log treats an op whose instant is earlier than one already logged as
// happening at that latest instant (an edge whose cas lost retries with its
// own instant), so an op takes effect at an instant between its own and
// when DoState returned: the checks allow for that latency, L, and no
// more.
func TestStateLogEdges(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	stores := stateEdges(t, 6, addrs, nil)
	sl := window.SlidingLog{Limit: 5, Window: 500 * time.Millisecond}
	key := rand.Uint64()
	const d = 2 * time.Second
	admitted, attempts, failed := runEdges(t, stores, d, func(now int64) window.StateOp {
		return window.StateOp{Kind: window.StateLog, Key: key, Log: sl, Now: now, N: 1, Conditional: true}
	})
	var lat int64
	for _, a := range admitted {
		lat = max(lat, a.end-a.now)
	}
	w := int64(sl.Window)
	for i := 0; i+int(sl.Limit) < len(admitted); i++ {
		j := i + int(sl.Limit)
		if span := admitted[j].now - admitted[i].now; span < w-lat {
			t.Fatalf("%d admitted within %v (instants %d..%d, latency at most %v), want at most %d per %v",
				sl.Limit+1, time.Duration(span), i, j, time.Duration(lat), sl.Limit, sl.Window)
		}
	}
	for i, a := range admitted {
		// While one more fits, ReleaseAt is the instant the op took
		// effect at.
		if a.remaining > 0 && (a.releaseAt < a.now || a.releaseAt > a.end) {
			t.Errorf("admission %d at %d: took effect at %d, not between its instant and %d", i, a.now, a.releaseAt, a.end)
		}
		if a.remaining < 0 || a.remaining >= sl.Limit {
			t.Errorf("admission %d: %d remaining, want 0..%d", i, a.remaining, sl.Limit-1)
		}
	}
	if low := int(sl.Limit) * int(d/sl.Window) * 3 / 4; len(admitted) < low {
		t.Errorf("admitted %d over %v, want at least %d", len(admitted), d, low)
	}

	// The store's count at a read instant whose window's start is no
	// admitted op's (give or take L) equals the in-memory log's.
	var ref window.SlidingLogState
	for _, a := range admitted {
		sl.Add(&ref, a.now, 1)
	}
	read := time.Now().UnixNano()
	for settled := false; !settled; {
		settled = true
		for _, a := range admitted {
			if start := read - w; start >= a.now-int64(time.Millisecond) && start <= a.now+lat+int64(time.Millisecond) {
				read, settled = a.now+lat+int64(time.Millisecond)+w+1, false
			}
		}
	}
	ops := []window.StateOp{{Kind: window.StateLog, Key: key, Log: sl, Now: read}}
	stores[0].DoState(context.Background(), ops)
	if ops[0].Err != nil {
		t.Fatal(ops[0].Err)
	}
	if want := sl.Remaining(&ref, read); ops[0].Remaining != want {
		t.Errorf("at the end: the store has %d remaining, the in-memory log fed the %d admitted %d", ops[0].Remaining, len(admitted), want)
	}
	t.Logf("%d of %d attempts admitted, %d failed on contention, latency up to %v", len(admitted), attempts, failed, time.Duration(lat))
}

// TestStateMatchesAlgorithms: three edges take turns deciding ops on one
// bucket and one log on three shards, on a clock of their own that moves
// by random steps: every answer is the one the in-memory algorithm gives
// for the same instants, and a call's ops on one key apply in order.
func TestStateMatchesAlgorithms(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	stores := stateEdges(t, 3, addrs, nil)
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	sl := window.SlidingLog{Limit: 5, Window: 500 * time.Millisecond}
	rng := rand.New(rand.NewPCG(7, 8))
	key := rng.Uint64()
	var bucket window.LeakyBucketState
	var log window.SlidingLogState
	now := time.Now().UnixNano()
	for i := range 300 {
		now += rng.Int64N(int64(150 * time.Millisecond))
		n := 1 + rng.Int64N(3)
		cond := i%4 != 0
		ops := []window.StateOp{
			{Kind: window.StateGCRA, Key: key, Bucket: lb, Now: now, N: n, Conditional: cond},
			{Kind: window.StateLog, Key: key, Log: sl, Now: now, N: n, Conditional: cond},
			{Kind: window.StateGCRA, Key: key, Bucket: lb, Now: now, N: 1, Conditional: true}, // after the first
			{Kind: window.StateLog, Key: key, Log: sl, Now: now},                              // a read, after the second
		}
		stores[i%len(stores)].DoState(context.Background(), ops)
		for j := range ops {
			if ops[j].Err != nil {
				t.Fatalf("step %d op %d: %v", i, j, ops[j].Err)
			}
		}
		var want [4]struct {
			ok        bool
			remaining int64
			releaseAt int64
		}
		if cond {
			want[0].ok, want[0].remaining, want[0].releaseAt = lb.Allow(&bucket, now, n)
			want[1].ok, want[1].remaining, want[1].releaseAt = sl.Allow(&log, now, n)
		} else {
			pour(lb, &bucket, now, n)
			want[0].ok, want[0].remaining, want[0].releaseAt = true, lb.Remaining(bucket, now), lb.Release(bucket, now, n)
			sl.Add(&log, now, n)
			want[1].ok, want[1].remaining, want[1].releaseAt = true, sl.Remaining(&log, now), sl.Release(&log, now, n)
		}
		want[2].ok, want[2].remaining, want[2].releaseAt = lb.Allow(&bucket, now, 1)
		want[3].ok, want[3].remaining, want[3].releaseAt = sl.Allow(&log, now, 0)
		for j, w := range want {
			op := &ops[j]
			if op.Allowed != w.ok || op.Remaining != w.remaining || op.ReleaseAt != w.releaseAt {
				t.Fatalf("step %d op %d (n %d, conditional %v): store %v %d %d, algorithm %v %d %d",
					i, j, op.N, op.Conditional, op.Allowed, op.Remaining, op.ReleaseAt, w.ok, w.remaining, w.releaseAt)
			}
		}
		if ops[2].TAT != bucket.TAT || ops[2].Frac != bucket.Frac {
			t.Fatalf("step %d: store's bucket %d/%d, algorithm's %d/%d", i, ops[2].TAT, ops[2].Frac, bucket.TAT, bucket.Frac)
		}
	}
}

// pour adds n units to the bucket at now whatever its level, as an
// unconditional StateOp does (small n: no overflow).
func pour(lb window.LeakyBucket, s *window.LeakyBucketState, now, n int64) {
	if s.TAT < now || s.TAT == now && s.Frac == 0 {
		s.TAT, s.Frac = now, 0
	}
	total := s.Frac + n*int64(lb.Per)
	s.TAT, s.Frac = s.TAT+total/lb.Rate, total%lb.Rate
}

// TestStateSameKeyInOrder: the ops of one call on one key take effect in
// the call's order, as window.MemStore applies them, whatever the keys
// between them.
func TestStateSameKeyInOrder(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	s := stateEdges(t, 1, addrs, nil)[0]
	mem := window.NewMemStore(nil)
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	now := time.Now().UnixNano()
	var ops []window.StateOp
	for i := range 60 { // more than one call's linear grouping: keys by map
		ops = append(ops, window.StateOp{Kind: window.StateGCRA, Key: uint64(i % 7), Bucket: lb, Now: now + int64(i)*int64(time.Millisecond), N: int64(1 + i%9), Conditional: i%5 != 0})
	}
	ops = append(ops, window.StateOp{Kind: window.StateGCRA, Key: 99, Bucket: window.LeakyBucket{}, N: 1}) // invalid
	want := slices.Clone(ops)
	mem.DoState(context.Background(), want)
	s.DoState(context.Background(), ops)
	for i := range ops {
		g, w := &ops[i], &want[i]
		if (g.Err == nil) != (w.Err == nil) || g.Allowed != w.Allowed || g.Remaining != w.Remaining || g.ReleaseAt != w.ReleaseAt || g.TAT != w.TAT || g.Frac != w.Frac {
			t.Fatalf("op %d (key %d, n %d): memcached %v %d %d %d/%d %v, MemStore %v %d %d %d/%d %v", i, g.Key, g.N,
				g.Allowed, g.Remaining, g.ReleaseAt, g.TAT, g.Frac, g.Err, w.Allowed, w.Remaining, w.ReleaseAt, w.TAT, w.Frac, w.Err)
		}
	}
}

// TestStateContention: 32 goroutines over four edges pour into one bucket
// at once, unconditionally, so every op writes: ops may fail with
// ErrContention, none hangs or fails otherwise, the failures and retries
// are counted, and no pour is lost or doubled: the bucket's TAT is
// exactly one unit per op that succeeded after the first pour's instant.
func TestStateContention(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	reg := prometheus.NewRegistry()
	stores := stateEdges(t, 4, addrs, reg)
	// One unit a minute: the bucket never drains during the test, so each
	// pour moves the TAT by exactly a minute.
	lb := window.LeakyBucket{Rate: 1, Per: time.Minute, Capacity: 100_000}
	key := rand.Uint64()
	const goroutines, each = 32, 30
	var mu sync.Mutex
	ok, contention := 0, 0
	var slowest time.Duration
	var wg sync.WaitGroup
	begin := time.Now()
	for g := range goroutines {
		s := stores[g%len(stores)]
		wg.Go(func() {
			for range each {
				ops := []window.StateOp{{Kind: window.StateGCRA, Key: key, Bucket: lb, Now: time.Now().UnixNano(), N: 1}}
				start := time.Now()
				s.DoState(context.Background(), ops)
				took := time.Since(start)
				mu.Lock()
				slowest = max(slowest, took)
				switch err := ops[0].Err; {
				case err == nil:
					ok++
				case errors.Is(err, memcachestore.ErrContention):
					contention++
				default:
					t.Errorf("op: %v, want nil or ErrContention", err)
				}
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("ops on a contended key still running after 60s")
	}
	end := time.Now()
	if limit := 2 * memcachestore.StateRounds * stateTimeout; slowest > limit {
		t.Errorf("slowest op took %v, more than %v", slowest, limit)
	}
	if ok+contention != goroutines*each || ok == 0 {
		t.Fatalf("%d ok and %d contention of %d ops", ok, contention, goroutines*each)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "store", "memcached", "result", "contention"); n != float64(contention) {
		t.Errorf("poplimit_state_ops_total{result=contention}: got %v, want the %d seen", n, contention)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "store", "memcached", "result", "ok"); n != float64(ok) {
		t.Errorf("poplimit_state_ops_total{result=ok}: got %v, want the %d seen", n, ok)
	}
	retries := testenv.MetricSum(t, reg, "poplimit_state_cas_retries_total")
	if retries == 0 {
		t.Error("poplimit_state_cas_retries_total: 0 after 32 goroutines wrote one key at once")
	}
	read := []window.StateOp{{Kind: window.StateGCRA, Key: key, Bucket: lb, Now: time.Now().UnixNano()}}
	stores[0].DoState(context.Background(), read)
	if read[0].Err != nil {
		t.Fatal(read[0].Err)
	}
	first := read[0].TAT - int64(ok)*int64(time.Minute)
	if first < begin.UnixNano() || first > end.UnixNano() {
		t.Errorf("bucket TAT %d is %d pours of a minute after %v, not within the run [%v, %v]: pours lost or doubled",
			read[0].TAT, ok, time.Unix(0, first), begin, end)
	}
	t.Logf("%d ops: %d ok, %d failed on contention, %v retries, slowest %v", goroutines*each, ok, contention, retries, slowest)
}

// TestStateBadValue: a value under a state's key that does not decode (not
// ours, or of another version) fails the ops on it with window.ErrBadState
// and is left as it is; other keys in the call are unaffected.
func TestStateBadValue(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	reg := prometheus.NewRegistry()
	c := stateClient(t, addrs, stateTimeout)
	s, err := memcachestore.New(c, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	sl := window.SlidingLog{Limit: 5, Window: time.Second}
	now := time.Now().UnixNano()
	garbage := []byte("G\x00not a bucket\r\nEND\r\n")
	for _, tc := range []struct {
		name string
		op   window.StateOp
	}{
		{"bucket conditional", window.StateOp{Kind: window.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: true}},
		{"bucket unconditional", window.StateOp{Kind: window.StateGCRA, Key: 2, Bucket: lb, Now: now, N: 1}},
		{"bucket read", window.StateOp{Kind: window.StateGCRA, Key: 3, Bucket: lb, Now: now}},
		{"log conditional", window.StateOp{Kind: window.StateLog, Key: 4, Log: sl, Now: now, N: 1, Conditional: true}},
		{"log unconditional", window.StateOp{Kind: window.StateLog, Key: 5, Log: sl, Now: now, N: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skey := memcachestore.StateKey(&tc.op)
			if err := c.Add(ctx, skey, garbage, time.Minute); err != nil {
				t.Fatal(err)
			}
			ops := []window.StateOp{
				tc.op,
				{Kind: window.StateGCRA, Key: tc.op.Key + 1000, Bucket: lb, Now: now, N: 1, Conditional: true},
				tc.op, // twice in a call: both fail
			}
			s.DoState(ctx, ops)
			for _, j := range []int{0, 2} {
				if !errors.Is(ops[j].Err, window.ErrBadState) || ops[j].Allowed {
					t.Errorf("op %d on garbage: allowed %v, err %v, want ErrBadState", j, ops[j].Allowed, ops[j].Err)
				}
			}
			if ops[1].Err != nil || !ops[1].Allowed {
				t.Errorf("op on another key in the call: allowed %v, err %v, want allowed", ops[1].Allowed, ops[1].Err)
			}
			v, _, err := c.Gets(ctx, skey)
			if err != nil || !bytes.Equal(v, garbage) {
				t.Errorf("the garbage after the ops: %q, %v, want it untouched", v, err)
			}
		})
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "result", "bad_value"); n != 10 {
		t.Errorf("poplimit_state_ops_total{result=bad_value}: got %v, want 10", n)
	}
	// A bucket's value read as a log, and a log's as a bucket, never:
	// their keys differ.
	b := window.StateOp{Kind: window.StateGCRA, Key: 77, Bucket: lb, Now: now, N: 1, Conditional: true}
	l := window.StateOp{Kind: window.StateLog, Key: 77, Log: sl, Now: now, N: 1, Conditional: true}
	ops := []window.StateOp{b, l, b, l}
	s.DoState(ctx, ops)
	for j := range ops {
		if ops[j].Err != nil || !ops[j].Allowed {
			t.Errorf("op %d on key 77: allowed %v, err %v", j, ops[j].Allowed, ops[j].Err)
		}
	}
}

// TestStateDeadMemcached: when the only shard dies, ops fail within the
// client's timeouts with an error, and are counted as errors; ops before
// it succeed.
func TestStateDeadMemcached(t *testing.T) {
	p := testenv.Memcached(t)
	const timeout = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	s, err := memcachestore.New(stateClient(t, []string{p.Addr}, timeout), reg)
	if err != nil {
		t.Fatal(err)
	}
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	op := func() window.StateOp {
		return window.StateOp{Kind: window.StateGCRA, Key: 5, Bucket: lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
	}
	ops := []window.StateOp{op()}
	s.DoState(context.Background(), ops)
	if ops[0].Err != nil || !ops[0].Allowed {
		t.Fatalf("before the kill: allowed %v, err %v", ops[0].Allowed, ops[0].Err)
	}
	p.Kill()
	limit := timeout + shardproxy.DefaultBatchGrace + 500*time.Millisecond
	for i := range 5 {
		ops := []window.StateOp{op(), op()}
		begin := time.Now()
		s.DoState(context.Background(), ops)
		took := time.Since(begin)
		for j := range ops {
			if ops[j].Err == nil || ops[j].Allowed {
				t.Errorf("call %d op %d after the kill: allowed %v, err %v, want an error", i, j, ops[j].Allowed, ops[j].Err)
			}
		}
		if took > limit {
			t.Errorf("call %d after the kill took %v, want within %v", i, took, limit)
		}
		t.Logf("call %d: %v after %v", i, ops[0].Err, took)
	}
	// A caller's deadline shorter than the client's timeout is kept too.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ops = []window.StateOp{op()}
	begin := time.Now()
	s.DoState(ctx, ops)
	if took := time.Since(begin); ops[0].Err == nil || took > 500*time.Millisecond {
		t.Errorf("with a 20ms deadline: err %v after %v", ops[0].Err, took)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "result", "error"); n != 11 {
		t.Errorf("poplimit_state_ops_total{result=error}: got %v, want 11", n)
	}
}

// TestStateHungMemcached: of two shards, one hangs (a partition: requests
// vanish, connections stay open): the ops of a call on its keys fail
// within the client's timeouts, those on the other shard's keys in the
// same call succeed.
func TestStateHungMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	relay := testenv.NewRelay(t, addrs[1])
	const timeout = 200 * time.Millisecond
	c := stateClient(t, []string{addrs[0], relay.Addr}, timeout)
	s := &memcachestore.Store{Client: c}
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	ops := make([]window.StateOp, 20)
	keys := make([]uint64, len(ops))
	for i := range keys {
		keys[i] = rand.Uint64()
	}
	mk := func() {
		for i := range ops {
			ops[i] = window.StateOp{Kind: window.StateGCRA, Key: keys[i], Bucket: lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
		}
	}
	mk()
	s.DoState(context.Background(), ops)
	hung := 0
	for i := range ops {
		if ops[i].Err != nil {
			t.Fatalf("op %d before the hang: %v", i, ops[i].Err)
		}
		if c.Ring().Lookup(shardproxy.AppendValueKey(nil, memcachestore.StateKey(&ops[i]))) == 1 {
			hung++
		}
	}
	if hung == 0 || hung == len(ops) {
		t.Fatalf("%d of %d keys on the shard to hang, want some", hung, len(ops))
	}
	relay.Hang()
	mk()
	begin := time.Now()
	s.DoState(context.Background(), ops)
	took := time.Since(begin)
	for i := range ops {
		onHung := c.Ring().Lookup(shardproxy.AppendValueKey(nil, memcachestore.StateKey(&ops[i]))) == 1
		switch {
		case onHung && (ops[i].Err == nil || ops[i].Allowed):
			t.Errorf("op %d on the hung shard: allowed %v, err %v, want an error", i, ops[i].Allowed, ops[i].Err)
		case !onHung && (ops[i].Err != nil || !ops[i].Allowed):
			t.Errorf("op %d on the live shard: allowed %v, err %v, want allowed", i, ops[i].Allowed, ops[i].Err)
		}
	}
	if limit := timeout + shardproxy.DefaultBatchGrace + 500*time.Millisecond; took > limit {
		t.Errorf("call with a hung shard took %v, want within %v", took, limit)
	}
	t.Logf("%d ops on the hung shard failed after %v", hung, took)
}

// TestStateAllocs: a steady sync decision, one conditional op on a bucket,
// allocates a few objects per call (the client's), whether it writes or not.
func TestStateAllocs(t *testing.T) {
	if edgetest.Race {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	_, addrs := testenv.Shards(t, 1)
	registered, err := memcachestore.New(stateClient(t, addrs, stateTimeout), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	zero := &memcachestore.Store{Client: stateClient(t, addrs, stateTimeout)}
	for _, tc := range []struct {
		name string
		s    *memcachestore.Store
		lb   window.LeakyBucket
		max  float64
	}{
		{"admitted", registered, window.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}, 16},
		{"refused", registered, window.LeakyBucket{Rate: 1, Per: time.Hour, Capacity: 1}, 8},
		{"admitted, zero-value store", zero, window.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}, 16},
	} {
		s := tc.s
		key := rand.Uint64()
		ops := make([]window.StateOp, 1)
		allocs := testing.AllocsPerRun(200, func() {
			ops[0] = window.StateOp{Kind: window.StateGCRA, Key: key, Bucket: tc.lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
			s.DoState(context.Background(), ops)
			if ops[0].Err != nil {
				t.Fatal(ops[0].Err)
			}
		})
		t.Logf("%s: %v allocations a decision", tc.name, allocs)
		if allocs > tc.max {
			t.Errorf("%s: %v allocations a decision, want at most %v", tc.name, allocs, tc.max)
		}
	}
}

// BenchmarkMemcacheStateSync is one sync decision a iteration: a
// conditional op on a shared bucket in a real memcached, admitted (a gets
// and a cas) or refused (a gets only).
func BenchmarkMemcacheStateSync(b *testing.B) {
	_, addrs := testenv.Shards(b, 1)
	s, err := memcachestore.New(stateClient(b, addrs, stateTimeout), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		lb   window.LeakyBucket
	}{
		{"admitted", window.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}},
		{"refused", window.LeakyBucket{Rate: 1, Per: time.Hour, Capacity: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			key := rand.Uint64()
			ops := make([]window.StateOp, 1)
			admitted := 0
			b.ReportAllocs()
			for b.Loop() {
				ops[0] = window.StateOp{Kind: window.StateGCRA, Key: key, Bucket: bc.lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
				s.DoState(context.Background(), ops)
				if ops[0].Err != nil {
					b.Fatal(ops[0].Err)
				}
				if ops[0].Allowed {
					admitted++
				}
			}
			b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
		})
	}
}
