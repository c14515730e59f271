package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// TestDoAllocs bounds what a Do call allocates: one string for all its keys
// and arguments, the call's timeout context, the goroutine that runs its
// round trips, and rueidis' replies, a constant per call (10 when this was
// written) whatever the number of increments (integer replies allocate
// nothing). Reads allocate one string per counter found, in rueidis' reply
// parser.
func TestDoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: time.Second})
	ctx := context.Background()
	for _, n := range []int{1, 16, 256, 1024} {
		ops := make([]store.Op, n)
		fill := func() {
			for i := range ops {
				ops[i] = store.Op{Key: uint64(i) * 0x9e3779b97f4a7c15, Start: 1_700_000_000_000, Delta: 1, TTL: time.Minute}
			}
		}
		for range 100 { // warm the pools and dial every connection
			fill()
			s.Do(ctx, ops)
		}
		got := testing.AllocsPerRun(50, func() {
			fill()
			s.Do(ctx, ops)
		})
		for _, op := range ops {
			if op.Err != nil {
				t.Fatal(op.Err)
			}
		}
		t.Logf("Do of %d increments: %.1f allocations", n, got)
		if got > 12 {
			t.Errorf("Do of %d increments: got %.1f allocations a call, want at most 12 whatever the count", n, got)
		}
	}
}

// TestGCRAAllocs bounds a conditional GCRA call: its reply (an array of
// three, two of them strings), and the per-call constant of Do.
func TestGCRAAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: time.Second})
	ctx := context.Background()
	params := GCRAParams{Rate: 100, Per: time.Minute, Capacity: 20}
	now := int64(1_700_000_000_000_000_000)
	for range 100 {
		now += int64(time.Second)
		s.GCRA(ctx, 1, params, now, 1, true)
	}
	got := testing.AllocsPerRun(100, func() {
		now += int64(time.Second)
		if _, err := s.GCRA(ctx, 1, params, now, 1, true); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("GCRA: %.1f allocations", got)
	if got > 15 {
		t.Errorf("GCRA: got %.1f allocations a call, want at most 15", got)
	}
}

// TestDoAllocsFailing bounds what a failing Do allocates: the ops of a call
// that fail alike share one error, so a flush of a thousand ops to a Store
// that never connected costs a handful of allocations. Against a server
// that died, rueidis does not recycle the commands of a failed pipeline and
// builds new ones: about three allocations an op, none of them errors.
func TestDoAllocsFailing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: 200 * time.Millisecond})
	never, _ := newStore(t, Config{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 50 * time.Millisecond, ReconnectInterval: time.Hour})
	ctx := context.Background()
	ops := make([]store.Op, 1024)
	fill := func() {
		for i := range ops {
			ops[i] = store.Op{Key: uint64(i), Start: 1, Delta: int64(i % 2), TTL: time.Minute}
		}
	}
	p.Kill()
	for _, c := range []struct {
		name  string
		st    *Store
		limit float64
	}{{"killed server", s, 4 * 1024}, {"never connected", never, 40}} {
		name, st := c.name, c.st
		for range 3 {
			fill()
			st.Do(ctx, ops)
		}
		got := testing.AllocsPerRun(10, func() {
			fill()
			st.Do(ctx, ops)
		})
		if ops[0].Err == nil || ops[1].Err == nil {
			t.Fatalf("%s: got %v, %v; want errors", name, ops[0].Err, ops[1].Err)
		}
		t.Logf("%s: Do of 1024 failing ops: %.1f allocations", name, got)
		if got > c.limit {
			t.Errorf("%s: Do of 1024 failing ops: got %.1f allocations, want at most %v", name, got, c.limit)
		}
	}
}
