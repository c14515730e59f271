package shardproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slow is the Timeout of tests that are not about timeouts: long enough that
// a loaded machine (go test runs packages side by side) never trips it.
const slow = 2 * time.Second

// newClient returns a Client for cfg, closed in t.Cleanup.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// keyOn returns a key whose counters ring places on shard.
func keyOn(t testing.TB, ring *Ring, shard int, seed uint64) uint64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	for range 100_000 {
		k := rng.Uint64()
		if ring.Lookup(AppendCounterKey(nil, k, 0)) == shard {
			return k
		}
	}
	t.Fatalf("no key on shard %d", shard)
	return 0
}

func counterKey(key uint64, start int64) string { return string(AppendCounterKey(nil, key, start)) }

func TestIncrDecrGet(t *testing.T) {
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()
	const start = int64(1_700_000_040_000)
	addrOf := func(key uint64) string { return ps[c.Ring().Lookup(AppendCounterKey(nil, key, start))].Addr }

	type step struct {
		delta int64
		ttl   time.Duration
		want  uint64
	}
	tests := []struct {
		name  string
		steps []step
		ttl   int // seconds memcached reports the counter has left; 0 not checked
	}{
		{"incr creates then adds", []step{{5, 1500 * time.Millisecond, 5}, {3, time.Hour, 8}, {0, 0, 8}}, 2},
		{"ttl zero is one second", []step{{1, 0, 1}}, 1},
		{"ttl rounds up", []step{{1, 59*time.Second + time.Millisecond, 1}}, 60},
		{"decr clamps at zero", []step{{10, time.Minute, 10}, {-3, 0, 7}, {-100, 0, 0}, {0, 0, 0}}, 0},
		{"decr of missing is zero", []step{{-5, 0, 0}, {0, 0, 0}}, 0},
		{"get of missing is zero", []step{{0, 0, 0}}, 0},
		{"decr shortens in place", []step{{100, time.Minute, 100}, {-95, 0, 5}, {0, 0, 5}, {2, 0, 7}}, 0},
		{"large deltas", []step{{math.MaxInt64, time.Minute, math.MaxInt64}, {math.MinInt64, 0, 0}}, 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := uint64(0xc0ffee00 + i)
			for j, s := range tt.steps {
				got, err := c.Incr(ctx, key, start, s.delta, s.ttl)
				if err != nil {
					t.Fatalf("step %d: Incr(%d): %v", j, s.delta, err)
				}
				if got != s.want {
					t.Fatalf("step %d: Incr(%d): got %d, want %d", j, s.delta, got, s.want)
				}
			}
			if tt.ttl > 0 {
				// memcached's clock ticks in whole seconds: a tick between
				// the add and the mg takes one off.
				reply := command(t, addrOf(key), "mg "+counterKey(key, start)+" t")
				f := strings.Fields(reply)
				got, err := strconv.Atoi(strings.TrimPrefix(f[len(f)-1], "t"))
				if err != nil || (got != tt.ttl && got != tt.ttl-1) {
					t.Errorf("mg t: got %q, want a TTL of %ds", reply, tt.ttl)
				}
			}
		})
	}

	if _, err := c.Incr(ctx, 1, start, 1, 31*24*time.Hour); err == nil || !strings.Contains(err.Error(), "30-day") {
		t.Errorf("Incr with a 31-day TTL: got %v, want the 30-day limit error", err)
	}
	// Both windows of a key in one multi-get.
	c.Incr(ctx, 77, start-60_000, 40, time.Minute)
	c.Incr(ctx, 77, start, 2, time.Minute)
	got, err := c.Get(ctx, 77, start-60_000, start, start+60_000)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{40, 2, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Get of three windows: got %v, want %v", got, want)
	}
	// A value that is not a counter is that op's error, not a failure.
	k := uint64(88)
	if r := command(t, addrOf(k), fmt.Sprintf("set %s 0 60 3\r\nabc", counterKey(k, start))); r != "STORED" {
		t.Fatalf("set: %s", r)
	}
	if _, err := c.Get(ctx, k, start); err == nil || !strings.Contains(err.Error(), `"abc" is not a counter`) {
		t.Errorf("Get of a non-numeric value: got %v, want a not-a-counter error", err)
	}
	if _, err := c.Incr(ctx, k, start, 1, time.Minute); err == nil || !strings.Contains(err.Error(), "client error") {
		t.Errorf("Incr of a non-numeric value: got %v, want memcached's CLIENT_ERROR", err)
	}
	if !c.Healthy() || c.Ring().Live() != 3 {
		t.Errorf("after answered errors: got Healthy %v with %d live, want true with 3 (replies are not failures)", c.Healthy(), c.Ring().Live())
	}
}

