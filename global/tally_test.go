package global

import (
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
)

// BenchmarkTallySnapshot is one publish interval of an aggregator holding
// a flood of keys of a global rule, each with one unit (below the share
// that is published) and 64 keys that matter: the cost of a Snapshot with
// -global-max-keys keys counted.
func BenchmarkTallySnapshot(b *testing.B) {
	const keys = 1 << 18
	tally := NewTally(TallyConfig{MaxKeys: keys})
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC).UnixNano()
	evs := make([]event.Event, 0, keys)
	for i := range keys {
		cost := uint32(1)
		if i < 64 {
			cost = 50
		}
		evs = append(evs, event.Event{Time: t0 + int64(i), KeyHash: uint64(i) + 1, Cost: cost, Limit: 100,
			WindowMillis: 60_000, Global: true, Decision: event.Allowed, Pop: []byte("pop-a")})
	}
	tally.Add(evs...)
	var cs []Counts
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		cs = tally.Snapshot(cs[:0], t0+int64(time.Second)+int64(i)*int64(100*time.Millisecond))
	}
	if len(cs) != 64 {
		b.Fatalf("published %d keys, want the 64 over the share", len(cs))
	}
}

// TestTallySweep: a flood of keys below the share is never published, its
// keys leave once idle for two windows, a slice of the table at each
// interval, and each key's running total stays the sum of its slots.
func TestTallySweep(t *testing.T) {
	const keys, w = 5000, int64(time.Minute)
	tally := NewTally(TallyConfig{})
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range keys {
		tally.Add(event.Event{Time: t0 + int64(i)*int64(time.Millisecond), KeyHash: uint64(i) + 1, Cost: 1, Limit: 100,
			WindowMillis: 60_000, Global: true, Decision: event.Allowed, Pop: []byte("pop-a")})
	}
	tally.Add(event.Event{Time: t0 + w + 1, KeyHash: 1, Cost: 20, Limit: 100, WindowMillis: 60_000, Global: true,
		Decision: event.Allowed, Pop: []byte("pop-b")})
	check := func(when string) {
		t.Helper()
		tally.mu.Lock()
		defer tally.mu.Unlock()
		for h, k := range tally.keys {
			var sum uint64
			for _, c := range k.pops {
				for _, u := range c {
					sum += u
				}
			}
			if sum != k.total {
				t.Fatalf("%s: key %d: total %d, slots hold %d", when, h, k.total, sum)
			}
		}
	}
	check("after the adds")
	if cs := tally.Snapshot(nil, t0+w+2); len(cs) != 1 || cs[0].Key != 1 {
		t.Fatalf("published %+v, want key 1 alone (21 units of 100, over an eighth)", cs)
	}
	check("in the next window")
	// Two windows on, every key but 1 is idle: the sweep drops them within
	// ten intervals.
	for i := range 10 {
		tally.Snapshot(nil, t0+2*w+int64(i)*int64(100*time.Millisecond)+int64(time.Second))
	}
	check("two windows on")
	if n, _ := tally.Keys(); n != 1 {
		t.Errorf("%d keys left after ten sweeps, want 1 (the key counted in the window before)", n)
	}
	for i := range 10 {
		tally.Snapshot(nil, t0+3*w+int64(i)*int64(100*time.Millisecond)+int64(time.Second))
	}
	if n, _ := tally.Keys(); n != 0 {
		t.Errorf("%d keys left three windows on, want 0", n)
	}
}
