package memcachestore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

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
func runEdges(t *testing.T, stores []*memcachestore.Store, d time.Duration, mk func(now int64) store.StateOp) (admitted []admission, attempts, failed int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for _, s := range stores {
		wg.Go(func() {
			for time.Now().Before(stop) {
				now := time.Now().UnixNano()
				ops := []store.StateOp{mk(now)}
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
