package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// newStore returns a Store for cfg with its own registry, closed at
// cleanup.
func newStore(t testing.TB, cfg Config) (*Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, reg
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none: valid
	}{
		{"minimal", Config{Addrs: []string{"127.0.0.1:6379"}}, nil},
		{"cluster entry points", Config{Addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000"}, Mode: TopologyCluster, ConnsPerNode: 4}, nil},
		{"no address", Config{}, []string{"Addrs: empty"}},
		{"bad address", Config{Addrs: []string{"localhost"}}, []string{`Addrs[0]: "localhost"`}},
		{"standalone with two", Config{Addrs: []string{"a:1", "b:1"}, Mode: TopologyStandalone}, []string{`Mode: "standalone" with 2 addresses`}},
		{"unknown mode", Config{Addrs: []string{"a:1"}, Mode: "sentinal"}, []string{`Mode: "sentinal"`}},
		{"sentinels", Config{Addrs: []string{"s1:26379", "s2:26379", "s3:26379"}, Mode: TopologySentinel, SentinelMaster: "mymaster", SentinelPassword: "x"}, nil},
		{"sentinel without master", Config{Addrs: []string{"s1:26379"}, Mode: TopologySentinel}, []string{`SentinelMaster: empty: mode "sentinel"`}},
		{"master without sentinel", Config{Addrs: []string{"a:1"}, SentinelMaster: "mymaster"}, []string{`SentinelMaster: "mymaster" (or another Sentinel field) set with mode ""`}},
		{"sentinel refresh", Config{Addrs: []string{"s1:26379"}, Mode: TopologySentinel, SentinelMaster: "m", SentinelRefresh: -time.Second}, []string{"SentinelRefresh: -1s"}},
		{"db in a cluster", Config{Addrs: []string{"a:1"}, Mode: TopologyCluster, DB: 2}, []string{"DB: 2: a cluster"}},
		{"everything wrong at once", Config{
			Addrs: []string{"a:1"}, DB: -1, Timeout: -time.Second, DialTimeout: 2 * time.Minute,
			ConnTimeout: time.Hour, ReconnectInterval: -1, ConnsPerNode: 3, BufferBytes: 100,
			FailureLimit: -2, MaxLogEntries: 1 << 30,
		}, []string{
			"DB: -1", "Timeout: -1s", "DialTimeout: 2m0s", "ConnTimeout: 1h0m0s", "ReconnectInterval: -1ns",
			"ConnsPerNode: 3", "BufferBytes: 100", "FailureLimit: -2", "MaxLogEntries: 1073741824",
		}},
		{"conn timeout below timeout", Config{Addrs: []string{"a:1"}, Timeout: 2 * time.Second, ConnTimeout: time.Second},
			[]string{"ConnTimeout: 1s: less than Timeout (2s)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: got %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: got nil, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: got %q, want it to contain %q", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), "redisstore: config: ") {
				t.Errorf("Validate: got %q, want the prefix %q", err, "redisstore: config: ")
			}
		})
	}
}

// TestDoMatchesMemStore runs random batches of increments, decrements and
// reads over a few counters through the Store and through store.MemStore,
// the reference semantics, and compares every op's value.
func TestDoMatchesMemStore(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: time.Second})
	mem := store.NewMemStore(nil)
	r := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	for batch := range 200 {
		ops := make([]store.Op, 1+r.IntN(40))
		for i := range ops {
			ops[i] = store.Op{Key: uint64(r.IntN(5)) * 0x9e3779b97f4a7c15, Start: 1_700_000_000_000 + int64(r.IntN(3))*60_000, TTL: time.Minute}
			switch r.IntN(3) {
			case 0:
				ops[i].Delta = 1 + r.Int64N(5)
			case 1:
				ops[i].Delta = -1 - r.Int64N(3)
			}
		}
		want := append([]store.Op(nil), ops...)
		mem.Do(ctx, want)
		s.Do(ctx, ops)
		for i := range ops {
			if ops[i].Err != nil || ops[i].Value != want[i].Value {
				t.Fatalf("batch %d op %d %+v: got %d, %v, want %d, nil", batch, i, ops[i], ops[i].Value, ops[i].Err, want[i].Value)
			}
		}
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "ok") +
		testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "miss"); n == 0 {
		t.Errorf("poplimit_redis_ops_total{result=ok|miss}: got 0, want the ops counted")
	}
	if !s.Healthy() {
		t.Errorf("Healthy: got false, want true")
	}
}

