package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/store"
)

// heldAlone gives key, under pol, a window of units on l alone before
// the window starting at t0, so that l's replies show the key held by this
// edge (its share whole), as a balancer that hashes the client holds it.
func heldAlone(t *testing.T, l *Limiter, clock *simClock, pol *Policy, key uint64) {
	t.Helper()
	clock.t.Store(t0.Add(-pol.Window).UnixNano())
	for range 4 {
		l.Decide(context.Background(), clock.Now(), pol, key, pol.Limit, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(context.Background(), clock.Now())
	}
	clock.t.Store(t0.UnixNano())
}

// With MaxDefer, a key held by this edge and far below its limit sends
// its units at most every MaxDefer, one increment for many requests; the
// same key near its limit sends them at every flush; a deferred unit
// reaches the store by its due time, and Close sends what still waits. A
// key dealt over several edges sends them at every flush.
func TestDeferredSends(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		maxDefer time.Duration
		limit    uint64
		// the increments of 100 requests, one every 10 ms, flushed every 5 ms
		minIncrs, maxIncrs int64
	}{
		{"off", -1, 1000, 100, 100},
		{"far from the limit", 100 * time.Millisecond, 1000, 9, 12},
		// Sent when this edge's unsent units could fill the room left:
		// ever more often as it shrinks, at once for the last ones.
		{"near the limit", 100 * time.Millisecond, 107, 12, 40},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := newSimClock(t0)
			backend := &countingStore{Store: store.NewMemStore(clock)}
			l := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, MaxDefer: tt.maxDefer})
			pol := &Policy{Limit: tt.limit, Window: time.Minute}
			key := uint64(7)
			heldAlone(t, l, clock, pol, key)
			// Past the grace in which a window's previous count is read
			// again at every flush.
			clock.Add(time.Second)
			// The key's first replies: a count, then this edge's share.
			for range 3 {
				l.Decide(ctx, clock.Now(), pol, key, tt.limit, 1)
				clock.Add(5 * time.Millisecond)
				l.Flush(ctx, clock.Now())
			}
			base := backend.incrs.Load()
			for k := range 100 {
				if !l.Decide(ctx, clock.Now(), pol, key, tt.limit, 1).Allowed {
					t.Fatal("refused within the limit")
				}
				if k == 99 && tt.limit == 107 { // no room left (the window before weighs 3.9): the unit goes at the next flush
					before := backend.incrs.Load()
					clock.Add(5 * time.Millisecond)
					l.Flush(ctx, clock.Now())
					if backend.incrs.Load() == before {
						t.Error("the last unit before the limit waited")
					}
					clock.Add(5 * time.Millisecond)
					l.Flush(ctx, clock.Now())
					continue
				}
				for range 2 {
					clock.Add(5 * time.Millisecond)
					l.Flush(ctx, clock.Now())
				}
			}
			if n := backend.incrs.Load() - base; n < tt.minIncrs || n > tt.maxIncrs {
				t.Errorf("%d increments for 100 requests, want %d to %d", n, tt.minIncrs, tt.maxIncrs)
			}
			// Nothing waits longer than MaxDefer: the store holds every unit
			// once that long has passed.
			clock.Add(max(tt.maxDefer, 0) + 5*time.Millisecond)
			l.Flush(ctx, clock.Now())
			ops := []store.Op{{Key: key, Start: algo.WindowStart(clock.Now().UnixNano(), int64(time.Minute)) / 1e6}}
			backend.Do(ctx, ops)
			if ops[0].Value != 103 {
				t.Errorf("the store counts %d after MaxDefer, want 103", ops[0].Value)
			}
		})
	}
}

// A key whose requests are dealt over two edges sends its units at every
// flush, by default as with MaxDefer set: the other edge decides on the
// store's count, and units kept back would be missing from it. The same
// requests held by one edge take a few increments.
func TestDealtKeysSendAtEveryFlush(t *testing.T) {
	ctx := context.Background()
	for _, dealt := range []bool{true, false} {
		clock := newSimClock(t0)
		backend := &countingStore{Store: store.NewMemStore(clock)}
		a := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond})
		b := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond})
		pol := &Policy{Limit: 1000, Window: 10 * time.Second}
		const key = 5
		// Two windows of the same spread, so that the replies say it,
		// then past the grace: 40 requests, one every 10 ms.
		var incrs int64
		for w := range 3 {
			clock.t.Store(t0.Add(time.Duration(w)*pol.Window + time.Second).UnixNano())
			incrs = backend.incrs.Load()
			for k := range 40 {
				e := a
				if dealt && k%2 == 1 {
					e = b
				}
				if !e.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1).Allowed {
					t.Fatal("refused within the limit")
				}
				for range 2 {
					clock.Add(5 * time.Millisecond)
					a.Flush(ctx, clock.Now())
					b.Flush(ctx, clock.Now())
				}
			}
		}
		n := backend.incrs.Load() - incrs
		if dealt && n < 40 || !dealt && n > 4 {
			t.Errorf("dealt %v: %d increments for the third window's 40 requests, want 40 dealt, at most 4 held", dealt, n)
		}
	}
}

