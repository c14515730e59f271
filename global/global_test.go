package global

import (
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
)

const sec = int64(time.Second)

func ev(pop string, at int64, cost uint32, d event.Admission) event.Event {
	return event.Event{Time: at, KeyHash: 7, Rule: []byte("g"), Cost: cost, Limit: 100, WindowMillis: 10_000,
		Decision: d, Global: true, Pop: []byte(pop)}
}

// The tally counts per PoP what each counted (admitted units of a
// throttle), rolls windows, publishes only keys that matter, and the
// edges' table adds up the other PoPs' units as a sliding window does.
func TestTallyToTable(t *testing.T) {
	t0 := 1_800_000_000 * sec // a multiple of 10 s
	tally := NewTally(TallyConfig{})
	// 5 units: below 1/8 of 100, not published.
	for i := range 5 {
		tally.Add(ev("fra1", t0+int64(i)*sec/10, 1, event.Allowed))
	}
	if cs := tally.Snapshot(nil, t0+sec); len(cs) != 0 {
		t.Fatalf("5 units of 100: published %+v, want nothing", cs)
	}
	tally.Add(ev("fra1", t0+2*sec, 20, event.Allowed), ev("ams2", t0+3*sec, 30, event.Allowed),
		ev("ams2", t0+3*sec, 50, event.Limited), // refused: not counted
		ev("ams2", t0+4*sec, 10, event.Allowed)) // still window t0
	tally.Add(event.Event{Time: t0, KeyHash: 8, Cost: 90, Limit: 100, WindowMillis: 10_000, Pop: []byte("x")}) // scope pop: not counted
	cs := tally.Snapshot(nil, t0+12*sec)                                                                       // in the next window: t0's counts are prev
	if len(cs) != 1 {
		t.Fatalf("snapshot: got %+v, want key 7 alone", cs)
	}
	c := cs[0]
	// The window t0 is the previous one now, slots 0-15 of 625 ms: fra1's
	// 5 units at 0-0.4 s in slot 0 and 20 at 2 s in slot 3; ams2's 30 at
	// 3 s in slot 4 and 10 at 4 s in slot 6.
	want := []PopCount{{Pop: "ams2"}, {Pop: "fra1"}}
	want[0].Units[4], want[0].Units[6] = 30, 10
	want[1].Units[0], want[1].Units[3] = 5, 20
	if c.Key != 7 || c.Start != (t0+10*sec)/1e6 || c.WindowMs != 10_000 || len(c.Pops) != 2 || c.Pops[0] != want[0] || c.Pops[1] != want[1] {
		t.Fatalf("snapshot: got %+v, want key 7 from %d: %+v", c, (t0+10*sec)/1e6, want)
	}
	now := t0 + 12*sec
	hdr := Header{Publisher: "agg", Instance: 1, Stamp: now}
	var m decoded
	if err := decode(AppendCounts(nil, &hdr, &c), &m); err != nil || m.kind != kindCounts || m.h != hdr || m.c.Key != 7 || len(m.c.Pops) != 2 || m.c.Pops[1] != want[1] {
		t.Fatalf("round trip: got %+v, %v", m, err)
	}

	tb := NewTable(TableConfig{Pop: "fra1", Stale: 2 * time.Second})
	if _, fresh := tb.Others(7, now, 10*sec); fresh {
		t.Error("fresh before any heartbeat")
	}
	beat(t, tb, hdr, now-sec/10)
	if _, fresh := tb.Others(7, now, 10*sec); fresh {
		t.Error("fresh after one heartbeat: a whole publish is not read yet")
	}
	if d := tb.take(&m, now); d != Kept {
		t.Fatalf("counts: dropped (%v)", d)
	}
	beat(t, tb, hdr, now)
	// At t0+12 s the trailing window is (t0+2 s, t0+12 s]: both of ams2's
	// slots (3-3.6 s and 4-4.4 s) are in it, 40 units. (Weighing the window's
	// 40 as if even would say 32.)
	if got, fresh := tb.Others(7, now, 10*sec); got != 40 || !fresh {
		t.Errorf("others at +12 s: got %d, %v, want 40, fresh", got, fresh)
	}
	// At t0+13.9 s, slot 4 (2.5-3.125 s) is out and slot 6 (3.75-4.375 s)
	// is cut: 10 × (4.375 - 3.9) / 0.625 = 7.6, so 8.
	if got, _ := tb.Others(7, t0+13_900*sec/1000, 10*sec); got != 8 {
		t.Errorf("others at +13.9 s: got %d, want 8", got)
	}
	if got, _ := tb.Others(7, now, 60*sec); got != 0 {
		t.Errorf("another window length: got %d, want 0", got)
	}
	if got, _ := tb.Others(9, now, 10*sec); got != 0 {
		t.Errorf("a key not sent: got %d, want 0", got)
	}
	if _, fresh := tb.Others(7, now+3*sec, 10*sec); fresh {
		t.Error("fresh 3 s after the last heartbeat (stale 2 s)")
	}
	if got, _ := tb.Others(7, t0+31*sec, 10*sec); got != 0 {
		t.Errorf("two windows on: got %d, want 0", got)
	}
	// Two windows without units: dropped from the tally.
	if cs := tally.Snapshot(nil, t0+31*sec); len(cs) != 0 {
		t.Errorf("two windows idle: got %+v, want nothing", cs)
	}
	if n, _ := tally.Keys(); n != 0 {
		t.Errorf("keys after two idle windows: got %d, want 0", n)
	}
}

