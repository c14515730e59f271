package shardproxy

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// idlePipes returns the idle pipeline connections of shard i.
func idlePipes(c *Client, i int) int {
	p := &c.shards[i].pipes
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// TestDoMatchesOneByOne runs batches of mixed ops, several on the same
// counters, over three real shards, and checks every op's Value against a
// model that applies them one by one; then the counters' values and the
// TTLs that the increments which created them set.
func TestDoMatchesOneByOne(t *testing.T) {
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()
	type counter struct {
		key   uint64
		start int64
	}
	type state struct {
		value   uint64
		ttl     int       // seconds, as created
		created time.Time // before the Do that created it
	}
	tests := []struct {
		name                  string
		ops, counters, rounds int
	}{
		{"500 ops on 120 counters", 500, 60, 4},
		{"2000 ops, several pipelines per shard", 2000, 400, 2},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(21, uint64(n)))
			model := map[counter]*state{}
			base := int64(1_700_000_000_000 + n*600_000)
			for round := range tt.rounds {
				ops := make([]Op, tt.ops)
				want := make([]uint64, len(ops))
				begin := time.Now()
				for i := range ops {
					k := counter{uint64(rng.IntN(tt.counters)) * 0x9e3779b97f4a7c15, base + int64(rng.IntN(2))*60_000}
					var delta int64
					switch r := rng.IntN(10); {
					case r < 3: // read
					case r < 5:
						delta = -int64(1 + rng.IntN(5))
					default:
						delta = int64(1 + rng.IntN(20))
					}
					ttl := 60 + rng.IntN(3600)
					ops[i] = Op{Key: k.key, Start: k.start, Delta: delta, TTL: time.Duration(ttl) * time.Second, Value: 12345, Err: errors.New("stale")}
					s := model[k]
					switch {
					case delta > 0 && s == nil:
						model[k] = &state{value: uint64(delta), ttl: ttl, created: begin}
						want[i] = uint64(delta)
					case delta > 0:
						s.value += uint64(delta)
						want[i] = s.value
					case s != nil && delta < 0:
						s.value -= min(s.value, uint64(-delta))
						want[i] = s.value
					case s != nil:
						want[i] = s.value
					}
				}
				c.Do(ctx, ops)
				for i, op := range ops {
					if op.Err != nil || op.Value != want[i] {
						t.Fatalf("round %d, op %d (key %x window %d delta %d): got %d, %v, want %d, nil",
							round, i, op.Key, op.Start, op.Delta, op.Value, op.Err, want[i])
					}
				}
			}
			for i := range ps {
				if idlePipes(c, i) == 0 {
					t.Errorf("shard %d: no idle pipeline connection, want the batches pipelined", i)
				}
			}
			checked := 0
			for k, s := range model {
				got, err := c.Get(ctx, k.key, k.start)
				if err != nil || got[0] != s.value {
					t.Errorf("counter %x window %d: got %v, %v, want %d", k.key, k.start, got, err, s.value)
				}
				if checked++; checked > 100 {
					continue // enough TTLs checked
				}
				addr := ps[c.Ring().Lookup(AppendCounterKey(nil, k.key, k.start))].Addr
				reply := command(t, addr, "mg "+counterKey(k.key, k.start)+" t")
				f := strings.Fields(reply)
				ttl, err := strconv.Atoi(strings.TrimPrefix(f[len(f)-1], "t"))
				// memcached's clock ticks in whole seconds.
				lo := s.ttl - int(time.Since(s.created).Seconds()) - 1
				if err != nil || ttl < lo || ttl > s.ttl {
					t.Errorf("counter %x window %d: mg t: got %q, want a TTL from %d to %d s", k.key, k.start, reply, lo, s.ttl)
				}
			}
		})
	}
}

