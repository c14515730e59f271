package shardproxy

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestEjectionAndReturn(t *testing.T) {
	ps := startShards(t, 3)
	reg := prometheus.NewRegistry()
	cfg := Config{Servers: serversOf(ps), Timeout: slow, FailureLimit: 3, RetryTimeout: 400 * time.Millisecond}
	c, err := New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	key := keyOn(t, c.Ring(), 1, 1)
	if v, err := c.Incr(ctx, key, 0, 5, time.Minute); err != nil || v != 5 {
		t.Fatalf("Incr on live shard 1: got %d, %v, want 5, nil", v, err)
	}

	ps[1].Kill()
	for i := range cfg.FailureLimit {
		if _, err := c.Incr(ctx, key, 0, 1, time.Minute); err == nil || !strings.Contains(err.Error(), ps[1].Addr) {
			t.Fatalf("Incr %d on killed shard: got %v, want an error naming %s", i, err, ps[1].Addr)
		}
		if live := c.Ring().IsLive(1); live != (i < cfg.FailureLimit-1) {
			t.Fatalf("after %d failures: got shard live %v, want %v", i+1, live, i < cfg.FailureLimit-1)
		}
	}
	ejectedAt := time.Now()
	if got := testutil.ToFloat64(c.m.ejected); got != 1 {
		t.Errorf("shards_ejected: got %v, want 1", got)
	}
	if got := testutil.ToFloat64(c.m.ejections); got != 1 {
		t.Errorf("ejections_total: got %v, want 1", got)
	}
	if !c.Healthy() {
		t.Error("Healthy with 2 of 3 shards: got false, want true")
	}
	// The key now lives on the shard ketama gives it without shard 1, and
	// its counter restarts there.
	v, err := c.Incr(ctx, key, 0, 1, time.Minute)
	if err != nil || v != 1 {
		t.Fatalf("Incr while shard 1 is out: got %d, %v, want 1 (a fresh counter), nil", v, err)
	}
	other := c.Ring().Lookup(AppendCounterKey(nil, key, 0))
	if r := command(t, ps[other].Addr, "get "+counterKey(key, 0)); !strings.HasPrefix(r, "VALUE") {
		t.Errorf("shard %d, the key's new home: got %q, want the counter", other, r)
	}

	// Restarted, shard 1 is put back after RetryTimeout and serves its keys.
	if err := ps[1].Start(); err != nil {
		t.Fatal(err)
	}
	if c.Ring().IsLive(1) {
		t.Fatal("shard 1 back before RetryTimeout")
	}
	time.Sleep(time.Until(ejectedAt.Add(cfg.RetryTimeout + 20*time.Millisecond)))
	if v, err := c.Incr(ctx, key, 0, 7, time.Minute); err != nil || v != 7 {
		t.Fatalf("Incr after shard 1 returned: got %d, %v, want 7 (its memcached restarted empty), nil", v, err)
	}
	if !c.Ring().IsLive(1) || testutil.ToFloat64(c.m.ejected) != 0 {
		t.Errorf("after RetryTimeout: got shard 1 live %v, shards_ejected %v, want true, 0", c.Ring().IsLive(1), testutil.ToFloat64(c.m.ejected))
	}
	if r := command(t, ps[1].Addr, "get "+counterKey(key, 0)); !strings.HasPrefix(r, "VALUE") {
		t.Errorf("shard 1 after its return: got %q, want the counter", r)
	}

	// Its success closed the circuit: killed again, it takes FailureLimit
	// failures to eject it. Put back on probation while still dead, its
	// first failure ejects it again.
	ps[1].Kill()
	for i := range cfg.FailureLimit {
		if _, err := c.Incr(ctx, key, 0, 1, time.Minute); err == nil {
			t.Fatalf("Incr %d on the killed shard: got nil error", i)
		}
	}
	if c.Ring().IsLive(1) {
		t.Errorf("shard 1 killed again: got live after %d failures, want ejected", cfg.FailureLimit)
	}
	time.Sleep(cfg.RetryTimeout + 20*time.Millisecond)
	if !c.Ring().IsLive(1) {
		t.Error("after a second RetryTimeout: got shard 1 still out, want it on probation in the ring")
	}
	if _, err := c.Incr(ctx, key, 0, 1, time.Minute); err == nil {
		t.Fatal("Incr on the killed shard: got nil error")
	}
	if c.Ring().IsLive(1) || testutil.ToFloat64(c.m.ejections) != 3 {
		t.Errorf("probation failure: got live %v, ejections_total %v, want false, 3", c.Ring().IsLive(1), testutil.ToFloat64(c.m.ejections))
	}
}

