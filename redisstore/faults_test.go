package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// TestNoScriptEveryScript flushes the script cache and then sends a batch
// that uses every script: each is answered NOSCRIPT, sent once more as EVAL
// within the same call, and counted; the values are right.
func TestNoScriptEveryScript(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	for round := 1; round <= 3; round++ {
		cli(t, p.Addr, "script", "flush")
		ops := []store.Op{
			{Key: 1, Start: 1, Delta: 5, TTL: time.Minute},
			{Key: 1, Start: 1, Delta: -2},
			{Key: 1, Start: 1},
			{Key: 2, Start: 1, Delta: 1, TTL: time.Minute},
		}
		s.Do(ctx, ops)
		want := []uint64{uint64(3*round) + 2, uint64(3 * round), uint64(3 * round), uint64(round)}
		for i := range ops {
			if ops[i].Err != nil || ops[i].Value != want[i] {
				t.Fatalf("round %d op %d: got %d, %v, want %d", round, i, ops[i].Value, ops[i].Err, want[i])
			}
		}
		cli(t, p.Addr, "script", "flush")
		if _, err := s.SlidingLog(ctx, 1, SlidingLogParams{Limit: 5, Window: time.Minute}, int64(round), 1, true); err != nil {
			t.Fatalf("round %d: sliding log after SCRIPT FLUSH: %v", round, err)
		}
	}
	for _, sc := range []string{"counter", "sliding_log"} {
		if n := testenv.MetricSum(t, reg, "poplimit_redis_script_fallbacks_total", "script", sc); n < 3 {
			t.Errorf("script_fallbacks_total{script=%s}: got %v, want at least 3", sc, n)
		}
	}
}