// TestDoHotCounter sends one call of thousands of reads of one counter
// around two increments of it: every read sees the increments before it
// and none after, and the rounds stay small enough not to stall (a stall
// would be a timeout).
func TestDoHotCounter(t *testing.T) {
	ps := startShards(t, 2)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	const reads = 1500
	var ops []Op
	var want []uint64
	for part, v := range []uint64{0, 5, 12} {
		if part > 0 {
			ops = append(ops, Op{Key: 777, Delta: int64(v - want[len(want)-1]), TTL: time.Minute})
			want = append(want, v)
		}
		for range reads {
			ops = append(ops, Op{Key: 777})
			want = append(want, v)
		}
	}
	c.Do(context.Background(), ops)
	for i, op := range ops {
		if op.Err != nil || op.Value != want[i] {
			t.Fatalf("op %d (delta %d): got %d, %v, want %d, nil", i, op.Delta, op.Value, op.Err, want[i])
		}
	}
}

// TestConcurrentCreateThroughBatches is TestConcurrentCreateCountsEveryIncrement
// through pipelines: 32 goroutines race to create one counter with 1,600
// increments, one per call beside a read (so the shard has two commands
// and pipelines them), or fifty in one call.
func TestConcurrentCreateThroughBatches(t *testing.T) {
	ps := startShards(t, 2)
	const goroutines, each = 32, 50
	tests := []struct {
		name  string
		calls func(key uint64) [][]Op // one goroutine's calls
	}{
		{"one increment per call", func(key uint64) [][]Op {
			calls := make([][]Op, each)
			for i := range calls {
				calls[i] = []Op{{Key: key, Start: 0, Delta: 1, TTL: time.Minute}, {Key: key, Start: 60_000}}
			}
			return calls
		}},
		{"fifty increments in one call", func(key uint64) [][]Op {
			call := make([]Op, each)
			for i := range call {
				call[i] = Op{Key: key, Start: 0, Delta: 1, TTL: time.Minute}
			}
			return [][]Op{call}
		}},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c, err := New(Config{Servers: serversOf(ps), Timeout: slow}, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			key := uint64(4242 + n)
			var wg sync.WaitGroup
			errs := make(chan error, goroutines*each)
			for range goroutines {
				wg.Go(func() {
					for _, ops := range tt.calls(key) {
						c.Do(context.Background(), ops)
						for _, op := range ops {
							if op.Err != nil {
								errs <- op.Err
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			got, err := c.Get(context.Background(), key, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != goroutines*each {
				t.Errorf("counter after %d concurrent increments of 1: got %d, want %d", goroutines*each, got[0], goroutines*each)
			}
			if created := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss]); created != 1 {
				t.Errorf("increments that created the counter: got %v, want 1 (the others lost the add race and incremented)", created)
			}
			if idlePipes(c, c.Ring().Lookup(AppendCounterKey(nil, key, 0))) == 0 {
				t.Error("no idle pipeline connection: the calls did not take the pipelined path")
			}
		})
	}
}

// TestPipelineBadReplies breaks one reply of a pipeline in each way a
// shard could, and checks which ops fail and how, that the connection is
// closed (or kept, after memcached's own answer), that the shard's health
// counts one failure for the batch, and that the next batch, on a new
// connection, succeeds.
func TestPipelineBadReplies(t *testing.T) {
	// One shard; round 1 is "get r1 r2", then the incrs of w1…w4 in order,
	// then version: commands 0, 1…4 and 5.
	keys := map[string]uint64{"r1": 101, "r2": 102, "w1": 201, "w2": 202, "w3": 203, "w4": 204}
	k := func(name string) string { return counterKey(keys[name], 0) }
	preset := map[string]string{k("r1"): "7", k("r2"): "8  ", k("w1"): "10", k("w2"): "20", k("w3"): "30", k("w4"): "40"}
	ops := func() []Op {
		return []Op{
			{Key: keys["w1"], Delta: 1, TTL: time.Minute}, {Key: keys["w2"], Delta: 1, TTL: time.Minute},
			{Key: keys["w3"], Delta: 1, TTL: time.Minute}, {Key: keys["w4"], Delta: 1, TTL: time.Minute},
			{Key: keys["r1"]}, {Key: keys["r2"]},
		}
	}
	// Outcomes, in the order of ops().
	const (
		ok        = "ok"
		malformed = "malformed"
		timeout   = "timeout"
		serverErr = "server error"
		clientErr = "client error"
	)
	good := []uint64{11, 21, 31, 41, 7, 8}
	tests := []struct {
		name    string
		n       int    // the command whose reply is replaced
		reply   string // its replacement; %s is the right reply
		want    []string
		failure bool // counts against the shard, closes the connection
	}{
		{"nonsense", 2, "HELLO WORLD\r\n", []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"binary", 2, "\x00\x01\x02\xff\r\n", []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"line without CR", 2, "21\n", []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"number too large", 2, "18446744073709551616\r\n", []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"truncated, then closed", 2, "2" + replyClose, []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"closed before a reply", 2, replyClose, []string{ok, "closed", "closed", "closed", ok, ok}, true},
		{"truncated, then silent", 2, "2" + replyHang, []string{ok, timeout, timeout, timeout, ok, ok}, true},
		{"silent", 0, replyHang, []string{timeout, timeout, timeout, timeout, timeout, timeout}, true},
		{"a reply missing", 2, "", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"a reply extra", 2, "%s%s", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"a reply after the last", 5, "%s5\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"huge VALUE length", 0, "VALUE " + k("r1") + " 0 1099511627776\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"VALUE longer than a counter", 0, "VALUE " + k("r1") + " 0 4000000000\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"VALUE of a key not asked", 0, "VALUE pl:{0}:0 0 1\r\n5\r\nEND\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"VALUEs out of order", 0, "VALUE " + k("r2") + " 0 1\r\n8\r\nVALUE " + k("r1") + " 0 1\r\n7\r\nEND\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"VALUE block too long", 0, "VALUE " + k("r1") + " 0 1\r\n77\r\nEND\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"VALUE line short", 0, "VALUE " + k("r1") + " 0\r\n7\r\nEND\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"END missing", 0, "VALUE " + k("r1") + " 0 1\r\n7\r\n", []string{malformed, malformed, malformed, malformed, malformed, malformed}, true},
		{"ERROR", 2, "ERROR\r\n", []string{ok, malformed, malformed, malformed, ok, ok}, true},
		{"SERVER_ERROR", 2, "SERVER_ERROR out of memory\r\n", []string{ok, serverErr, serverErr, serverErr, ok, ok}, true},
		{"CLIENT_ERROR", 2, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", []string{ok, clientErr, ok, ok, ok, ok}, false},
		{"not a counter", 0, "VALUE " + k("r1") + " 0 3\r\nabc\r\nVALUE " + k("r2") + " 0 1\r\n8\r\nEND\r\n", []string{ok, ok, ok, ok, "not a counter", ok}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := fakeMemcached(t, preset, func(conn, n int, cmd, reply string) string {
				if conn != 0 || n != tt.n {
					return reply
				}
				if strings.Contains(tt.reply, "%s") {
					return strings.ReplaceAll(tt.reply, "%s", reply)
				}
				return tt.reply
			})
			c := newClient(t, Config{Servers: []Server{{Addr: addr}}, Timeout: 200 * time.Millisecond, FailureLimit: 1000})
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			batch := ops()
			c.Do(context.Background(), batch)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Errorf("the batch allocated %d bytes, want under 1 MiB whatever lengths the replies announce", grew)
			}
			for i, op := range batch {
				w := tt.want[i]
				var good1 bool
				switch w {
				case ok:
					good1 = op.Err == nil && op.Value == good[i]
				case malformed:
					good1 = errors.Is(op.Err, ErrMalformed)
				case timeout:
					good1 = errors.Is(op.Err, ErrTimeout)
				default:
					good1 = op.Err != nil && !errors.Is(op.Err, ErrMalformed) && strings.Contains(op.Err.Error(), w)
				}
				if op.Err != nil && (!strings.HasPrefix(op.Err.Error(), "shardproxy: ") || !strings.Contains(op.Err.Error(), addr)) {
					t.Errorf("op %d: error %q does not name the shard", i, op.Err)
				}
				if !good1 {
					t.Errorf("op %d (delta %d): got %d, %v, want %s", i, op.Delta, op.Value, op.Err, w)
				}
			}
			fails, idle := c.shards[0].fails.Load(), idlePipes(c, 0)
			if tt.failure && (fails != 1 || idle != 0) {
				t.Errorf("after the batch: got %d failures and %d idle connections, want 1 failure (one per batch) and the connection closed", fails, idle)
			}
			if !tt.failure && (fails != 0 || idle != 1) {
				t.Errorf("after the batch: got %d failures and %d idle connections, want 0 (memcached's own answers) and the connection kept", fails, idle)
			}
			// The next batch gets a new connection, which the fault spares.
			batch = ops()
			c.Do(context.Background(), batch)
			for i, op := range batch {
				if op.Err != nil && !strings.Contains(op.Err.Error(), "client error") && !strings.Contains(op.Err.Error(), "not a counter") {
					t.Errorf("next batch, op %d: got %v, want success on a new connection", i, op.Err)
				}
			}
			if got := c.shards[0].fails.Load(); got != 0 {
				t.Errorf("after a good batch: got %d failures, want 0", got)
			}
		})
	}
}

// TestPipelineEjectionAndReturn kills a shard whose pipeline connections
// are idle: each failing batch counts one failure, FailureLimit of them
// eject it, and when it is back its first batch succeeds (no connection
// its failure left behind is reused).
func TestPipelineEjectionAndReturn(t *testing.T) {
	ps := startShards(t, 3)
	cfg := Config{Servers: serversOf(ps), Timeout: slow, FailureLimit: 2, RetryTimeout: 300 * time.Millisecond}
	c := newClient(t, cfg)
	ctx := context.Background()
	ring := c.Ring()
	batch := func() []Op {
		var ops []Op
		for s := range 3 {
			for j := range 5 {
				ops = append(ops, Op{Key: keyOn(t, ring, s, uint64(10*s+j)), Delta: 1, TTL: time.Minute})
			}
		}
		return ops
	}
	onShard1 := func(ops []Op) (failed, all int) {
		for _, op := range ops {
			if ring.Lookup(AppendCounterKey(nil, op.Key, op.Start)) == 1 {
				all++
				if op.Err != nil {
					failed++
				}
			}
		}
		return failed, all
	}
	ops := batch()
	c.Do(ctx, ops)
	if f, _ := onShard1(ops); f != 0 || idlePipes(c, 1) == 0 {
		t.Fatalf("first batch: got %d failed ops on shard 1 and %d idle pipelines, want 0 and some", f, idlePipes(c, 1))
	}
	ps[1].Kill()
	for i := range cfg.FailureLimit {
		ops := batch()
		c.Do(ctx, ops)
		if f, all := onShard1(ops); f != all {
			t.Fatalf("batch %d with shard 1 dead: got %d of its %d ops failed, want all", i, f, all)
		}
		if live := c.Ring().IsLive(1); live != (i < cfg.FailureLimit-1) {
			t.Fatalf("after %d failed batches: got shard 1 live %v, want %v (one failure per batch)", i+1, live, i < cfg.FailureLimit-1)
		}
	}
	ejectedAt := time.Now()
	if err := ps[1].Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(ejectedAt.Add(cfg.RetryTimeout + 20*time.Millisecond)))
	ops = batch()
	c.Do(ctx, ops)
	if f, _ := onShard1(ops); f != 0 || !c.Ring().IsLive(1) {
		t.Errorf("first batch after shard 1 returned (on probation): got %d failed ops, live %v, want 0, true", f, c.Ring().IsLive(1))
	}
}

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// TestDoAllocs checks that a pipelined call allocates a few objects per
// call (context, goroutines), none per op.
func TestDoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	allocs := func(n int) float64 {
		ops := make([]Op, n)
		fill := func() {
			for j := range ops {
				ops[j] = Op{Key: uint64(j) * 0x9e3779b97f4a7c15, Start: 0, Delta: int64(j % 3), TTL: time.Minute}
			}
		}
		fill()
		c.Do(context.Background(), ops) // create the counters
		return testing.AllocsPerRun(50, func() {
			fill()
			c.Do(context.Background(), ops)
		})
	}
	small, large := allocs(30), allocs(600)
	t.Logf("allocations per call: %v for 30 ops, %v for 600", small, large)
	if large > small+4 || large > 24 {
		t.Errorf("allocations per call: got %v for 600 ops and %v for 30, want no more than a few per call, none per op", large, small)
	}
}