func TestAllEjectedFailsFast(t *testing.T) {
	// Hung shards: a call that reached one would take the whole Timeout, so
	// a fast ErrNoServers proves nothing was sent.
	const timeout = 300 * time.Millisecond
	c := newClient(t, Config{
		Servers: []Server{{Addr: hungServer(t)}, {Addr: hungServer(t)}},
		Timeout: timeout, FailureLimit: 1, RetryTimeout: time.Second,
	})
	ctx := context.Background()
	ring := c.Ring()
	c.Do(ctx, []Op{{Key: keyOn(t, ring, 0, 1), Delta: 1}, {Key: keyOn(t, ring, 1, 2), Delta: 1}})
	ejectedAt := time.Now()
	if c.Healthy() || c.Ring().Live() != 0 {
		t.Fatalf("after a timeout on each shard with FailureLimit 1: got Healthy %v, %d live, want false, 0", c.Healthy(), c.Ring().Live())
	}
	begin := time.Now()
	ops := []Op{{Key: 1, Delta: 1}, {Key: 2, Delta: -1}, {Key: 3}}
	c.Do(ctx, ops)
	elapsed := time.Since(begin)
	for _, op := range ops {
		if !errors.Is(op.Err, ErrNoServers) {
			t.Errorf("op %+v: got %v, want ErrNoServers", op, op.Err)
		}
	}
	if elapsed > timeout/3 {
		t.Errorf("Do with no live shard took %v, want far less than the %v a call would take", elapsed, timeout)
	}
	time.Sleep(time.Until(ejectedAt.Add(time.Second + 20*time.Millisecond)))
	if !c.Healthy() {
		t.Error("after RetryTimeout: got Healthy false, want true (shards back on probation)")
	}
}

