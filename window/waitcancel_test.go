package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// stateHangingStore keeps counters in memory but answers no state
// operation before the call's context ends, as a shard that stopped
// answering, until released; then it fails them at once.
type stateHangingStore struct {
	*store.MemStore
	released chan struct{}
}

func (s stateHangingStore) DoState(ctx context.Context, ops []store.StateOp) {
	select {
	case <-ctx.Done():
	case <-s.released:
	}
	for i := range ops {
		ops[i].Err = errDown
	}
}

// TestWaitEndsWithTheRequest: a request whose context has ended does not
// wait for the store: a bucket's request that would wait for its key's
// first reply (the store hangs, so none comes before its timeout) is
// decided at once, as a counter's is, instead of looking again and again
// until the wait's deadline, and its wait is counted once.
func TestWaitEndsWithTheRequest(t *testing.T) {
	rs := mustRules(t, `
rules:
  - {name: bucket, limit: 10, window: 1s, burst: 20, algorithm: token_bucket}
  - {name: counter, limit: 10, window: 1s}
`)
	for _, r := range rs.Rules {
		t.Run(r.Name, func(t *testing.T) {
			backend := stateHangingStore{store.NewMemStore(nil), make(chan struct{})}
			l := newTestLimiter(t, store.SystemClock, backend, Config{StoreTimeout: 20 * time.Second, NewKeyWait: 10 * time.Second})
			t.Cleanup(func() { close(backend.released) }) // before the limiter's Close
			l.Start()
			key := r.Hash([]byte("k"))
			// The first request of a key new here is decided at once; the
			// next would wait for the key's first reply.
			l.Decide(context.Background(), time.Now(), &r.Policy, key, r.Limit, 1)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			begin := time.Now()
			l.Decide(ctx, time.Now(), &r.Policy, key, r.Limit, 1)
			// Waiting out the wait's deadline would take 10 s; the bound
			// tells that apart from deciding at once on any machine.
			if took := time.Since(begin); took > 5*time.Second {
				t.Errorf("a request whose context had ended took %v to decide, want it decided without waiting out its wait's 10 s deadline", took)
			}
			if n := testutil.ToFloat64(l.m.newKeyTimeout); n > 1 {
				t.Errorf("new_key_waits_total{result=\"timeout\"} = %v after one request, want at most 1", n)
			}
		})
	}
}