func TestConcurrentCreateCountsEveryIncrement(t *testing.T) {
	ps := startShards(t, 2)
	reg := prometheus.NewRegistry()
	c, err := New(Config{Servers: serversOf(ps), Timeout: slow}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const goroutines, each = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for range goroutines {
		wg.Go(func() {
			for range each {
				if _, err := c.Incr(context.Background(), 4242, 0, 1, time.Minute); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, err := c.Get(context.Background(), 4242, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != goroutines*each {
		t.Errorf("counter after %d concurrent increments of 1: got %d, want %d", goroutines*each, got[0], goroutines*each)
	}
	if created := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss]); created != 1 {
		t.Errorf("increments that created the counter: got %v, want 1 (the others lost the add race and incremented)", created)
	}
}

func TestDoMixedBatch(t *testing.T) {
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Parallelism: 4, Timeout: slow})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, 14))
	model := map[[2]int64]uint64{}
	for round := range 5 {
		// Ops of one Do run in no order, and memcached clamps a decrement at
		// 0, so a counter is decremented only by as much as it held before
		// the batch: then every order gives the same result. Reads run in a
		// batch of their own.
		ops := make([]Op, 400)
		decs := map[[2]int64]uint64{}
		for i := range ops {
			key, start := uint64(rng.IntN(50)), int64(rng.IntN(3))*60_000
			k := [2]int64{int64(key), start}
			delta := int64(rng.IntN(7)) - 2 // reads, decrements and increments
			if delta < 0 {
				if decs[k]+uint64(-delta) > model[k] {
					delta = -delta
				} else {
					decs[k] += uint64(-delta)
				}
			}
			ops[i] = Op{Key: key, Start: start, Delta: delta, TTL: time.Minute, Value: 12345, Err: errors.New("stale")}
		}
		var reads, writes []Op
		for _, op := range ops {
			if op.Delta == 0 {
				reads = append(reads, op)
			} else {
				writes = append(writes, op)
			}
		}
		c.Do(ctx, writes)
		for _, op := range writes {
			if op.Err != nil {
				t.Fatalf("round %d: write %+v: %v", round, op, op.Err)
			}
			k := [2]int64{int64(op.Key), op.Start}
			if op.Delta > 0 {
				model[k] += uint64(op.Delta)
			} else {
				model[k] -= min(model[k], uint64(-op.Delta))
			}
		}
		c.Do(ctx, reads)
		for _, op := range reads {
			if op.Err != nil {
				t.Fatalf("round %d: read %+v: %v", round, op, op.Err)
			}
			if want := model[[2]int64{int64(op.Key), op.Start}]; op.Value != want {
				t.Errorf("round %d: read key %d window %d: got %d, want %d", round, op.Key, op.Start, op.Value, want)
			}
		}
	}
}

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

func TestDoAfterClose(t *testing.T) {
	ps := startShards(t, 1)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Incr(context.Background(), 1, 0, 1, time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Incr after Close: got %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
}

func TestMetrics(t *testing.T) {
	ps := startShards(t, 1)
	reg := prometheus.NewRegistry()
	c, err := New(Config{Servers: serversOf(ps), Timeout: slow}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Do(context.Background(), []Op{{Key: 1, Delta: 1, TTL: time.Second}, {Key: 1, Start: 1}})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	if got := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss]) + testutil.ToFloat64(c.m.ops[kindGet][resultMiss]); got != 2 {
		t.Errorf("ops_total{result=miss}: got %v, want 2", got)
	}
	n, err := testutil.GatherAndCount(reg, "poplimit_shardproxy_ops_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != int(numKinds)*int(numResults) {
		t.Errorf("ops_total series: got %d, want %d (every op × result, no key labels)", n, int(numKinds)*int(numResults))
	}
	if _, err := New(Config{Servers: serversOf(ps)}, reg); err == nil {
		t.Error("second New on the same registry: got nil error, want AlreadyRegistered")
	}
	if problems, _ := testutil.GatherAndLint(reg); len(problems) != 0 {
		t.Errorf("after a failed New: got lint problems %v", problems)
	}
}

