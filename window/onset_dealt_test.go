package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
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

// dealtPair is two edges on one store in simulated time, deciding one key
// under a limit of 100 per 10 s; ms offsets count from a window's start.
type dealtPair struct {
	a, b  *Limiter
	clock *simClock
	pol   *Policy
	key   uint64
	ws    int64
}

func newDealtPair(t *testing.T, key uint64) *dealtPair {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	w := 10 * time.Second
	return &dealtPair{
		a: newTestLimiter(t, clock, backend, Config{}), b: newTestLimiter(t, clock, backend, Config{}),
		clock: clock, pol: &Policy{Limit: 100, Window: w}, key: key, ws: t0.Truncate(w).UnixNano(),
	}
}

// decide has l decide one request of the key ms after the window's start
// and flush, as the flusher would then.
func (p *dealtPair) decide(l *Limiter, ms int64) Answer {
	tt := p.ws + ms*int64(time.Millisecond)
	p.clock.t.Store(tt)
	d := l.Decide(context.Background(), time.Unix(0, tt), p.pol, p.key, p.pol.Limit, 1)
	l.Flush(context.Background(), time.Unix(0, tt))
	return d
}

// prevWeight is what the key's previous window weighed in d, decided by
// l: d's estimate less the current window's count before it.
func (p *dealtPair) prevWeight(l *Limiter, d Answer) float64 {
	_, curr := viewOf(l, p.key)
	return d.Estimate - float64(curr-1)
}

// A client dealt over two edges that begins late in a window: edge A
// counts its first two units and ends the window with replies that showed
// no other edge's, so it takes the window's count to be its own and does
// not read it; edge B's four units land after A's last reply. Once a reply
// in the next window shows B's units on the key, A reads the window that
// ended again: its view then holds all six (with two it admitted the client
// past its limit near the end of the next window).
func TestAnEdgeThatHeldAClientAloneReadsItAgainWhenOthersShow(t *testing.T) {
	p := newDealtPair(t, 0x0e5e7)
	for _, s := range []struct {
		l  *Limiter
		ms int64
	}{{p.a, 9700}, {p.a, 9750}, {p.b, 9800}, {p.b, 9850}, {p.b, 9900}, {p.b, 9950}, {p.a, 10500}} {
		if !p.decide(s.l, s.ms).Allowed {
			t.Fatalf("refused at %d ms, far below the limit", s.ms)
		}
	}
	if prev, _ := viewOf(p.a, p.key); prev != 2 {
		t.Fatalf("A's view of the window that ended: %d units, want its own 2 (the test's premise)", prev)
	}
	p.decide(p.b, 10600)
	// A held the key alone: its units wait up to a sixteenth of the
	// window (625 ms), and go with its next flush after that.
	p.decide(p.a, 11200) // the reply shows B's unit of this window
	p.clock.t.Store(p.ws + int64(11300*time.Millisecond))
	p.a.Flush(context.Background(), p.clock.Now())
	if prev, _ := viewOf(p.a, p.key); prev != 6 {
		t.Errorf("A's view of the window that ended, after a reply showed the other edge's units: %d, want the store's 6", prev)
	}
}

// An edge that saw nothing of a key's previous window (new here, the
// client was on another edge) places that window's units by the key's
// rate here, back from the window's end: a client that began 0.3 s before
// the boundary has its six units there, all still in the trailing window
// until 9.7 s into the next one. Spread over the whole window, they weighed
// less than one unit by 8.5 s, and the client was admitted past its limit.
func TestAnEdgeNewToAKeyPlacesItsPreviousWindowByItsRate(t *testing.T) {
	p := newDealtPair(t, 0x0e5e8)
	for k := range int64(6) { // 9.70 to 9.95 s, on B
		p.decide(p.b, 9700+50*k)
	}
	var d Answer
	for k := range int64(86) { // then A, at 10 a second: 85 units by 8.5 s
		d = p.decide(p.a, 10000+100*k)
	}
	prev := p.prevWeight(p.a, d)
	t.Logf("at 8.5 s: estimate %.2f: the previous window weighs %.2f of 6", d.Estimate, prev)
	if prev < 5.5 {
		t.Errorf("at 8.5 s the previous window's 6 units (all after 9.7 s of it) weigh %.2f in the estimate, want 6 (all still in the trailing window)", prev)
	}
}

// A client that moves from one edge to another keeps its previous window
// spread over the whole of it on the new edge, though it comes there with
// a burst: its rate over its first units here (8 in 0.4 s) would place the
// 50 units it had there in the window's last 2.5 s, and have them weigh in
// full until 7.5 s into this one. The rate is taken only once the current
// window holds as many units as the previous one.
func TestAClientThatMovedKeepsItsPreviousWindowSpread(t *testing.T) {
	p := newDealtPair(t, 0x0e5e9)
	for k := range int64(50) { // 5 a second through the window, on B
		p.decide(p.b, 200*k)
	}
	var d Answer
	for k := range int64(8) { // then on A: 8 in its first 0.4 s
		d = p.decide(p.a, 10000+50*k)
	}
	for ms := int64(10600); ms <= 18000; ms += 200 { // and 5 a second
		d = p.decide(p.a, ms)
	}
	prev := p.prevWeight(p.a, d)
	t.Logf("at 8 s: estimate %.2f, the previous window's 50 weigh %.2f", d.Estimate, prev)
	if prev < 9.5 || prev > 10.5 {
		t.Errorf("at 8 s the previous window's 50 units, spread over it, weigh %.2f, want 10 (a fifth of it still in the trailing window)", prev)
	}
}
