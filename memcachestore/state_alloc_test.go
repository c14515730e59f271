package memcachestore_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

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
		lb   algo.LeakyBucket
		max  float64
	}{
		{"admitted", registered, algo.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}, 16},
		{"refused", registered, algo.LeakyBucket{Rate: 1, Per: time.Hour, Capacity: 1}, 8},
		{"admitted, zero-value store", zero, algo.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}, 16},
	} {
		s := tc.s
		key := rand.Uint64()
		ops := make([]store.StateOp, 1)
		allocs := testing.AllocsPerRun(200, func() {
			ops[0] = store.StateOp{Kind: store.StateGCRA, Key: key, Bucket: tc.lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
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
		lb   algo.LeakyBucket
	}{
		{"admitted", algo.LeakyBucket{Rate: 1e9, Per: time.Second, Capacity: 1e9}},
		{"refused", algo.LeakyBucket{Rate: 1, Per: time.Hour, Capacity: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			key := rand.Uint64()
			ops := make([]store.StateOp, 1)
			admitted := 0
			b.ReportAllocs()
			for b.Loop() {
				ops[0] = store.StateOp{Kind: store.StateGCRA, Key: key, Bucket: bc.lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
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