// TestShardNamesTheServingShard: Shard names the memcached server an
// increment of the counter lands on (asked of each server directly), the
// windows of one key on one shard; it does not allocate.
func TestShardNamesTheServingShard(t *testing.T) {
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	if got := c.Shards(); got != 3 {
		t.Fatalf("Shards() = %d, want 3", got)
	}
	direct := make([]*memcache.Client, len(ps))
	for i, p := range ps {
		direct[i] = memcache.New(p.Addr)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	seen := make([]int, len(ps))
	for range 60 {
		key, start := rng.Uint64(), int64(rng.IntN(1e6))*60_000
		want := c.Shard(key)
		// Two windows of the key: both on the shard Shard names.
		ops := []Op{{Key: key, Start: start, Delta: 1, TTL: time.Minute}, {Key: key, Start: start - 60_000, Delta: 1, TTL: time.Minute}}
		c.Do(context.Background(), ops)
		for _, op := range ops {
			if op.Err != nil {
				t.Fatal(op.Err)
			}
			for i, d := range direct {
				_, err := d.Get(counterKey(key, op.Start))
				if has := err == nil; has != (i == want) {
					t.Fatalf("key %x window %d: Shard says %d, server %d has the counter: %v", key, op.Start, want, i, has)
				}
			}
		}
		seen[want]++
	}
	for i, n := range seen {
		if n == 0 {
			t.Errorf("no counter on shard %d of 60: %v", i, seen)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { c.Shard(1) })
	if allocs != 0 {
		t.Errorf("Shard allocates %v times a call, want 0", allocs)
	}
}

// TestNewHintCreatesInOneRound: increments hinted New create their
// counters in the round trip of the incr itself (no miss, no add round),
// with the op's TTL, whether sent to memcached or through nutcracker; a
// hint on a counter that exists changes neither its count nor its TTL;
// concurrent hinted increments of one new counter all count.
func TestNewHintCreatesInOneRound(t *testing.T) {
	mc := startShards(t, 1)[0]
	targets := map[string]string{"memcached": mc.Addr}
	if _, err := exec.LookPath("nutcracker"); err == nil {
		targets["nutcracker"] = startNutcracker(t, []Server{{Addr: mc.Addr, Weight: 1}}, HashFNV1a64)
	}
	for name, addr := range targets {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c, err := New(Config{Servers: []Server{{Addr: addr}}, Timeout: slow}, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(7, uint64(len(name))))
			// An existing counter: 5, with 100 s to live.
			old := Op{Key: rng.Uint64(), Start: 60_000, Delta: 5, TTL: 100 * time.Second}
			c.Do(context.Background(), []Op{old})
			ops := make([]Op, 16)
			for i := range ops {
				ops[i] = Op{Key: rng.Uint64(), Start: 60_000, Delta: int64(i + 1), TTL: time.Hour, New: true}
			}
			ops[0] = Op{Key: old.Key, Start: old.Start, Delta: 2, TTL: time.Hour, New: true}
			misses0 := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss])
			c.Do(context.Background(), ops)
			for i, op := range ops {
				want := uint64(op.Delta)
				if i == 0 {
					want = 7
				}
				if op.Err != nil || op.Value != want {
					t.Fatalf("op %d: value %d, err %v; want %d", i, op.Value, op.Err, want)
				}
			}
			if m := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss]) - misses0; m != 0 {
				t.Errorf("%v hinted increments missed, want none (created in their own round trip)", m)
			}
			if ttl := ttlOf(t, mc.Addr, counterKey(ops[1].Key, ops[1].Start)); ttl < 3500 || ttl > 3600 {
				t.Errorf("a created counter has %d s to live, want the op's hour", ttl)
			}
			if ttl := ttlOf(t, mc.Addr, counterKey(old.Key, old.Start)); ttl < 0 || ttl > 100 {
				t.Errorf("the existing counter has %d s to live after a hinted increment, want its 100 s at most", ttl)
			}
			// Concurrent hinted increments of one new counter.
			key := rng.Uint64()
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					batch := make([]Op, 4)
					for j := range batch {
						batch[j] = Op{Key: rng2(g, j), Start: 60_000, Delta: 1, TTL: time.Minute, New: true}
					}
					batch[0] = Op{Key: key, Start: 60_000, Delta: 1, TTL: time.Minute, New: true}
					for range 25 {
						c.Do(context.Background(), batch)
						for _, op := range batch {
							if op.Err != nil {
								t.Error(op.Err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			got := []Op{{Key: key, Start: 60_000}}
			c.Do(context.Background(), got)
			if got[0].Value != 200 {
				t.Errorf("8 × 25 concurrent hinted increments of a new counter: %d, want 200", got[0].Value)
			}
		})
	}
}

// rng2 is a key of its own per goroutine and slot.
func rng2(g, j int) uint64 { return uint64(g)<<32 | uint64(j) | 1<<60 }
