package window

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// A reservation's units are in the store: a sync decision of any edge
// refuses until they have conformed; the reservation acts exactly when
// the bucket has leaked room for it.
func TestReserveMovesTheSharedBucket(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	backend := store.NewMemStore(nil)
	a, err := New(Config{}, backend)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := New(Config{}, backend) // another edge over the same store
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	p := &Policy{Limit: 4, Window: time.Second, Burst: 2, Algorithm: policy.TokenBucket, Mode: policy.Sync}
	const key = 7
	// Burst 2: two at once, then one every 250 ms.
	for i, want := range []time.Duration{0, 0, 250 * time.Millisecond, 500 * time.Millisecond} {
		r, err := a.Reserve(context.Background(), now, p, key, p.Limit, 1, time.Second)
		if err != nil || !r.OK || r.At != now.Add(want).UnixNano() {
			t.Fatalf("reservation %d: %+v, %v; want at %v", i, r, err, want)
		}
	}
	if d := b.Decide(context.Background(), now.Add(500*time.Millisecond-1), p, key, p.Limit, 1); d.Allowed {
		t.Fatal("another edge admitted a request before the reserved units conformed")
	}
	if d := b.Decide(context.Background(), now.Add(750*time.Millisecond), p, key, p.Limit, 1); !d.Allowed {
		t.Fatalf("another edge refused the first unit after the reservations: %+v", d)
	}
}

// A delay as long as a Duration goes is bounded, not overflowed: the
// reservation is taken, at its exact instant.
func TestReserveBoundsAFarDelay(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l, err := New(Config{}, store.NewMemStore(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	key := uint64(0)
	for _, p := range []*Policy{
		{Limit: 1_000_000, Window: time.Second, Burst: 1_000_000, Algorithm: policy.TokenBucket, Mode: policy.Sync},
		{Limit: 1, Window: 24 * time.Hour, Burst: 1, Algorithm: policy.LeakyBucket},
		{Limit: 3, Window: time.Second, Burst: 2, Algorithm: policy.LeakyBucket, Action: policy.Delay},
	} {
		key++
		for i := range 3 {
			// A throttle's whole burst each time, far ahead; a queue's
			// three places (its burst waiting, one served).
			cost := p.Burst
			if p.Action == policy.Delay {
				cost = 1
			}
			r, err := l.Reserve(context.Background(), now, p, key, p.Limit, cost, time.Duration(math.MaxInt64))
			if err != nil || !r.OK {
				t.Fatalf("%v %v, reservation %d of the burst: %+v, %v", p.Algorithm, p.Action, i, r, err)
			}
			// A throttle's bursts a window apart (its burst is its limit).
			if want := now.Add(time.Duration(i) * p.Window).UnixNano(); p.Action == policy.Throttle && r.At != want {
				t.Fatalf("%v, reservation %d at %v, want %v", p.Algorithm, i, time.Duration(r.At-now.UnixNano()), time.Duration(i)*p.Window)
			}
		}
	}
}

// Only buckets of action throttle or delay hold reservations; only
// counters give units back.
func TestReserveAndGiveBackRefuseOtherAlgorithms(t *testing.T) {
	l, err := New(Config{}, store.NewMemStore(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	for _, p := range []*Policy{
		{Limit: 2, Window: time.Second},
		{Limit: 2, Window: time.Second, Algorithm: policy.FixedWindow},
		{Limit: 2, Window: time.Second, Algorithm: policy.SlidingLog},
		{Limit: 2, Window: time.Second, Algorithm: policy.TokenBucket, Action: policy.Block, Timeout: time.Second},
	} {
		if _, err := l.Reserve(ctx, time.Now(), p, 1, 2, 1, time.Second); !errors.Is(err, ErrNotReservable) {
			t.Errorf("Reserve(%v %v) = %v, want ErrNotReservable", p.Algorithm, p.Action, err)
		}
	}
	for _, a := range []policy.Algorithm{policy.TokenBucket, policy.LeakyBucket, policy.SlidingLog} {
		if err := l.GiveBack(ctx, &Policy{Limit: 2, Window: time.Second, Algorithm: a}, 1, 1, time.Now().UnixNano()); !errors.Is(err, ErrNotReservable) {
			t.Errorf("GiveBack(%v) = %v, want ErrNotReservable", a, err)
		}
	}
}

// An async counter's units given back before they were sent are taken
// out of this edge's own count: the flush sends none of them.
func TestGiveBackUnsentUnits(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	backend := store.NewMemStore(nil)
	l, err := New(Config{}, backend)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	p := &Policy{Limit: 10, Window: time.Minute}
	for range 3 {
		if d := l.Decide(context.Background(), now, p, 9, p.Limit, 1); !d.Allowed {
			t.Fatal("refused within the limit")
		}
	}
	if err := l.GiveBack(context.Background(), p, 9, 2, now.UnixNano()); err != nil {
		t.Fatal(err)
	}
	l.Flush(context.Background(), now.Add(time.Millisecond))
	ops := []store.Op{{Key: 9, Start: algo.WindowStart(now.UnixNano(), int64(time.Minute)) / 1e6}}
	backend.Do(context.Background(), ops)
	if ops[0].Value != 1 {
		t.Fatalf("the store counts %d after 3 admitted and 2 given back, want 1", ops[0].Value)
	}
}
