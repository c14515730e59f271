package window

import (
	"context"
	"testing"
	"time"
)

func TestSlotsLimitInFlightAcrossEdges(t *testing.T) {
	clock := newSimClock(t0.Add(9 * time.Second))
	store := NewMemStore(clock)
	r := mustRules(t, "rules: [{name: conc, kind: concurrency, limit: 3, lease: 10s}]").Rules[0]
	a, b := NewSlots(SlotsConfig{}, store), NewSlots(SlotsConfig{}, store)
	key := r.Hash([]byte("client"))
	ctx := context.Background()
	acq := func(s *Slots) bool { ok, _ := s.Acquire(ctx, clock.Now(), &r.Policy, key, r.Limit); return ok }
	if !acq(a) || !acq(b) || !acq(a) {
		t.Fatal("the first 3 slots were refused")
	}
	if acq(b) {
		t.Fatal("a 4th slot was granted with 3 in flight")
	}
	b.Release(&r.Policy, key) // a: 2, b: 0
	if !acq(a) {
		t.Fatal("after a release, a slot was refused")
	}
	if acq(b) {
		t.Fatal("a 4th slot was granted with 3 in flight")
	}
	a.Release(&r.Policy, key) // a: 2
	if !acq(b) {              // b: 1
		t.Fatal("after a release, a slot was refused")
	}
	b.Release(&r.Policy, 12345) // a key b never held: no effect
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

func TestSlotsFailurePolicy(t *testing.T) {
	clock := newSimClock(t0)
	store := &countingStore{Store: NewMemStore(clock)}
	rs := mustRules(t, `
rules:
  - {name: open, kind: concurrency, limit: 1}
  - {name: closed, kind: concurrency, limit: 1, fail: closed}
`)
	s := NewSlots(SlotsConfig{}, store)
	store.fail.Store(true)
	for _, tc := range []struct {
		r    *testRule
		ok   bool
		want Fallback
	}{{rs.Rules[0], true, FallbackOpen}, {rs.Rules[1], false, FallbackClosed}} {
		ok, fb := s.Acquire(context.Background(), clock.Now(), &tc.r.Policy, 1, tc.r.Limit)
		if ok != tc.ok || fb != tc.want {
			t.Errorf("%s with the store down: %v %v, want %v %v", tc.r.Name, ok, fb, tc.ok, tc.want)
		}
	}
	s.Release(&rs.Rules[0].Policy, 1)
	if store.decrs.Load() != 0 {
		t.Error("released a fail-open slot into the store, where it was never counted")
	}
}
