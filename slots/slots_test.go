package slots_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

type simClock struct{ t atomic.Int64 }

func newSimClock(t time.Time) *simClock { c := &simClock{}; c.t.Store(t.UnixNano()); return c }
func (c *simClock) Now() time.Time      { return time.Unix(0, c.t.Load()) }
func (c *simClock) Add(d time.Duration) { c.t.Add(int64(d)) }

// countingStore counts the decrements it is sent and fails every op while
// fail is set.
type countingStore struct {
	store.Store
	decrs atomic.Int64
	fail  atomic.Bool
}

func (s *countingStore) Do(ctx context.Context, ops []store.Op) {
	for i := range ops {
		if ops[i].Delta < 0 {
			s.decrs.Add(1)
		}
	}
	if s.fail.Load() {
		for i := range ops {
			ops[i].Value, ops[i].Err = 0, errors.New("store down")
		}
		return
	}
	s.Store.Do(ctx, ops)
}

// acquirer returns a function that takes one fail-open slot of key from
// an edge's Slots at clock's now.
func acquirer(clock *simClock, lease time.Duration, key, limit uint64) func(*slots.Slots) bool {
	return func(s *slots.Slots) bool {
		ok, _ := s.Acquire(context.Background(), clock.Now(), lease, policy.FailOpen, key, limit)
		return ok
	}
}

func TestSlotsLimitInFlightAcrossEdges(t *testing.T) {
	clock := newSimClock(t0.Add(9 * time.Second))
	st := store.NewMemStore(clock)
	const lease, limit = 10 * time.Second, 3 // a concurrency rule of 3 slots leased for 10s
	a, b := slots.New(slots.Config{}, st), slots.New(slots.Config{}, st)
	key := uint64(0x9e3779b97f4a7c15)
	ctx := context.Background()
	acq := acquirer(clock, lease, key, limit)
	if !acq(a) || !acq(b) || !acq(a) {
		t.Fatal("the first 3 slots were refused")
	}
	if acq(b) {
		t.Fatal("a 4th slot was granted with 3 in flight")
	}
	b.Release(key) // a: 2, b: 0
	if !acq(a) {
		t.Fatal("after a release, a slot was refused")
	}
	if acq(b) {
		t.Fatal("a 4th slot was granted with 3 in flight")
	}
	a.Release(key) // a: 2
	if !acq(b) {   // b: 1
		t.Fatal("after a release, a slot was refused")
	}
	b.Release(12345) // a key b never held: no effect
	if acq(a) {
		t.Fatal("releasing an unheld key freed a slot")
	}
	// Into the next epoch: the carries keep the count; before they land,
	// the grace counts the previous epoch.
	clock.Add(1050 * time.Millisecond) // 50 ms into the next epoch
	if acq(a) {
		t.Fatal("an epoch change opened the gates during the grace")
	}
	clock.Add(500 * time.Millisecond)
	a.Renew(ctx, clock.Now())
	b.Renew(ctx, clock.Now())
	if acq(a) {
		t.Fatal("a 4th slot after the carries")
	}
	if got := a.Held(key) + b.Held(key); got != 3 {
		t.Errorf("slots held = %d, want 3", got)
	}
	// b dies holding its slot: it never renews, and within two leases its
	// slot is gone while a's carried ones stay.
	clock.Add(10 * time.Second)
	a.Renew(ctx, clock.Now())
	clock.Add(time.Second)
	if !acq(a) {
		t.Fatal("a dead edge's slot outlived its lease")
	}
	if acq(a) {
		t.Fatal("more than the limit after the dead edge's slot expired")
	}
}

// A slot carried into a new epoch and then released no longer counts
// in the grace: the previous epoch's counter, which Acquire reads until the
// carries have landed, gives it back too. (Before, two slots taken just
// before an epoch ended, carried and released, refused the next request
// for the rest of the grace.) Slots not carried still count there.
func TestSlotsCarriedAndReleasedFreeTheGrace(t *testing.T) {
	clock := newSimClock(t0.Add(9900 * time.Millisecond)) // 100 ms before an epoch of 10 s ends
	st := store.NewMemStore(clock)
	const lease, limit = 10 * time.Second, 2
	a, b := slots.New(slots.Config{}, st), slots.New(slots.Config{}, st)
	key := uint64(0x9e3779b97f4a7c15)
	ctx := context.Background()
	acq := acquirer(clock, lease, key, limit)
	if !acq(a) || !acq(a) {
		t.Fatal("the first 2 slots were refused")
	}
	clock.Add(150 * time.Millisecond) // 50 ms into the next epoch: in the grace
	if n := a.Renew(ctx, clock.Now()); n != 1 {
		t.Fatalf("Renew carried %d keys, want 1", n)
	}
	a.Release(key)
	a.Release(key)
	clock.Add(50 * time.Millisecond) // still in the grace (renew interval + store timeout: 200 ms)
	if !acq(b) {
		t.Fatal("after both carried slots were released, a slot was refused in the grace")
	}
	if !acq(b) {
		t.Fatal("after both carried slots were released, a second slot was refused in the grace")
	}
	if acq(a) {
		t.Fatal("a 3rd slot was granted with 2 in flight")
	}

	// b's two slots, taken in this epoch, are carried into the next one
	// by a renew that lands; one is released. In the grace, the one still
	// held counts once: a second slot is granted, a third is not.
	clock.Add(10 * time.Second) // 100 ms into the epoch after
	b.Renew(ctx, clock.Now())
	b.Release(key)
	if !acq(a) {
		t.Fatal("with 1 slot held after a carry and a release, a slot was refused in the grace")
	}
	if acq(a) {
		t.Fatal("a 3rd slot was granted in the grace with 2 in flight")
	}
}

func TestSlotsFailurePolicy(t *testing.T) {
	clock := newSimClock(t0)
	st := &countingStore{Store: store.NewMemStore(clock)}
	s := slots.New(slots.Config{}, st)
	st.fail.Store(true)
	const lease = 30 * time.Second
	for _, tc := range []struct {
		fail policy.Fail
		ok   bool
		want store.Fallback
	}{{policy.FailOpen, true, store.FallbackOpen}, {policy.FailClosed, false, store.FallbackClosed}} {
		ok, fb := s.Acquire(context.Background(), clock.Now(), lease, tc.fail, 1, 1)
		if ok != tc.ok || fb != tc.want {
			t.Errorf("fail %v with the store down: %v %v, want %v %v", tc.fail, ok, fb, tc.ok, tc.want)
		}
	}
	s.Release(1)
	if st.decrs.Load() != 0 {
		t.Error("released a fail-open slot into the store, where it was never counted")
	}
}
