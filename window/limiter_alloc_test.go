package window

import (
	"context"
	"testing"

	"github.com/poplimit/poplimit/store"
)

func TestLimiterDecideDoesNotAllocate(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{})
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
	l := newTestLimiter(b, clock, store.NewMemStore(clock), Config{})
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
	l := newTestLimiter(b, clock, store.NewMemStore(clock), Config{})
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
