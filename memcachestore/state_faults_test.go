package memcachestore_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

// TestStateBadValue: a value under a state's key that does not decode (not
// ours, or of another version) fails the ops on it with algo.ErrBadState
// and is left as it is; other keys in the call are unaffected.
func TestStateBadValue(t *testing.T) {
	_, addrs := testenv.Shards(t, 3)
	reg := prometheus.NewRegistry()
	c := stateClient(t, addrs, stateTimeout)
	s, err := memcachestore.New(c, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	sl := algo.SlidingLog{Limit: 5, Window: time.Second}
	now := time.Now().UnixNano()
	garbage := []byte("G\x00not a bucket\r\nEND\r\n")
	for _, tc := range []struct {
		name string
		op   store.StateOp
	}{
		{"bucket conditional", store.StateOp{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: true}},
		{"bucket unconditional", store.StateOp{Kind: store.StateGCRA, Key: 2, Bucket: lb, Now: now, N: 1}},
		{"bucket read", store.StateOp{Kind: store.StateGCRA, Key: 3, Bucket: lb, Now: now}},
		{"log conditional", store.StateOp{Kind: store.StateLog, Key: 4, Log: sl, Now: now, N: 1, Conditional: true}},
		{"log unconditional", store.StateOp{Kind: store.StateLog, Key: 5, Log: sl, Now: now, N: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skey := memcachestore.StateKey(&tc.op)
			if err := c.Add(ctx, skey, garbage, time.Minute); err != nil {
				t.Fatal(err)
			}
			ops := []store.StateOp{
				tc.op,
				{Kind: store.StateGCRA, Key: tc.op.Key + 1000, Bucket: lb, Now: now, N: 1, Conditional: true},
				tc.op, // twice in a call: both fail
			}
			s.DoState(ctx, ops)
			for _, j := range []int{0, 2} {
				if !errors.Is(ops[j].Err, algo.ErrBadState) || ops[j].Allowed {
					t.Errorf("op %d on garbage: allowed %v, err %v, want ErrBadState", j, ops[j].Allowed, ops[j].Err)
				}
			}
			if ops[1].Err != nil || !ops[1].Allowed {
				t.Errorf("op on another key in the call: allowed %v, err %v, want allowed", ops[1].Allowed, ops[1].Err)
			}
			v, _, err := c.Gets(ctx, skey)
			if err != nil || !bytes.Equal(v, garbage) {
				t.Errorf("the garbage after the ops: %q, %v, want it untouched", v, err)
			}
		})
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "result", "bad_value"); n != 10 {
		t.Errorf("poplimit_state_ops_total{result=bad_value}: got %v, want 10", n)
	}
	// A bucket's value read as a log, and a log's as a bucket, never:
	// their keys differ.
	b := store.StateOp{Kind: store.StateGCRA, Key: 77, Bucket: lb, Now: now, N: 1, Conditional: true}
	l := store.StateOp{Kind: store.StateLog, Key: 77, Log: sl, Now: now, N: 1, Conditional: true}
	ops := []store.StateOp{b, l, b, l}
	s.DoState(ctx, ops)
	for j := range ops {
		if ops[j].Err != nil || !ops[j].Allowed {
			t.Errorf("op %d on key 77: allowed %v, err %v", j, ops[j].Allowed, ops[j].Err)
		}
	}
}

// TestStateDeadMemcached: when the only shard dies, ops fail within the
// client's timeouts with an error, and are counted as errors; ops before
// it succeed.
func TestStateDeadMemcached(t *testing.T) {
	p := testenv.Memcached(t)
	const timeout = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	s, err := memcachestore.New(stateClient(t, []string{p.Addr}, timeout), reg)
	if err != nil {
		t.Fatal(err)
	}
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	op := func() store.StateOp {
		return store.StateOp{Kind: store.StateGCRA, Key: 5, Bucket: lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
	}
	ops := []store.StateOp{op()}
	s.DoState(context.Background(), ops)
	if ops[0].Err != nil || !ops[0].Allowed {
		t.Fatalf("before the kill: allowed %v, err %v", ops[0].Allowed, ops[0].Err)
	}
	p.Kill()
	limit := timeout + shardproxy.DefaultBatchGrace + 500*time.Millisecond
	for i := range 5 {
		ops := []store.StateOp{op(), op()}
		begin := time.Now()
		s.DoState(context.Background(), ops)
		took := time.Since(begin)
		for j := range ops {
			if ops[j].Err == nil || ops[j].Allowed {
				t.Errorf("call %d op %d after the kill: allowed %v, err %v, want an error", i, j, ops[j].Allowed, ops[j].Err)
			}
		}
		if took > limit {
			t.Errorf("call %d after the kill took %v, want within %v", i, took, limit)
		}
		t.Logf("call %d: %v after %v", i, ops[0].Err, took)
	}
	// A caller's deadline shorter than the client's timeout is kept too.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ops = []store.StateOp{op()}
	begin := time.Now()
	s.DoState(ctx, ops)
	if took := time.Since(begin); ops[0].Err == nil || took > 500*time.Millisecond {
		t.Errorf("with a 20ms deadline: err %v after %v", ops[0].Err, took)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_state_ops_total", "result", "error"); n != 11 {
		t.Errorf("poplimit_state_ops_total{result=error}: got %v, want 11", n)
	}
}

// TestStateHungMemcached: of two shards, one hangs (a partition: requests
// vanish, connections stay open): the ops of a call on its keys fail
// within the client's timeouts, those on the other shard's keys in the
// same call succeed.
func TestStateHungMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	relay := testenv.NewRelay(t, addrs[1])
	const timeout = 200 * time.Millisecond
	c := stateClient(t, []string{addrs[0], relay.Addr}, timeout)
	s := &memcachestore.Store{Client: c}
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	ops := make([]store.StateOp, 20)
	keys := make([]uint64, len(ops))
	for i := range keys {
		keys[i] = rand.Uint64()
	}
	mk := func() {
		for i := range ops {
			ops[i] = store.StateOp{Kind: store.StateGCRA, Key: keys[i], Bucket: lb, Now: time.Now().UnixNano(), N: 1, Conditional: true}
		}
	}
	mk()
	s.DoState(context.Background(), ops)
	hung := 0
	for i := range ops {
		if ops[i].Err != nil {
			t.Fatalf("op %d before the hang: %v", i, ops[i].Err)
		}
		if c.Ring().Lookup(shardproxy.AppendValueKey(nil, memcachestore.StateKey(&ops[i]))) == 1 {
			hung++
		}
	}
	if hung == 0 || hung == len(ops) {
		t.Fatalf("%d of %d keys on the shard to hang, want some", hung, len(ops))
	}
	relay.Hang()
	mk()
	begin := time.Now()
	s.DoState(context.Background(), ops)
	took := time.Since(begin)
	for i := range ops {
		onHung := c.Ring().Lookup(shardproxy.AppendValueKey(nil, memcachestore.StateKey(&ops[i]))) == 1
		switch {
		case onHung && (ops[i].Err == nil || ops[i].Allowed):
			t.Errorf("op %d on the hung shard: allowed %v, err %v, want an error", i, ops[i].Allowed, ops[i].Err)
		case !onHung && (ops[i].Err != nil || !ops[i].Allowed):
			t.Errorf("op %d on the live shard: allowed %v, err %v, want allowed", i, ops[i].Allowed, ops[i].Err)
		}
	}
	if limit := timeout + shardproxy.DefaultBatchGrace + 500*time.Millisecond; took > limit {
		t.Errorf("call with a hung shard took %v, want within %v", took, limit)
	}
	t.Logf("%d ops on the hung shard failed after %v", hung, took)
}
