package edge_test

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

func TestTwoEdgesShareMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	rules := "rules: [{name: shared, limit: 20, window: 1m}]"
	a := startEdge(t, edgeOpts{rules: rules, memcache: addrs})
	b := startEdge(t, edgeOpts{rules: rules, memcache: addrs})
	allowed := alternate(t, a, b, 60)
	if allowed < 20 || allowed > 22 {
		t.Errorf("two edges admitted %d for one client under 20 per minute, want 20 (at most one more per edge)", allowed)
	}
}

func TestShutdownFlushesCounters(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	rules := "rules: [{name: flushme, limit: 1000, window: 1m}]"
	// A long flush interval: nothing is flushed unless shutdown does it.
	e := startEdge(t, edgeOpts{rules: rules, memcache: addrs, flush: time.Minute})
	for i := 0; i < 37; i++ {
		get(t, e.addr, "/")
	}
	e.shutdown(t)
	mc, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: addrs[0]}, {Addr: addrs[1]}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	r := e.srv.Rules().Rules[0]
	key := r.Hash([]byte("127.0.0.1"))
	start := time.Now().Truncate(time.Minute).UnixMilli()
	got, err := mc.Get(context.Background(), key, start)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 37 {
		t.Errorf("memcached counter after shutdown = %d, want the 37 admitted", got[0])
	}
}

func TestStoreDownFailOpenAndClosed(t *testing.T) {
	shards, addrs := testenv.Shards(t, 1)
	e := startEdge(t, edgeOpts{memcache: addrs, rules: `
rules:
  - name: open
    path_prefix: /open
    limit: 100
    window: 1m
  - name: closed
    path_prefix: /closed
    limit: 100
    window: 1m
    fail: closed
  - name: closed-sync
    path_prefix: /login
    limit: 100
    window: 1m
    mode: sync
    fail: closed
`})
	for _, p := range []string{"/open", "/closed", "/login"} {
		if s := get(t, e.addr, p).StatusCode; s != 200 {
			t.Fatalf("%s with memcached up: %d", p, s)
		}
	}
	shards[0].Kill()
	// The edge learns that the store died from its own traffic: the
	// flushes of these fail, and the shard is ejected.
	deadline := time.Now().Add(3 * time.Second)
	for e.Ready() && time.Now().Before(deadline) {
		get(t, e.addr, "/open")
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		path string
		want int
	}{{"/open", 200}, {"/closed", 429}, {"/login", 429}} {
		start := time.Now()
		s := get(t, e.addr, tc.path).StatusCode
		if s != tc.want {
			t.Errorf("%s with memcached down: %d, want %d", tc.path, s, tc.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s took %v with the store down", tc.path, d)
		}
	}
	if e.Ready() {
		t.Error("ready with the store down and fail-closed rules")
	}
}

// Two edges sharing one Redis limit a client once, as with memcached.
func TestTwoEdgesShareRedis(t *testing.T) {
	r := testenv.Redis(t)
	rules := "rules: [{name: login, path_prefix: /login, limit: 3, window: 1m, mode: sync}, {name: shared, limit: 20, window: 1m}]"
	start := func() *testEdge {
		opts := edge.Options{}
		opts.Redis.Addrs = []string{r.Addr}
		opts.Limiter.FlushInterval = 2 * time.Millisecond
		e := edgetest.Start(t, rules, opts)
		return &testEdge{Edge: e, srv: e.Server, lim: e.Limiter, blocks: e.Blocks, addr: e.Addr(), reg: e.Registry}
	}
	a, b := start(), start()
	allowed := alternate(t, a, b, 60)
	if allowed < 20 || allowed > 22 {
		t.Errorf("two edges on one Redis admitted %d for one client under 20 per minute, want 20 (at most one more per edge)", allowed)
	}
	sync := 0
	for i := 0; i < 8; i++ {
		e := a
		if i%2 == 1 {
			e = b
		}
		if get(t, e.addr, "/login").StatusCode == 200 {
			sync++
		}
	}
	if sync != 3 {
		t.Errorf("sync rule through two edges on one Redis admitted %d, want exactly 3", sync)
	}
	if n := testenv.MetricSum(t, a.reg, "poplimit_redis_ops_total"); n == 0 {
		t.Error("no Redis operation counted")
	}
}

// alternate sends n requests to "/", alternately to a and b, 5 ms apart
// (flushes land between them, as client think time would let them), and
// returns how many were allowed.
func alternate(t *testing.T, a, b *testEdge, n int) (allowed int) {
	t.Helper()
	for i := range n {
		e := a
		if i%2 == 1 {
			e = b
		}
		if get(t, e.addr, "/").StatusCode == 200 {
			allowed++
		}
		time.Sleep(5 * time.Millisecond)
	}
	return allowed
}
