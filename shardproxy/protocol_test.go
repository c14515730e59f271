package shardproxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// ttlOf returns the seconds memcached says the item key has left.
func ttlOf(t testing.TB, addr, key string) int {
	t.Helper()
	reply := command(t, addr, "mg "+key+" t")
	f := strings.Fields(reply)
	if len(f) < 2 || f[0] != "HD" {
		t.Fatalf("mg %s t: got %q, want HD t<seconds>", key, reply)
	}
	ttl, err := strconv.Atoi(strings.TrimPrefix(f[len(f)-1], "t"))
	if err != nil {
		t.Fatalf("mg %s t: got %q: %v", key, reply, err)
	}
	return ttl
}

// TestMetaIncrements runs increments as ma commands against a real
// memcached: a missing counter is created with the delta and the op's TTL
// in one command, an existing one is incremented and keeps its TTL, a
// value that is not a number is memcached's CLIENT_ERROR, and reads and
// decrements are as with the text protocol.
func TestMetaIncrements(t *testing.T) {
	ps := startShards(t, 1)
	addr := ps[0].Addr
	reg := prometheus.NewRegistry()
	c, err := New(Config{Servers: serversOf(ps), Timeout: slow, Protocol: ProtocolMeta}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const start = int64(1_700_000_000_000)

	// Alone on its shard, an increment still goes through a pipeline.
	v, err := c.Incr(ctx, 1, start, 5, 90*time.Second)
	if err != nil || v != 5 {
		t.Fatalf("Incr of a missing counter: got %d, %v, want 5, nil", v, err)
	}
	if idlePipes(c, 0) != 1 {
		t.Errorf("idle pipeline connections after a lone meta increment: got %d, want 1", idlePipes(c, 0))
	}
	if ttl := ttlOf(t, addr, counterKey(1, start)); ttl != 90 && ttl != 89 {
		t.Errorf("TTL of the created counter: got %d, want 90 (or 89 across a clock tick)", ttl)
	}
	if v, err := c.Incr(ctx, 1, start, 3, time.Hour); err != nil || v != 8 {
		t.Errorf("Incr of an existing counter: got %d, %v, want 8, nil", v, err)
	}
	if ttl := ttlOf(t, addr, counterKey(1, start)); ttl > 90 {
		t.Errorf("TTL after incrementing: got %d, want at most 90 (the TTL is set only on creation)", ttl)
	}
	if ttl := func() int { c.Incr(ctx, 2, start, 1, 0); return ttlOf(t, addr, counterKey(2, start)) }(); ttl != 1 && ttl != 0 {
		t.Errorf("TTL of a counter created with TTL 0: got %d, want 1 (a second at least, never no expiry)", ttl)
	}

	// A batch: new and existing counters, decrements and reads, all in one
	// round.
	ops := []Op{
		{Key: 1, Start: start, Delta: 2, TTL: time.Minute}, // 10
		{Key: 3, Start: start, Delta: 7, TTL: time.Minute}, // created
		{Key: 1, Start: start, Delta: -4},                  // 6
		{Key: 4, Start: start, Delta: -1},                  // missing: 0
		{Key: 3, Start: start},                             // 7
		{Key: 5, Start: start},                             // missing: 0
		{Key: 3, Start: start, Delta: 1, TTL: time.Minute}, // 8
	}
	c.Do(ctx, ops)
	for i, want := range []uint64{10, 7, 6, 0, 7, 0, 8} {
		if ops[i].Err != nil || ops[i].Value != want {
			t.Errorf("op %d (key %d delta %d): got %d, %v, want %d, nil", i, ops[i].Key, ops[i].Delta, ops[i].Value, ops[i].Err, want)
		}
	}
	if got := testutil.ToFloat64(c.m.ops[kindIncr][resultMiss]); got != 0 {
		t.Errorf("meta increments counted as misses: got %v, want 0 (ma does not say it created one)", got)
	}
	if got := testutil.ToFloat64(c.m.ops[kindIncr][resultOK]); got != 6 {
		t.Errorf("meta increments counted ok: got %v, want 6", got)
	}

	// memcached's CLIENT_ERROR is the op's answer, not a shard failure.
	if r := command(t, addr, fmt.Sprintf("set %s 0 60 3\r\nabc", counterKey(6, start))); r != "STORED" {
		t.Fatalf("set: %s", r)
	}
	if _, err := c.Incr(ctx, 6, start, 1, time.Minute); err == nil || !strings.Contains(err.Error(), "client error") {
		t.Errorf("ma of a non-numeric value: got %v, want memcached's CLIENT_ERROR", err)
	}
	if got := c.shards[0].fails.Load(); got != 0 || idlePipes(c, 0) != 1 {
		t.Errorf("after a CLIENT_ERROR: got %d failures, %d idle connections, want 0 and 1", got, idlePipes(c, 0))
	}
}

// TestMetaConcurrentCreate races 32 goroutines to create one counter with
// ma: memcached creates it once, under its lock, and counts every
// increment.
func TestMetaConcurrentCreate(t *testing.T) {
	ps := startShards(t, 1)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow, Protocol: ProtocolMeta})
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
	if got, err := c.Get(context.Background(), 4242, 0); err != nil || got[0] != goroutines*each {
		t.Errorf("counter after %d concurrent increments of 1: got %v, %v, want %d", goroutines*each, got, err, goroutines*each)
	}
}

// BenchmarkIncrBatch256 compares the two protocols on the edge's flush: a
// pipelined batch of 256 increments on one real memcached, of counters
// that exist (one round either way) and of new ones (text: incr, then
// add; meta: ma creates them in the first round).
func BenchmarkIncrBatch256(b *testing.B) {
	ps := startShards(b, 1)
	for _, proto := range []Protocol{ProtocolText, ProtocolMeta} {
		for _, fresh := range []bool{false, true} {
			name := string(proto) + "/existing"
			if fresh {
				name = string(proto) + "/new"
			}
			b.Run(name, func(b *testing.B) {
				c := newClient(b, Config{Servers: serversOf(ps), Protocol: proto, Timeout: slow}) // slow: also under strace
				ops := make([]Op, 256)
				base := rand.Int64N(1 << 40)
				fill := func(i int) {
					start := base
					if fresh {
						start += int64(i) + 1
					}
					for j := range ops {
						ops[j] = Op{Key: uint64(j) * 0x9e3779b97f4a7c15, Start: start, Delta: 1, TTL: time.Minute}
					}
				}
				fill(-1)
				c.Do(context.Background(), ops) // the existing counters
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					fill(i)
					c.Do(context.Background(), ops)
					if err := ops[0].Err; err != nil {
						b.Fatal(err)
					}
					if fresh && ops[0].Value != 1 {
						b.Fatalf("new counter: got %d, want 1", ops[0].Value)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/op-in-batch")
			})
		}
	}
}