// TestDoTTL checks that an increment that creates a counter gives it the
// op's TTL (rounded up to ms, at least 1 s), that later increments and
// decrements keep it, and that a decrement of a missing counter creates
// nothing.
func TestDoTTL(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	pttl := func(key uint64, start int64) int64 {
		v, err := strconv.ParseInt(cli(t, p.Addr, "pttl", fmtKey(key, start)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name     string
		ttl      time.Duration
		min, max int64 // ms
	}{
		{"two minutes", 2 * time.Minute, 119_000, 120_000},
		{"sub-millisecond rounds up", 90*time.Second + time.Microsecond, 89_000, 90_001},
		{"zero is a second", 0, 900, 1000},
	}
	for i, tt := range tests {
		key := uint64(i + 1)
		ops := []store.Op{{Key: key, Start: 5, Delta: 3, TTL: tt.ttl}}
		s.Do(ctx, ops)
		if ops[0].Err != nil || ops[0].Value != 3 {
			t.Fatalf("%s: incr: got %d, %v, want 3, nil", tt.name, ops[0].Value, ops[0].Err)
		}
		if got := pttl(key, 5); got < tt.min || got > tt.max {
			t.Errorf("%s: PTTL after create: got %d, want %d to %d", tt.name, got, tt.min, tt.max)
		}
		ops = []store.Op{{Key: key, Start: 5, Delta: 2, TTL: time.Hour}, {Key: key, Start: 5, Delta: -10, TTL: time.Hour}}
		s.Do(ctx, ops)
		if ops[0].Value != 5 || ops[1].Value != 0 || ops[0].Err != nil || ops[1].Err != nil {
			t.Fatalf("%s: incr, decr: got %+v, want 5 then 0 (clamped)", tt.name, ops)
		}
		if got := pttl(key, 5); got < tt.min-1000 || got > tt.max {
			t.Errorf("%s: PTTL after incr and decr: got %d, want the first TTL kept (%d to %d)", tt.name, got, tt.min, tt.max)
		}
	}
	ops := []store.Op{{Key: 99, Start: 5, Delta: -1, TTL: time.Hour}}
	s.Do(ctx, ops)
	if ops[0].Value != 0 || ops[0].Err != nil {
		t.Fatalf("decr of a missing counter: got %d, %v, want 0, nil", ops[0].Value, ops[0].Err)
	}
	if got := cli(t, p.Addr, "exists", fmtKey(99, 5)); got != "0" {
		t.Errorf("EXISTS after a decr of a missing counter: got %s, want 0", got)
	}
}

func TestAppendCounterKey(t *testing.T) {
	tests := []struct {
		key   uint64
		start int64
		want  string
	}{
		{0, 0, "pl:{0000000000000000}:0"},
		{0xdeadbeef, 1_700_000_000_000, "pl:{00000000deadbeef}:1700000000000"},
		{1<<64 - 1, -9223372036854775808, "pl:{ffffffffffffffff}:-9223372036854775808"},
	}
	for _, tt := range tests {
		if got := string(AppendCounterKey(nil, tt.key, tt.start)); got != tt.want {
			t.Errorf("AppendCounterKey(%#x, %d): got %q, want %q", tt.key, tt.start, got, tt.want)
		}
		if got := fmtKey(tt.key, tt.start); got != tt.want {
			t.Errorf("fmtKey(%#x, %d): got %q, want %q", tt.key, tt.start, got, tt.want)
		}
	}
	var buf [64]byte
	if n := testing.AllocsPerRun(100, func() { AppendCounterKey(buf[:0], 42, 1_700_000_000_000) }); n != 0 {
		t.Errorf("AppendCounterKey: got %v allocations, want 0", n)
	}
}

// TestNotConnected checks a Store whose server is not there: New succeeds,
// ops fail at once with ErrUnavailable naming the cause, Healthy is false,
// and the Store connects by itself once the server is up.
func TestNotConnected(t *testing.T) {
	port := testenv.FreePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s, reg := newStore(t, Config{Addrs: []string{addr}, ReconnectInterval: 50 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}, {Key: 1, Start: 1}}
	// Failing at once means from the Store's own state, never from a
	// round trip: not ErrTimeout. The bound only guards against a hang.
	start := time.Now()
	s.Do(context.Background(), ops)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Do while not connected: took %v, want a failure without waiting for the server", took)
	}
	for i, op := range ops {
		if !errors.Is(op.Err, ErrUnavailable) || errors.Is(op.Err, ErrTimeout) || !strings.Contains(op.Err.Error(), addr) {
			t.Errorf("op %d: got %v, want ErrUnavailable naming %s, not a timeout", i, op.Err, addr)
		}
	}
	if s.Healthy() {
		t.Errorf("Healthy while not connected: got true, want false")
	}
	if _, err := s.GCRA(context.Background(), 1, GCRAParams{Rate: 1, Per: time.Second, Capacity: 1}, 0, 1, true); !errors.Is(err, ErrUnavailable) {
		t.Errorf("GCRA while not connected: got %v, want ErrUnavailable", err)
	}

	bin := testenv.LookBinary(t, "redis-server", "redis-server")
	p := &testenv.Proc{Name: bin, Args: redisArgs(port, t.TempDir()), Addr: addr}
	if err := p.Start(); err != nil {
		t.Skipf("port %d taken meanwhile: %v", port, err)
	}
	t.Cleanup(p.Kill)
	testenv.WaitFor(t, 5*time.Second, "the Store to connect", s.Healthy)
	s.Do(context.Background(), ops)
	if ops[0].Err != nil || ops[0].Value != 1 || ops[1].Value != 1 {
		t.Fatalf("after connecting: got %+v, want 1 and 1", ops)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_connects_total", "result", "ok"); n != 1 {
		t.Errorf("connects_total{result=ok}: got %v, want 1", n)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_connects_total", "result", "error"); n < 1 {
		t.Errorf("connects_total{result=error}: got %v, want at least 1", n)
	}
}

// TestClose checks that ops after Close fail with ErrClosed and that Close
// is idempotent and stops the connector of a Store that never connected.
func TestClose(t *testing.T) {
	p := startRedis(t)
	for _, addr := range []string{p.Addr, "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))} {
		s, err := New(Config{Addrs: []string{addr}, DialTimeout: 100 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		ops := []store.Op{{Key: 1, Start: 1, Delta: 1}}
		s.Do(context.Background(), ops)
		if !errors.Is(ops[0].Err, ErrClosed) {
			t.Errorf("%s: Do after Close: got %v, want ErrClosed", addr, ops[0].Err)
		}
		if s.Healthy() {
			t.Errorf("%s: Healthy after Close: got true, want false", addr)
		}
	}
}

// TestModeClusterOnStandalone checks that TopologyCluster refuses a server that
// is not a cluster node, and TopologyStandalone and TopologyAuto take it.
func TestModeClusterOnStandalone(t *testing.T) {
	p := startRedis(t)
	for _, tt := range []struct {
		mode Topology
		ok   bool
	}{{TopologyAuto, true}, {TopologyStandalone, true}, {TopologyCluster, false}} {
		s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Mode: tt.mode, ReconnectInterval: time.Hour})
		ops := []store.Op{{Key: 1, Start: 1}}
		s.Do(context.Background(), ops)
		if tt.ok && ops[0].Err != nil || !tt.ok && (!errors.Is(ops[0].Err, ErrUnavailable) || !strings.Contains(ops[0].Err.Error(), "not a cluster")) {
			t.Errorf("mode %q on a standalone server: got %v, want ok %v", tt.mode, ops[0].Err, tt.ok)
		}
	}
}