// TestBadValues puts what the scripts do not write where they read: a
// string where a hash is expected, a hash where a counter is, counters that
// are not numbers, bucket and log fields that do not decode. Each op fails
// alone with ErrReply (the server refused) or ErrBadValue (the value does
// not decode), counted, while the good ops of the same batch succeed.
func TestBadValues(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	set := func(args ...string) { cli(t, p.Addr, args...) }
	set("set", fmtKey(1, 0), "12abc")
	set("set", fmtKey(2, 0), "-5")
	set("hset", fmtKey(3, 0), "f", "1")
	set("set", fmtKey(4, 0), "99999999999999999999")
	set("set", fmtKey(5, 0), "7")

	ops := []store.Op{
		{Key: 1, Start: 0},                  // GET of "12abc"
		{Key: 1, Start: 0, Delta: 1},        // INCRBY of "12abc"
		{Key: 2, Start: 0},                  // GET of "-5"
		{Key: 2, Start: 0, Delta: -1},       // decrement of "-5": clamped to 0
		{Key: 3, Start: 0},                  // GET of a hash
		{Key: 3, Start: 0, Delta: 1},        // INCRBY of a hash
		{Key: 4, Start: 0},                  // GET of a number beyond int64
		{Key: 5, Start: 0, Delta: 1},        // good
		{Key: 6, Start: 0, Delta: 2},        // good, new
		{Key: 5, Start: 0},                  // good
		{Key: 6, Start: 0, Delta: -1},       // good
		{Key: 2, Start: 0, Delta: 1 << 62},  // of the 0 it was clamped to
		{Key: 7, Start: 0, Delta: -1 << 63}, // decrement by |MinInt64| of a missing counter
	}
	s.Do(ctx, ops)
	wantErr := []error{ErrBadValue, ErrReply, ErrBadValue, nil, ErrReply, ErrReply, ErrBadValue, nil, nil, nil, nil, nil, nil}
	wantVal := []uint64{0, 0, 0, 0, 0, 0, 0, 8, 2, 8, 1, 1 << 62, 0}
	for i, op := range ops {
		if wantErr[i] == nil && (op.Err != nil || op.Value != wantVal[i]) || wantErr[i] != nil && !errors.Is(op.Err, wantErr[i]) {
			t.Errorf("op %d %+v: got %d, %v; want %d, %v", i, op, op.Value, op.Err, wantVal[i], wantErr[i])
		}
	}

	params := GCRAParams{Rate: 10, Per: time.Second, Capacity: 5}
	logp := SlidingLogParams{Limit: 5, Window: time.Minute}
	set("set", "pl:{0000000000000001}:gcra", "not a hash")
	set("hset", "pl:{0000000000000002}:gcra", "tat", "12x", "frac", "0")
	set("hset", "pl:{0000000000000003}:gcra", "tat", "1", "frac", "-1")
	set("hset", "pl:{0000000000000004}:gcra", "tat", "99999999999999999999", "frac", "0")
	set("hset", "pl:{0000000000000005}:gcra", "frac", "3") // a tat missing
	set("set", "pl:{0000000000000001}:log", "not a zset")
	set("hset", "pl:{0000000000000001}:logm", "e", "1", "t", "2", "s", "0")
	set("hset", "pl:{0000000000000002}:logm", "e", "1.5", "t", "2", "s", "0")
	set("hset", "pl:{0000000000000003}:logm", "e", "5", "t", "2", "s", "0") // epoch after latest
	set("set", "pl:{0000000000000004}:logm", "not a hash")
	gops := []GCRAOp{
		{Key: 1, Params: params, Now: 10, N: 1, Conditional: true},
		{Key: 2, Params: params, Now: 10, N: 1, Conditional: true},
		{Key: 3, Params: params, Now: 10, N: 1, Conditional: true},
		{Key: 4, Params: params, Now: 10, N: 1, Conditional: false},
		{Key: 5, Params: params, Now: 10, N: 1, Conditional: true},
		{Key: 6, Params: params, Now: 10, N: 1, Conditional: true}, // good
	}
	s.GCRABatch(ctx, gops)
	for i, want := range []error{ErrReply, ErrBadValue, ErrBadValue, ErrBadValue, ErrBadValue, nil} {
		if want == nil && gops[i].Err != nil || want != nil && !errors.Is(gops[i].Err, want) {
			t.Errorf("gcra %d: got %+v, %v; want %v", i, gops[i].Result, gops[i].Err, want)
		}
	}
	if !gops[5].Result.Allowed {
		t.Errorf("gcra of a fresh bucket beside bad ones: got %+v, want allowed", gops[5].Result)
	}
	lops := []SlidingLogOp{
		{Key: 1, Params: logp, Now: 10, N: 1, Conditional: true},
		{Key: 2, Params: logp, Now: 10, N: 1, Conditional: true},
		{Key: 3, Params: logp, Now: 10, N: 1, Conditional: true},
		{Key: 4, Params: logp, Now: 10, N: 1, Conditional: true},
		{Key: 5, Params: logp, Now: 10, N: 1, Conditional: true}, // good
	}
	s.SlidingLogBatch(ctx, lops)
	for i, want := range []error{ErrReply, ErrBadValue, ErrBadValue, ErrReply, nil} {
		if want == nil && lops[i].Err != nil || want != nil && !errors.Is(lops[i].Err, want) {
			t.Errorf("sliding log %d: got %+v, %v; want %v", i, lops[i].Result, lops[i].Err, want)
		}
	}
	if lops[4].Result.Count != 1 {
		t.Errorf("sliding log of a fresh key beside bad ones: got %+v, want count 1", lops[4].Result)
	}
	for _, c := range []struct {
		op, result string
		min        float64
	}{
		{"get", "bad_value", 3}, {"get", "reply_error", 1}, {"incr", "reply_error", 2},
		{"gcra", "reply_error", 1}, {"gcra", "bad_value", 4}, {"sliding_log", "bad_value", 2}, {"sliding_log", "reply_error", 2},
	} {
		if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "op", c.op, "result", c.result); n < c.min {
			t.Errorf("ops_total{op=%s,result=%s}: got %v, want at least %v", c.op, c.result, n, c.min)
		}
	}
	if !s.Healthy() {
		t.Errorf("Healthy after error replies: got false, want true (the server answered)")
	}
}

