package memcachestore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

// These tests run Store.DoState against real memcached shards
// (internal/testenv), several edges (a shardproxy.Client and a
// Store each) sharing them, as the edges of a PoP do.

// TestStateGCRAEdges: six edges take one unit at a time from one shared
// token bucket (burst 20, 10 a second) on three shards for two seconds:
// in every interval [t1, t2] of the instants admitted, at most
// 20 + 10·(t2 − t1) were (+1 for rounding), and the bucket was kept busy.
func TestStateGCRAEdges(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	stores := stateEdges(t, 6, addrs, nil)
	const burst, rate = 20, 10
	lb := algo.LeakyBucket{Rate: rate, Per: time.Second, Capacity: burst}
	key := rand.Uint64()
	const d = 2 * time.Second
	admitted, attempts, failed := runEdges(t, stores, d, func(now int64) store.StateOp {
		return store.StateOp{Kind: store.StateGCRA, Key: key, Bucket: lb, Now: now, N: 1, Conditional: true}
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
// algo.SlidingLog fed the instants admitted.
//
// A log treats an op whose instant is earlier than one already logged as
// happening at that latest instant (an edge whose cas lost retries with its
// own instant), so an op takes effect at an instant between its own and
// when DoState returned: the checks allow for that latency, L, and no
// more.
func TestStateLogEdges(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	stores := stateEdges(t, 6, addrs, nil)
	sl := algo.SlidingLog{Limit: 5, Window: 500 * time.Millisecond}
	key := rand.Uint64()
	const d = 2 * time.Second
	admitted, attempts, failed := runEdges(t, stores, d, func(now int64) store.StateOp {
		return store.StateOp{Kind: store.StateLog, Key: key, Log: sl, Now: now, N: 1, Conditional: true}
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
	var ref algo.SlidingLogState
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
	ops := []store.StateOp{{Kind: store.StateLog, Key: key, Log: sl, Now: read}}
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
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	sl := algo.SlidingLog{Limit: 5, Window: 500 * time.Millisecond}
	rng := rand.New(rand.NewPCG(7, 8))
	key := rng.Uint64()
	var bucket algo.LeakyBucketState
	var log algo.SlidingLogState
	now := time.Now().UnixNano()
	for i := range 300 {
		now += rng.Int64N(int64(150 * time.Millisecond))
		n := 1 + rng.Int64N(3)
		cond := i%4 != 0
		ops := []store.StateOp{
			{Kind: store.StateGCRA, Key: key, Bucket: lb, Now: now, N: n, Conditional: cond},
			{Kind: store.StateLog, Key: key, Log: sl, Now: now, N: n, Conditional: cond},
			{Kind: store.StateGCRA, Key: key, Bucket: lb, Now: now, N: 1, Conditional: true}, // after the first
			{Kind: store.StateLog, Key: key, Log: sl, Now: now},                              // a read, after the second
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
func pour(lb algo.LeakyBucket, s *algo.LeakyBucketState, now, n int64) {
	if s.TAT < now || s.TAT == now && s.Frac == 0 {
		s.TAT, s.Frac = now, 0
	}
	total := s.Frac + n*int64(lb.Per)
	s.TAT, s.Frac = s.TAT+total/lb.Rate, total%lb.Rate
}

// TestStateSameKeyInOrder: the ops of one call on one key take effect in
// the call's order, as store.MemStore applies them, whatever the keys
// between them.
func TestStateSameKeyInOrder(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	s := stateEdges(t, 1, addrs, nil)[0]
	mem := store.NewMemStore(nil)
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	now := time.Now().UnixNano()
	var ops []store.StateOp
	for i := range 60 { // more than one call's linear grouping: keys by map
		ops = append(ops, store.StateOp{Kind: store.StateGCRA, Key: uint64(i % 7), Bucket: lb, Now: now + int64(i)*int64(time.Millisecond), N: int64(1 + i%9), Conditional: i%5 != 0})
	}
	ops = append(ops, store.StateOp{Kind: store.StateGCRA, Key: 99, Bucket: algo.LeakyBucket{}, N: 1}) // invalid
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
	lb := algo.LeakyBucket{Rate: 1, Per: time.Minute, Capacity: 100_000}
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
				ops := []store.StateOp{{Kind: store.StateGCRA, Key: key, Bucket: lb, Now: time.Now().UnixNano(), N: 1}}
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
	read := []store.StateOp{{Kind: store.StateGCRA, Key: key, Bucket: lb, Now: time.Now().UnixNano()}}
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