// In a key's first window here, its units start waiting once the store's
// count has been this edge's units alone, four or more, for a sixteenth of
// the window: held by this edge. Before that, and with another edge's
// unit in the count, they go at every flush.
func TestAKeyIsHeldOnceItsCountIsThisEdgesAlone(t *testing.T) {
	ctx := context.Background()
	for _, other := range []bool{false, true} {
		clock := newSimClock(t0.Add(time.Second))
		backend := &countingStore{Store: store.NewMemStore(clock)}
		a := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond})
		b := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond})
		pol := &Policy{Limit: 1000, Window: 10 * time.Second}
		const key = 6
		if other {
			b.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1)
			b.Flush(ctx, clock.Now())
		}
		decide := func(n int) int64 {
			before := backend.incrs.Load()
			for range n {
				a.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1)
				for range 2 {
					clock.Add(5 * time.Millisecond)
					a.Flush(ctx, clock.Now())
				}
			}
			return backend.incrs.Load() - before
		}
		if n := decide(20); n != 20 {
			t.Errorf("another edge's unit in the count %v: %d increments for the first 20 requests (200 ms), want 20", other, n)
		}
		clock.Add(500 * time.Millisecond) // a sixteenth of the window since the first
		decide(1)
		if n := decide(20); other && n != 20 || !other && n > 2 {
			t.Errorf("another edge's unit in the count %v: %d increments for 20 requests after 700 ms, want 20 with it, at most 2 without", other, n)
		}
	}
}

// A deferred unit waits at most until its window ends: the flush at the
// window's end sends it, so that the other edges' reads of the ended window
// (once its grace is over) count it. Waiting its whole MaxDefer, it would
// land after those reads, and the other edges would miss it for the whole
// of the next window.
func TestDeferredUnitsGoByTheirWindowsEnd(t *testing.T) {
	ctx := context.Background()
	clock := newSimClock(t0) // t0 starts a 10 s window
	backend := store.NewMemStore(clock)
	l := newTestLimiter(t, clock, backend, Config{FlushInterval: 5 * time.Millisecond, MaxDefer: 500 * time.Millisecond})
	pol := &Policy{Limit: 1000, Window: 10 * time.Second}
	const key = 9
	heldAlone(t, l, clock, pol, key)
	// The key's replies in this window, and past the grace, its previous
	// window's read.
	for range 3 {
		l.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1)
		clock.Add(200 * time.Millisecond)
		l.Flush(ctx, clock.Now())
	}
	clock.Add(time.Second) // the third unit's wait is over
	l.Flush(ctx, clock.Now())
	clock.t.Store(t0.Add(9800 * time.Millisecond).UnixNano())
	for range 10 {
		l.Decide(ctx, clock.Now(), pol, key, pol.Limit, 1)
	}
	count := func() uint64 {
		ops := []store.Op{{Key: key, Start: t0.UnixNano() / 1e6}}
		backend.Do(ctx, ops)
		return ops[0].Value
	}
	clock.Add(100 * time.Millisecond)
	l.Flush(ctx, clock.Now())
	if n := count(); n != 3 {
		t.Fatalf("the store counts %d 100 ms after the units, want 3: the 10 far below the limit wait", n)
	}
	clock.t.Store(t0.Add(10 * time.Second).UnixNano())
	l.Flush(ctx, clock.Now())
	if n := count(); n != 13 {
		t.Errorf("the store counts %d of the window at its end, want 13: its deferred units sent by then", n)
	}
}

// A last flush sends the units that wait.
func TestCloseSendsDeferredUnits(t *testing.T) {
	ctx := context.Background()
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	l, err := New(Config{FlushInterval: 5 * time.Millisecond, MaxDefer: time.Second, Clock: clock}, backend)
	if err != nil {
		t.Fatal(err)
	}
	pol := &Policy{Limit: 1000, Window: time.Minute}
	for range 3 {
		l.Decide(ctx, clock.Now(), pol, 9, 1000, 1)
		clock.Add(5 * time.Millisecond)
		l.Flush(ctx, clock.Now())
	}
	for range 10 {
		l.Decide(ctx, clock.Now(), pol, 9, 1000, 1)
	}
	l.Flush(ctx, clock.Now())
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ops := []store.Op{{Key: 9, Start: algo.WindowStart(clock.Now().UnixNano(), int64(time.Minute)) / 1e6}}
	backend.Do(ctx, ops)
	if ops[0].Value != 13 {
		t.Errorf("the store counts %d after Close, want 13", ops[0].Value)
	}
}

// An edge counts the units the other edges have admitted since its last
// reply at the rate its replies showed them, rounded up and one at least,
// for at most an eighth of a window; a reply showing them silent brings
// the guess down.
func TestOthersUnseen(t *testing.T) {
	w := int64(10 * time.Second)
	e := entry{start: 0, win: w, share: 128}
	// Replies at 1 s and 2 s: the others added 30 units in that second
	// (300 a window), this edge 30.
	e.reply = uint16(e.off(int64(time.Second))) + 1
	e.curr = 60
	e.noteRate(int64(2*time.Second), 30, 120)
	e.curr, e.reply = 120, uint16(e.off(int64(2*time.Second)))+1
	if e.orate != 150 { // the first sample, averaged with nothing known
		t.Fatalf("orate = %d, want 150", e.orate)
	}
	for _, tt := range []struct {
		at   time.Duration
		want uint64
	}{
		{2 * time.Second, 1},                      // one at least: theirs may be on its way
		{2*time.Second + 100*time.Millisecond, 2}, // 1.5, up
		{2*time.Second + 400*time.Millisecond, 7}, // 6, and the reply's instant to its resolution, up
		{5 * time.Second, 19},                     // an eighth of a window at most: 18.75, up
	} {
		if got := e.othersUnseen(int64(tt.at)); got != tt.want {
			t.Errorf("at %v: %d unseen, want %d", tt.at, got, tt.want)
		}
	}
	// A read at 3 s shows the others silent: the rate halves.
	e.noteRate(int64(3*time.Second), 0, 120)
	if e.orate != 75 {
		t.Errorf("after a silent second: orate %d, want 75", e.orate)
	}
}