func TestDecodeRefusesGarbage(t *testing.T) {
	c := Counts{Key: 1, Start: 2, WindowMs: 3, Pops: []PopCount{{Pop: "a", Units: [2 * Slots]uint64{1, 2}}}}
	b := AppendCounts(nil, &Header{Publisher: "p", Instance: 1, Stamp: 2}, &c)
	var m decoded
	for i := range len(b) {
		if err := decode(b[:i], &m); err == nil {
			t.Errorf("decode of %d of %d bytes: got nil, want an error", i, len(b))
		}
	}
	if err := decode(append(b, 0), &m); err == nil {
		t.Error("decode with a trailing byte: got nil")
	}
	h := Header{Publisher: "p", Instance: 9, Stamp: 5}
	if err := decode(AppendHeartbeat(nil, &h, 100*time.Millisecond), &m); err != nil || m.kind != kindHeartbeat || m.h != h || m.interval != int64(100*time.Millisecond) {
		t.Errorf("heartbeat: got %+v, %v", m, err)
	}
	if err := decode(AppendFarewell(nil, &h), &m); err != nil || m.kind != kindFarewell || m.h != h {
		t.Errorf("farewell: got %+v, %v", m, err)
	}
}

// beat gives tb a heartbeat of h's publisher stamped (and arrived) at.
func beat(t *testing.T, tb *Table, h Header, at int64) {
	t.Helper()
	h.Stamp = at
	var m decoded
	if err := decode(AppendHeartbeat(nil, &h, 100*time.Millisecond), &m); err != nil {
		t.Fatal(err)
	}
	if d := tb.take(&m, at); d != Kept {
		t.Fatalf("heartbeat at %d: dropped (%v)", at, d)
	}
}

func TestTableOthersAllocates0(t *testing.T) {
	tb := NewTable(TableConfig{Pop: "a"})
	tb.apply(&Counts{Key: 3, Start: 0, WindowMs: 1000, Pops: []PopCount{{Pop: "b", Units: [2 * Slots]uint64{1, 2}}}}, 0)
	if n := testing.AllocsPerRun(100, func() { tb.Others(3, 500*int64(time.Millisecond), sec) }); n != 0 {
		t.Errorf("Others: %v allocations, want 0", n)
	}
}