// TestKilledServer kills the server under a Store: every call fails within
// Timeout with ErrUnavailable or ErrTimeout, counted; after FailureLimit
// calls Healthy is false; when a server is back on the port the Store
// answers again by itself.
func TestKilledServer(t *testing.T) {
	p := startRedis(t)
	const timeout = 100 * time.Millisecond
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: timeout, DialTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}}
	s.Do(ctx, ops)
	if ops[0].Err != nil {
		t.Fatal(ops[0].Err)
	}
	p.Kill()
	for i := range 5 {
		ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}, {Key: 2, Start: 1}}
		start := time.Now()
		s.Do(ctx, ops)
		took := time.Since(start)
		if took > 10*timeout {
			t.Errorf("call %d on a killed server: took %v, want it ended by the %v timeout, not hung", i, took, timeout)
		}
		for _, op := range ops {
			if !errors.Is(op.Err, ErrUnavailable) && !errors.Is(op.Err, ErrTimeout) {
				t.Errorf("call %d: got %v, want ErrUnavailable or ErrTimeout", i, op.Err)
			}
		}
		if _, err := s.GCRA(ctx, 1, GCRAParams{Rate: 1, Per: time.Second, Capacity: 1}, 0, 1, true); err == nil {
			t.Errorf("call %d: GCRA on a killed server: got nil error", i)
		}
	}
	if s.Healthy() {
		t.Errorf("Healthy after 15 unanswered calls: got true, want false")
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "unavailable") +
		testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "timeout"); n < 15 {
		t.Errorf("ops_total{result=unavailable|timeout}: got %v, want at least 15", n)
	}
	if err := p.Start(); err != nil {
		t.Skipf("restarting redis-server on %s: %v", p.Addr, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the Store to answer after the restart", func() bool {
		ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}}
		s.Do(ctx, ops)
		return ops[0].Err == nil && ops[0].Value == 1 // a fresh server: the counter restarts
	})
	if !s.Healthy() {
		t.Errorf("Healthy after the server returned: got false, want true")
	}
}

// TestHungServer puts a relay that stops forwarding between the Store and
// its server: calls in flight and new ones fail with ErrTimeout within
// Timeout (never later, never retried without bound), counted; Healthy
// turns false; when the relay forwards again the Store recovers on fresh
// connections.
func TestHungServer(t *testing.T) {
	p := startRedis(t)
	relay := testenv.NewRelay(t, p.Addr)
	const timeout = 100 * time.Millisecond
	s, reg := newStore(t, Config{Addrs: []string{relay.Addr}, Timeout: timeout, ConnTimeout: 300 * time.Millisecond, DialTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}}
	s.Do(ctx, ops)
	if ops[0].Err != nil {
		t.Fatal(ops[0].Err)
	}
	relay.Hang()
	var worst time.Duration
	deadline := time.Now().Add(1500 * time.Millisecond) // across several ConnTimeouts: redials into the hung relay too
	calls := 0
	for time.Now().Before(deadline) {
		calls++
		ops := make([]store.Op, 64)
		for i := range ops {
			ops[i] = store.Op{Key: uint64(i), Start: 1, Delta: int64(i % 2), TTL: time.Minute}
		}
		start := time.Now()
		s.Do(ctx, ops)
		worst = max(worst, time.Since(start))
		for i, op := range ops {
			if !errors.Is(op.Err, ErrTimeout) && !errors.Is(op.Err, ErrUnavailable) {
				t.Fatalf("call %d op %d through a hung relay: got %v, want ErrTimeout", calls, i, op.Err)
			}
		}
		_, err := s.SlidingLog(ctx, 1, SlidingLogParams{Limit: 1, Window: time.Second}, 1, 1, true)
		if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d: sliding log through a hung relay: got %v, want ErrTimeout", calls, err)
		}
	}
	if worst > timeout+50*time.Millisecond {
		t.Errorf("slowest Do through a hung relay: %v, want at most the %v timeout", worst, timeout)
	}
	t.Logf("%d calls through the hung relay, the slowest %v", calls, worst)
	if s.Healthy() {
		t.Errorf("Healthy while hung: got true, want false")
	}
	if got := testenv.MetricSum(t, reg, "poplimit_redis_healthy"); got != 0 {
		t.Errorf("poplimit_redis_healthy while hung: got %v, want 0", got)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "timeout"); n < 64 {
		t.Errorf("ops_total{result=timeout}: got %v, want at least 64", n)
	}
	relay.Forward()
	testenv.WaitFor(t, 5*time.Second, "the Store to answer after the relay forwards again", func() bool {
		ops := []store.Op{{Key: 1, Start: 1}}
		s.Do(ctx, ops)
		return ops[0].Err == nil && ops[0].Value == 1
	})
	if !s.Healthy() {
		t.Errorf("Healthy after the relay forwards: got false, want true")
	}
	if got := testenv.MetricSum(t, reg, "poplimit_redis_healthy"); got != 1 {
		t.Errorf("poplimit_redis_healthy after the relay forwards: got %v, want 1", got)
	}
}

