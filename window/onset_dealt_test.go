package window

import (
	"context"
	"testing"
	"time"
)

// viewOf is key's view on l: its previous and current windows' counts.
func viewOf(l *Limiter, key uint64) (prev, curr uint64) {
	s := l.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.lookup(key); e != nil {
		return e.view()
	}
	return 0, 0
}

// A client dealt over two edges that begins late in a window: edge A
// counts its first two units and ends the window with replies that showed
// no other edge's, so it takes the window's count to be its own and does
// not read it; edge B's four units land after A's last reply. Once a reply
// in the next window shows B's units on the key, A reads the window that
// ended again: its view then holds all six (with two it admitted the client
// past its limit near the end of the next window).
func TestAnEdgeThatHeldAClientAloneReadsItAgainWhenOthersShow(t *testing.T) {
	w := 10 * time.Second
	clock := newSimClock(t0)
	store := NewMemStore(clock)
	a := newTestLimiter(t, clock, store, Config{})
	b := newTestLimiter(t, clock, store, Config{})
	pol := &Policy{Limit: 100, Window: w}
	const key = uint64(0x0e5e7)
	ctx := context.Background()
	ws := t0.Truncate(w).UnixNano()
	at := func(l *Limiter, ms int64) {
		tt := ws + ms*int64(time.Millisecond)
		clock.t.Store(tt)
		if !l.Decide(ctx, time.Unix(0, tt), pol, key, pol.Limit, 1).Allowed {
			t.Fatalf("refused at %d ms, far below the limit", ms)
		}
		l.Flush(ctx, time.Unix(0, tt))
	}
	flush := func(l *Limiter, ms int64) {
		tt := ws + ms*int64(time.Millisecond)
		clock.t.Store(tt)
		l.Flush(ctx, time.Unix(0, tt))
	}
	at(a, 9700)
	at(a, 9750)
	for _, ms := range []int64{9800, 9850, 9900, 9950} {
		at(b, ms)
	}
	at(a, 10500) // the next window: A's view of the one that ended is its own two
	if p, _ := viewOf(a, key); p != 2 {
		t.Fatalf("A's view of the window that ended: %d units, want its own 2 (the test's premise)", p)
	}
	at(b, 10600)
	// A held the key alone: its units wait up to a sixteenth of the
	// window (625 ms), and go with its next flush after that.
	at(a, 11200) // the reply shows B's unit of this window
	flush(a, 11300)
	if p, _ := viewOf(a, key); p != 6 {
		t.Errorf("A's view of the window that ended, after a reply showed the other edge's units: %d, want the store's 6", p)
	}
}

// An edge that saw nothing of a key's previous window (new here, the
// client was on another edge) places that window's units by the key's
// rate here, back from the window's end: a client that began 0.3 s before
// the boundary has its six units there, all still in the trailing window
// until 9.7 s into the next one. Spread over the whole window, they weighed
// less than one unit by 8.5 s, and the client was admitted past its limit.
func TestAnEdgeNewToAKeyPlacesItsPreviousWindowByItsRate(t *testing.T) {
	w := 10 * time.Second
	clock := newSimClock(t0)
	store := NewMemStore(clock)
	a := newTestLimiter(t, clock, store, Config{})
	b := newTestLimiter(t, clock, store, Config{})
	pol := &Policy{Limit: 100, Window: w}
	const key = uint64(0x0e5e8)
	ctx := context.Background()
	ws := t0.Truncate(w).UnixNano()
	decide := func(l *Limiter, tt int64) Decision {
		clock.t.Store(tt)
		d := l.Decide(ctx, time.Unix(0, tt), pol, key, pol.Limit, 1)
		l.Flush(ctx, time.Unix(0, tt))
		return d
	}
	for k := range 6 { // 9.70 to 9.95 s, on B
		decide(b, ws+int64(9700+50*k)*int64(time.Millisecond))
	}
	// A, at 10 a second from the boundary on: 85 units by 8.5 s.
	var d Decision
	for k := range 86 {
		d = decide(a, ws+int64(w)+int64(k)*int64(100*time.Millisecond))
	}
	_, curr := viewOf(a, key)
	prev := d.Estimate - float64(curr-1) // the decision's estimate, less the current window's count before it
	t.Logf("at 8.5 s: estimate %.2f, current window %d before the request: the previous window weighs %.2f of 6", d.Estimate, curr-1, prev)
	if prev < 5.5 {
		t.Errorf("at 8.5 s the previous window's 6 units (all after 9.7 s of it) weigh %.2f in the estimate, want 6 (all still in the trailing window)", prev)
	}
}

// A client that moves from one edge to another at its rate keeps its
// previous window spread over the whole of it on the new edge: it had as
// many units there as it has here, and placing them by its rate would not
// move them (nor, for one that slowed, weigh them more).
func TestAClientThatMovedKeepsItsPreviousWindowSpread(t *testing.T) {
	w := 10 * time.Second
	clock := newSimClock(t0)
	store := NewMemStore(clock)
	a := newTestLimiter(t, clock, store, Config{})
	b := newTestLimiter(t, clock, store, Config{})
	pol := &Policy{Limit: 100, Window: w}
	const key = uint64(0x0e5e9)
	ctx := context.Background()
	ws := t0.Truncate(w).UnixNano()
	decide := func(l *Limiter, tt int64) Decision {
		clock.t.Store(tt)
		d := l.Decide(ctx, time.Unix(0, tt), pol, key, pol.Limit, 1)
		l.Flush(ctx, time.Unix(0, tt))
		return d
	}
	for k := range 50 { // 5 a second through the window, on B
		decide(b, ws+int64(k)*int64(200*time.Millisecond))
	}
	var d Decision
	for k := range 41 { // then on A: 40 units by 8 s
		d = decide(a, ws+int64(w)+int64(k)*int64(200*time.Millisecond))
	}
	_, curr := viewOf(a, key)
	prev := d.Estimate - float64(curr-1)
	t.Logf("at 8 s: estimate %.2f, the previous window's 50 weigh %.2f", d.Estimate, prev)
	if prev < 9.5 || prev > 10.5 {
		t.Errorf("at 8 s the previous window's 50 units, spread over it, weigh %.2f, want 10 (a fifth of it still in the trailing window)", prev)
	}
}