func TestHungShardCostsAtMostTheTimeout(t *testing.T) {
	ps := startShards(t, 1)
	hung := hungServer(t)
	const timeout, margin = 100 * time.Millisecond, 200 * time.Millisecond
	c := newClient(t, Config{
		Servers: []Server{{Addr: ps[0].Addr}, {Addr: hung}},
		Timeout: timeout, FailureLimit: 1000, // keep the hung shard in the ring
	})
	ring := c.Ring()
	rng := rand.New(rand.NewPCG(15, 16))
	var ops []Op
	for i := range 60 {
		ops = append(ops, Op{Key: rng.Uint64(), Delta: int64(i%3) - 1, TTL: time.Minute}) // incr, decr and get
	}
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	for range 4 { // concurrent callers
		wg.Go(func() {
			for range 3 {
				batch := make([]Op, len(ops))
				copy(batch, ops)
				begin := time.Now()
				c.Do(context.Background(), batch)
				elapsed := time.Since(begin)
				mu.Lock()
				took = append(took, elapsed)
				mu.Unlock()
				for _, op := range batch {
					if ring.Lookup(AppendCounterKey(nil, op.Key, op.Start)) != 1 {
						continue
					}
					if !errors.Is(op.Err, ErrTimeout) || !strings.Contains(op.Err.Error(), hung) {
						t.Errorf("op %+v on the hung shard: got %v, want ErrTimeout naming %s", op, op.Err, hung)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// Judged on the median: go test runs other packages' tests beside this
	// one, and a stalled scheduler can delay any single call.
	slices.Sort(took)
	t.Logf("Do durations with a hung shard (timeout %v): %v", timeout, took)
	if median := took[len(took)/2]; median > timeout+margin {
		t.Errorf("median Do with a hung shard: got %v, want under %v", median, timeout+margin)
	}
	if slowest := took[len(took)-1]; slowest > 10*timeout {
		t.Errorf("slowest Do with a hung shard: got %v, want under %v", slowest, 10*timeout)
	}
	begin := time.Now()
	v, err := c.Incr(context.Background(), keyOn(t, ring, 1, 3), 0, 1, time.Second)
	if elapsed := time.Since(begin); !errors.Is(err, ErrTimeout) || elapsed > timeout+margin {
		t.Errorf("Incr on the hung shard: got %d, %v after %v, want ErrTimeout within %v", v, err, elapsed, timeout+margin)
	}
	begin = time.Now()
	c.Close()
	if elapsed := time.Since(begin); elapsed > 10*timeout {
		t.Errorf("Close with calls to a hung shard in flight took %v, want under %v", elapsed, 10*timeout)
	}
}

func TestHungShardDelaysNoOtherShard(t *testing.T) {
	ps := startShards(t, 2)
	hung := hungServer(t)
	// A long timeout: the live shards have all of it to answer, however
	// loaded the machine, while the hung one holds its ops to the end.
	const timeout = time.Second
	c := newClient(t, Config{
		Servers: []Server{{Addr: ps[0].Addr}, {Addr: hung}, {Addr: ps[1].Addr}},
		Timeout: timeout, Parallelism: 2,
	})
	ring := c.Ring()
	rng := rand.New(rand.NewPCG(17, 18))
	ops := make([]Op, 300)
	for i := range ops {
		ops[i] = Op{Key: rng.Uint64(), Delta: int64(i%3) - 1, TTL: time.Minute}
	}
	begin := time.Now()
	c.Do(context.Background(), ops)
	elapsed := time.Since(begin)
	counts := map[bool]int{}
	for _, op := range ops {
		onHung := ring.Lookup(AppendCounterKey(nil, op.Key, op.Start)) == 1
		counts[onHung]++
		switch {
		case onHung && !errors.Is(op.Err, ErrTimeout):
			t.Fatalf("op %+v on the hung shard: got %v, want ErrTimeout", op, op.Err)
		case !onHung && op.Err != nil:
			t.Fatalf("op %+v on a live shard: got %v, want nil", op, op.Err)
		}
	}
	if counts[true] == 0 || counts[false] == 0 {
		t.Fatalf("got %d ops on the hung shard and %d on live ones, want some of each", counts[true], counts[false])
	}
	if elapsed > timeout+200*time.Millisecond {
		t.Errorf("Do took %v, want under %v", elapsed, timeout+200*time.Millisecond)
	}
}

func TestGarbageReplies(t *testing.T) {
	tests := []struct {
		name, reply string
	}{
		{"bare newline", "\n"},
		{"short client error", "CLIENT_ERROR \n"},
		{"words", "HELLO WORLD\r\n"},
		{"not a number", "12x\r\n"},
		{"truncated value line", "VALUE x\r\n"},
		{"value without end", "VALUE pl 0 1\r\nxyz\r\n"},
		{"binary", "\x00\x01\x02\xff\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := garbageServer(t, tt.reply)
			c := newClient(t, Config{Servers: []Server{{Addr: addr}}, Timeout: slow, FailureLimit: 1000})
			// One batch, which the shard runs as a pipeline, then each op
			// alone, which it runs through gomemcache.
			ops := []Op{{Key: 1, Delta: 1, TTL: time.Second}, {Key: 2, Delta: -1}, {Key: 3}, {Key: 4}}
			c.Do(context.Background(), ops)
			for i := range 3 {
				single := []Op{{Key: ops[i].Key, Delta: ops[i].Delta, TTL: ops[i].TTL}}
				c.Do(context.Background(), single)
				ops = append(ops, single[0])
			}
			for _, op := range ops {
				if op.Err == nil {
					t.Errorf("op %+v: got nil error and value %d, want an error", op, op.Value)
					continue
				}
				if msg := op.Err.Error(); !strings.HasPrefix(msg, "shardproxy: ") || !strings.Contains(msg, addr) || !errors.Is(op.Err, ErrMalformed) {
					t.Errorf("op %+v: got %q, want ErrMalformed naming the shard", op, msg)
				}
				t.Logf("delta %d: %v", op.Delta, op.Err)
			}
		})
	}
}