// TestCallerDeadline checks that a caller's own shorter deadline bounds a
// call, and that its cancellation does not count against the server's
// health.
func TestCallerDeadline(t *testing.T) {
	p := startRedis(t)
	relay := testenv.NewRelay(t, p.Addr)
	s, _ := newStore(t, Config{Addrs: []string{relay.Addr}, Timeout: time.Second, ConnTimeout: 5 * time.Second})
	relay.Hang()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		ops := []store.Op{{Key: 1, Start: 1}}
		start := time.Now()
		s.Do(ctx, ops)
		cancel()
		// The store's own timeout is 1 s: a call that ended well before
		// it was ended by the caller's deadline.
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("Do with a 30ms deadline: took %v, want it ended by the deadline, not the store's 1 s timeout", took)
		}
		if !errors.Is(ops[0].Err, ErrTimeout) {
			t.Errorf("Do with a 30ms deadline: got %v, want ErrTimeout", ops[0].Err)
		}
	}
	healthyBefore := s.fails.Load()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ops := []store.Op{{Key: 1, Start: 1}}
	s.Do(ctx, ops)
	if !errors.Is(ops[0].Err, context.Canceled) {
		t.Errorf("Do cancelled by its caller: got %v, want context.Canceled", ops[0].Err)
	}
	if got := s.fails.Load(); got != healthyBefore {
		t.Errorf("unanswered calls after a cancelled one: got %d, want %d (not charged to the server)", got, healthyBefore)
	}
}

// TestGarbageServer points the Store at a listener that answers every
// command with bytes that are not RESP: connecting fails and keeps failing,
// ops fail with ErrUnavailable at once, nothing panics, and Close stops the
// connector.
func TestGarbageServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\n\r\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	s, reg := newStore(t, Config{Addrs: []string{ln.Addr().String()}, DialTimeout: 200 * time.Millisecond, ReconnectInterval: 20 * time.Millisecond})
	time.Sleep(150 * time.Millisecond)
	ops := []store.Op{{Key: 1, Start: 1, Delta: 1}}
	s.Do(context.Background(), ops)
	if !errors.Is(ops[0].Err, ErrUnavailable) {
		t.Errorf("Do against a server that is not Redis: got %v, want ErrUnavailable", ops[0].Err)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_connects_total", "result", "error"); n < 2 {
		t.Errorf("connects_total{result=error}: got %v, want the attempts counted", n)
	}
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return within 2s")
	}
}
