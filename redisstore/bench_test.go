package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// The Store's own costs over a real redis-server on loopback:
//
//	go test -run '^$' -bench 'BenchmarkStore' -benchtime 2s ./redisstore/
//
// Batch256 is the shape of the async flush (256 increments of counters
// that exist, one pipeline); Single the sync path (one increment, one round
// trip); Parallel16 the sync path of 16 concurrent requests; GCRA and
// SlidingLog one conditional call each, and GCRABatch256 a flush of 256
// unconditional pours.

func benchStore(b *testing.B) *Store {
	p := startRedis(b)
	s, _ := newStore(b, Config{Addrs: []string{p.Addr}, Timeout: time.Second})
	return s
}

func BenchmarkStoreDo(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	for _, n := range []int{1, 256} {
		name := map[int]string{1: "Single", 256: "Batch256"}[n]
		b.Run(name, func(b *testing.B) {
			ops := make([]store.Op, n)
			b.ReportAllocs()
			for b.Loop() {
				for i := range ops {
					ops[i] = store.Op{Key: uint64(i) * 0x9e3779b97f4a7c15, Start: 1_700_000_000_000, Delta: 1, TTL: time.Minute}
				}
				s.Do(ctx, ops)
				if ops[0].Err != nil {
					b.Fatal(ops[0].Err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/counter")
		})
	}
	b.Run("Parallel16", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			var ops [1]store.Op
			i := uint64(0)
			for pb.Next() {
				i++
				ops[0] = store.Op{Key: i & 255, Start: 1_700_000_000_000, Delta: 1, TTL: time.Minute}
				s.Do(ctx, ops[:])
				if ops[0].Err != nil {
					b.Error(ops[0].Err)
					return
				}
			}
		})
	})
}

func BenchmarkStoreGCRA(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	params := GCRAParams{Rate: 100, Per: time.Minute, Capacity: 20}
	b.Run("Single", func(b *testing.B) {
		now := int64(1_700_000_000_000_000_000)
		b.ReportAllocs()
		for b.Loop() {
			now += int64(time.Second)
			if _, err := s.GCRA(ctx, 1, params, now, 1, true); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Batch256", func(b *testing.B) {
		ops := make([]GCRAOp, 256)
		now := int64(1_700_000_000_000_000_000)
		b.ReportAllocs()
		for b.Loop() {
			now += int64(time.Second)
			for i := range ops {
				ops[i] = GCRAOp{Key: uint64(i), Params: params, Now: now, N: 1}
			}
			s.GCRABatch(ctx, ops)
			if ops[0].Err != nil {
				b.Fatal(ops[0].Err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/bucket")
	})
}

func BenchmarkStoreSlidingLog(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	params := SlidingLogParams{Limit: 5, Window: time.Minute}
	now := int64(1_700_000_000_000_000_000)
	b.ReportAllocs()
	for b.Loop() {
		now += int64(time.Second)
		if _, err := s.SlidingLog(ctx, 1, params, now, 1, true); err != nil {
			b.Fatal(err)
		}
	}
}
