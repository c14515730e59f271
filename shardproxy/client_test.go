package shardproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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
