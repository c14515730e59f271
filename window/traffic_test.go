package window

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// opStore counts store operations as the design prices them: one per
// increment, and one per key read (a key's previous and current window are
// one multi-get on one shard).
type opStore struct {
	store.Store
	incrs, reads int
}

func (s *opStore) Do(ctx context.Context, ops []store.Op) {
	var lastRead uint64
	for i, op := range ops {
		switch {
		case op.Delta != 0:
			s.incrs++
		case i == 0 || lastRead != op.Key:
			s.reads++
			lastRead = op.Key
		}
	}
	s.Store.Do(ctx, ops)
}

type trafficResult struct {
	requests, incrs, reads int
	optimum                int
}

func (r trafficResult) opsPerRequest() float64 {
	return float64(r.incrs+r.reads) / float64(r.requests)
}
func (r trafficResult) optimumPerRequest() float64 { return float64(r.optimum) / float64(r.requests) }
func (r trafficResult) ratio() float64             { return float64(r.incrs+r.reads) / float64(r.optimum) }

// simulateTraffic feeds one limiter n decisions at rate per second in
// simulated time, flushing every interval, with keys drawn by next, and
// counts the store operations against the optimum: one increment per key
// touched in each flush interval plus one read per key per window.
func simulateTraffic(t testing.TB, n, rate int, interval time.Duration, next func() uint64) trafficResult {
	clock := newSimClock(t0)
	backend := &opStore{Store: store.NewMemStore(clock)}
	l, err := New(Config{FlushInterval: interval, Clock: clock}, backend)
	if err != nil {
		t.Fatal(err)
	}
	r := mustRules(t, "rules: [{name: sim, limit: 1000000000, window: 1m}]").Rules[0]
	step := time.Second / time.Duration(rate)
	nextFlush := t0.Add(interval)
	touched := make(map[uint64]struct{})
	seen := make(map[uint64]struct{})
	res := trafficResult{requests: n}
	ctx := context.Background()
	var key [8]byte
	for i := 0; i < n; i++ {
		now := clock.Now()
		if !now.Before(nextFlush) {
			l.Flush(ctx, now)
			res.optimum += len(touched)
			clear(touched)
			nextFlush = nextFlush.Add(interval)
		}
		k := next()
		for j := range key {
			key[j] = byte(k >> (8 * j))
		}
		h := r.Hash(key[:])
		touched[h] = struct{}{}
		seen[h] = struct{}{}
		l.Decide(ctx, now, &r.Policy, h, r.Limit, 1)
		clock.Add(step)
	}
	clock.Add(time.Second)
	l.Flush(ctx, clock.Now())
	res.optimum += len(touched) + len(seen) // the last flush, and one read per key (one window)
	res.incrs, res.reads = backend.incrs, backend.reads
	return res
}

func zipfKeys(seed uint64, keys int) func() uint64 {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed)), 1.1, 1, uint64(keys-1))
	return z.Uint64
}

func attackKeys(seed uint64) func() uint64 {
	rng := rand.New(rand.NewPCG(seed, 7))
	z := rand.NewZipf(rng, 1.1, 1, 9999)
	return func() uint64 {
		if rng.IntN(10) < 9 {
			return 1<<40 + rng.Uint64N(10) // 10 attacking keys
		}
		return z.Uint64()
	}
}

// TestStoreTrafficIsCoalesced measures store operations per request against
// the optimum for the figures in BENCHMARKS.md: 1,000,000 decisions at
// 50,000 requests/s, Zipf (s = 1.1) over 10,000 keys and an attack where 90 %
// of requests come from 10 keys, at 1, 5 and 20 ms flush intervals.
func TestStoreTrafficIsCoalesced(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	for _, tc := range []struct {
		name     string
		interval time.Duration
		keys     func() uint64
	}{
		{"zipf/5ms", 5 * time.Millisecond, zipfKeys(1, 10000)},
		{"attack/5ms", 5 * time.Millisecond, attackKeys(2)},
		{"zipf/1ms", time.Millisecond, zipfKeys(3, 10000)},
		{"attack/1ms", time.Millisecond, attackKeys(4)},
		{"zipf/20ms", 20 * time.Millisecond, zipfKeys(5, 10000)},
		{"attack/20ms", 20 * time.Millisecond, attackKeys(6)},
	} {
		res := simulateTraffic(t, n, 50000, tc.interval, tc.keys)
		t.Logf("%-12s %d requests: %d incr + %d reads = %.4f ops/request; optimum %.4f; ratio %.4f",
			tc.name, res.requests, res.incrs, res.reads, res.opsPerRequest(), res.optimumPerRequest(), res.ratio())
		if res.ratio() > 1.05 {
			t.Errorf("%s: %.4f ops/request is %.3f × the optimum %.4f, want ≤ 1.05×", tc.name, res.opsPerRequest(), res.ratio(), res.optimumPerRequest())
		}
	}
}

// TestMemoryPerKey measures the limiter's bytes of state per active key with
// 1,000,000 keys (the target is at most 128).
func TestMemoryPerKey(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	clock := newSimClock(t0)
	r := mustRules(t, perMinute).Rules[0]
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l, err := New(Config{MaxKeys: n, Clock: clock}, store.NewMemStore(clock))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		l.Decide(context.Background(), clock.Now(), &r.Policy, uint64(i)*0x9e3779b97f4a7c15, r.Limit, 1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if l.Keys() != n {
		t.Fatalf("limiter holds %d keys, want %d", l.Keys(), n)
	}
	perKey := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	t.Logf("%d active keys: %.1f bytes of limiter state per key", n, perKey)
	if perKey > 128 {
		t.Errorf("%.1f bytes per key, want ≤ 128", perKey)
	}
	runtime.KeepAlive(l)
}
