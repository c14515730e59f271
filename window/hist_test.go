package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEntryStays64Bytes: a cold key's entry keeps its size; a hot key's
// histograms are in the side table, found through the entry's padding.
func TestEntryStays64Bytes(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Errorf("entry is %d bytes, want 64", n)
	}
}

// shapedDecideAt decides cost units at t ≥ now for the key whose view at
// now is prev, curr with shapes ps, cs, if it sends nothing more: in the
// next window curr becomes prev, with its shape cs (zero when it will not
// be kept), and two windows on the view is empty.
func shapedDecideAt(sw algo.SlidingWindow, now int64, prev, curr uint64, sp algo.Spans, ps, cs shape, t int64, cost uint64) bool {
	var none shape
	var v algo.Conformance
	switch algo.WindowStart(t, int64(sw.Window)) - algo.WindowStart(now, int64(sw.Window)) {
	case 0:
		decideShaped(sw, &v, t, prev, curr, cost, sp, &ps, &cs)
		return v.Allowed
	case int64(sw.Window):
		decideShaped(sw, &v, t, curr, 0, cost, algo.Spans{Prev: sp.Next, Next: sw.Even().Next}, &cs, &none)
		return v.Allowed
	}
	return sw.Decide(t, 0, 0, cost).Allowed
}

// TestShapedReleaseIsExact: for keys with histograms, under random traffic
// (bursts at one instant, trickles, gaps, costs above 1, windows of 100 ns
// to a minute, each placement of a bucket's units), every refusal's
// ReleaseAt is the first instant at which the estimate admits the request
// if the key sends nothing more: the estimate refuses at every instant
// before it (scanned whole for the short windows) and admits at it; and
// the Limiter, asked 1 ns before and at it, agrees.
func TestShapedReleaseIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	checked, scanned := 0, 0
	trials := 300
	if testing.Short() || raceEnabled {
		trials = 60
	}
	for trial := range trials {
		interp := histInterp(trial % 3)
		w := time.Duration(100 + rng.Int64N(100_000))
		if trial%10 == 0 {
			w = time.Duration(1+rng.Int64N(60)) * time.Second
		}
		limit := 1 + rng.Uint64N(300)
		clock := newSimClock(t0)
		l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{hist: histParams{interp: interp}})
		pol := &Policy{Limit: limit, Window: w}
		key := rng.Uint64()
		s := l.shardOf(key)
		tt := t0.UnixNano() + rng.Int64N(int64(w))
		for range 400 {
			// Bursts at one instant, a trickle, or a gap.
			switch rng.IntN(8) {
			case 0:
				tt += rng.Int64N(int64(w))
			case 1, 2:
			default:
				tt += rng.Int64N(int64(w)/int64(4*limit) + 1)
			}
			if rng.IntN(16) == 0 {
				l.Flush(context.Background(), time.Unix(0, tt))
			}
			cost := uint64(1)
			if rng.IntN(8) == 0 {
				cost = 1 + rng.Uint64N(limit/4+1)
			}
			d := l.Decide(context.Background(), time.Unix(0, tt), pol, key, limit, cost)
			if d.Allowed || d.ReleaseAt == 0 {
				continue
			}
			rel := d.ReleaseAt
			// The estimator's own view of the key, frozen at tt.
			s.mu.Lock()
			e := s.lookup(key)
			prev, curr := e.view()
			sp := e.spans()
			ps, cs := s.shapes(e, curr)
			// Copies: the Limiter's calls below may roll the halves.
			var psh, csh histHalf
			var pb, cb []histBucket
			if ps.h != nil {
				psh, pb = *ps.h, append([]histBucket(nil), ps.b...)
				ps.h, ps.b = &psh, pb
			}
			if cs.h != nil {
				csh, cb = *cs.h, append([]histBucket(nil), cs.b...)
				cs.h, cs.b = &csh, cb
			}
			s.mu.Unlock()
			sw := algo.SlidingWindow{Limit: limit, Window: w}
			if rel < tt || !shapedDecideAt(sw, tt, prev, curr, sp, ps, cs, rel, cost) {
				t.Fatalf("trial %d (W %v, L %d, interp %d): refused at %d with ReleaseAt %d, which the estimate does not admit", trial, w, limit, interp, tt, rel)
			}
			if rel > tt && shapedDecideAt(sw, tt, prev, curr, sp, ps, cs, rel-1, cost) {
				t.Fatalf("trial %d (W %v, L %d, interp %d): ReleaseAt %d, but the estimate admits 1 ns before", trial, w, limit, interp, rel)
			}
			if w <= 100*time.Microsecond && ps.h != nil {
				for u := tt; u < rel; u++ {
					if shapedDecideAt(sw, tt, prev, curr, sp, ps, cs, u, cost) {
						t.Fatalf("trial %d: ReleaseAt %d, but the estimate admits at %d", trial, rel, u)
					}
				}
				scanned++
			}
			// The Limiter agrees (asked at a refused instant nothing changes
			// but the window's roll, which the release already assumes).
			if rel > tt && l.Decide(context.Background(), time.Unix(0, rel-1), pol, key, limit, cost).Allowed {
				t.Fatalf("trial %d: the Limiter admits 1 ns before ReleaseAt", trial)
			}
			if !l.Decide(context.Background(), time.Unix(0, rel), pol, key, limit, cost).Allowed {
				t.Fatalf("trial %d: the Limiter refuses at ReleaseAt", trial)
			}
			tt = rel
			checked++
		}
	}
	t.Logf("%d release times checked, %d scanned whole", checked, scanned)
	if checked < trials {
		t.Errorf("only %d refusals checked", checked)
	}
}

// TestHistogramsAreBounded: the side table holds at most MaxKeys/32
// histograms; a hot key that finds it full keeps the uniform estimate for
// the window (counted once), and a histogram is freed with its key, or when
// its key's window ends below the threshold.
func TestHistogramsAreBounded(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{MaxKeys: 128, Shards: 1})
	pol := &Policy{Limit: 100, Window: 10 * time.Second}
	ctx := context.Background()
	for k := range 10 {
		for range 8 { // 8 ≥ ⌈100/16⌉: hot
			l.Decide(ctx, clock.Now(), pol, uint64(k), 100, 1)
		}
	}
	if n := l.Histograms(); n != 4 {
		t.Errorf("%d histograms, want 4 (MaxKeys 128 / 32)", n)
	}
	if n := testutil.ToFloat64(l.hm.exhausted); n != 6 {
		t.Errorf("exhausted counted %v times, want 6 (once per key and window)", n)
	}
	// Next window: the six without a histogram try again, but the four
	// keep theirs (their windows ended hot).
	clock.Add(10 * time.Second)
	for k := range 10 {
		l.Decide(ctx, clock.Now(), pol, uint64(k), 100, 1)
	}
	if n, x := l.Histograms(), testutil.ToFloat64(l.hm.exhausted); n != 4 || x != 12 {
		t.Errorf("next window: %d histograms, %v exhausted, want 4 and 12", n, x)
	}
	// A window that ends cold drops its key's histogram at the roll.
	clock.Add(10 * time.Second)
	for k := range 10 {
		l.Decide(ctx, clock.Now(), pol, uint64(k), 100, 1)
	}
	if n := l.Histograms(); n != 0 {
		t.Errorf("after a cold window: %d histograms, want 0", n)
	}
	// Idle keys are swept with their histograms.
	for k := range 4 {
		for range 8 {
			l.Decide(ctx, clock.Now(), pol, uint64(100+k), 100, 1)
		}
	}
	if n := l.Histograms(); n != 4 {
		t.Fatalf("%d histograms, want 4", n)
	}
	clock.Add(time.Minute)
	for range 3 {
		l.Flush(ctx, clock.Now())
		clock.Add(time.Duration(sweepEvery)) // a shard sweeps at most this often
	}
	if n, k := l.Histograms(), l.Keys(); n != 0 || k != 0 {
		t.Errorf("after the idle sweep: %d histograms, %d keys, want 0 and 0", n, k)
	}
	// Evicted keys give theirs back.
	for k := range 200 {
		for range 8 {
			l.Decide(ctx, clock.Now(), pol, uint64(1000+k), 100, 1)
		}
	}
	if n := l.Histograms(); n > 4 {
		t.Errorf("after evictions: %d histograms, want ≤ 4", n)
	}
	s := &l.shards[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	used := 0
	for i := range s.slab {
		if e := &s.slab[i]; e.hist != 0 {
			used++
			if j, ok := s.idx.get(e.key); !ok || j != uint32(i) || s.hists.recs[e.hist-1].owner != uint32(i) {
				t.Errorf("entry %d holds histogram %d but is not live or not its owner", i, e.hist)
			}
		}
	}
	if used != s.hists.used || len(s.hists.free)+used != len(s.hists.recs) {
		t.Errorf("%d entries hold histograms, the table counts %d used, %d free of %d", used, s.hists.used, len(s.hists.free), len(s.hists.recs))
	}
}

// TestOtherEdgesShapeIsRecorded: what another edge admits reaches this
// edge's view with a flush reply, and its histogram places it then. Edge A
// admits 10 at 1 s into a window; edge B a burst of 90 at 5 s; A admits one
// more at 5.001 s (it has not heard of the burst: async over-admission,
// bounded by a flush) and learns of the burst from that increment's reply.
// At 12.5 s the burst and A's 101st are all still in the trailing window,
// so A admits 9 more, not the 24 that an even spread (101 × 0.75) lets.
func TestOtherEdgesShapeIsRecorded(t *testing.T) {
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	a := newTestLimiter(t, clock, backend, Config{})
	b := newTestLimiter(t, clock, backend, Config{})
	pol := &Policy{Limit: 100, Window: 10 * time.Second}
	ctx := context.Background()
	key := uint64(42)
	decide := func(l *Limiter, n int) (admitted int) {
		for range n {
			if l.Decide(ctx, clock.Now(), pol, key, 100, 1).Allowed {
				admitted++
			}
		}
		return admitted
	}
	clock.Add(time.Second)
	if n := decide(a, 10); n != 10 {
		t.Fatalf("A admitted %d of its first 10", n)
	}
	a.Flush(ctx, clock.Now())
	clock.Add(4 * time.Second)
	if n := decide(b, 90); n != 90 {
		t.Fatalf("B admitted %d of its 90", n)
	}
	b.Flush(ctx, clock.Now())
	clock.Add(time.Millisecond)
	if n := decide(a, 1); n != 1 {
		t.Fatal("A refused its 11th")
	}
	a.Flush(ctx, clock.Now())
	clock.Add(7499 * time.Millisecond)
	// A's first request may be refused on B's rate at its burst, with a
	// read of the count at the next flush, which shows B silent since; A
	// then guesses at most one unit of B's (othersUnseen rounds up).
	n := decide(a, 1)
	a.Flush(ctx, clock.Now())
	if n += decide(a, 50); n < 8 || n > 9 {
		t.Errorf("at 12.5 s A admitted %d, want 9, or 8 for a guessed unit of B's (B's burst is all in the trailing window)", n)
	}
}

// TestHotDecideDoesNotAllocate: a hot key's decisions, admitted and refused
// (with the release walk), record and read its histograms without
// allocating.
func TestHotDecideDoesNotAllocate(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{})
	ctx := context.Background()
	big := &Policy{Limit: 1_000_000_000, Window: time.Minute}
	small := &Policy{Limit: 100, Window: time.Minute}
	hotKey(l, clock, big, 1, false)
	hotKey(l, clock, small, 2, true)
	now := clock.Now()
	if n := testing.AllocsPerRun(1000, func() { l.Decide(ctx, now, big, 1, big.Limit, 1) }); n != 0 {
		t.Errorf("hot key, admitted: %v allocs/op, want 0", n)
	}
	if d := l.Decide(ctx, now, small, 2, small.Limit, 1); d.Allowed || d.ReleaseAt <= now.UnixNano() {
		t.Fatalf("the small key is not refused: %+v", d)
	}
	if n := testing.AllocsPerRun(1000, func() { l.Decide(ctx, now, small, 2, small.Limit, 1) }); n != 0 {
		t.Errorf("hot key, refused: %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { l.Record(now, small, 2, 1) }); n != 0 {
		t.Errorf("hot key, Record: %v allocs/op, want 0", n)
	}
}

// hotKey gives key under r a full histogram of its previous window (a
// bucket at each of k instants over the window, or over its second half
// when late, about L units in all) and a started one for its current
// window, leaving the clock a third into that window.
func hotKey(l *Limiter, clock *simClock, r *Policy, key uint64, late bool) {
	ctx := context.Background()
	w := int64(r.Window)
	start := algo.WindowStart(clock.Now().UnixNano(), w) + w
	k := uint64(l.shards[0].hists.k)
	per, from, span := r.Limit/k, start, w
	if late {
		per, from, span = (r.Limit+k-1)/k, start+w/2, w/2
	}
	for j := range k {
		clock.t.Store(from + int64(j)*span/int64(k))
		l.Decide(ctx, clock.Now(), r, key, r.Limit, per)
	}
	for late && l.Decide(ctx, clock.Now(), r, key, r.Limit, 1).Allowed {
	}
	clock.t.Store(start + w + w/3)
	l.Decide(ctx, clock.Now(), r, key, r.Limit, 1)
}

// BenchmarkDecideAsyncHot is BenchmarkDecideAsync for a key with
// histograms: the estimate bisects the previous window's buckets and the
// decision is recorded into the current one.
func BenchmarkDecideAsyncHot(b *testing.B) {
	clock := newSimClock(t0)
	l := newTestLimiter(b, clock, store.NewMemStore(clock), Config{})
	r := &Policy{Limit: 1_000_000_000, Window: time.Minute}
	hotKey(l, clock, r, 7, false)
	now := clock.Now()
	ctx := context.Background()
	if !l.Decide(ctx, now, r, 7, r.Limit, 1).Allowed {
		b.Fatal("refused")
	}
	b.ReportAllocs()
	for b.Loop() {
		l.Decide(ctx, now, r, 7, r.Limit, 1)
	}
}

// BenchmarkDecideAsyncHotRefused: a hot key over its limit, each decision
// walking the shape for its release time (the block cache keeps such a
// key's next requests from the limiter until then).
func BenchmarkDecideAsyncHotRefused(b *testing.B) {
	for _, k := range []int{16, 32, 64} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			clock := newSimClock(t0)
			l := newTestLimiter(b, clock, store.NewMemStore(clock), Config{hist: histParams{buckets: k}})
			r := &Policy{Limit: 100, Window: time.Minute}
			hotKey(l, clock, r, 7, true)
			now := clock.Now()
			ctx := context.Background()
			if l.Decide(ctx, now, r, 7, r.Limit, 1).Allowed {
				b.Fatal("admitted")
			}
			b.ReportAllocs()
			for b.Loop() {
				l.Decide(ctx, now, r, 7, r.Limit, 1)
			}
		})
	}
}

// The other edges' units that this edge sees only after the roll (their
// last ones of the window, in the read of the previous window) are placed
// at the window's end, not spread over the shape this edge recorded: they
// weigh fully in the trailing window for as long as they can be in it.
func TestUnitsSeenAfterTheRollWeighAtTheWindowsEnd(t *testing.T) {
	clock := newSimClock(t0) // t0 starts a 10 s window
	backend := store.NewMemStore(clock)
	l := newTestLimiter(t, clock, backend, Config{})
	r := &Policy{Limit: 100, Window: 10 * time.Second}
	ctx := context.Background()
	const key = 42
	// This edge: 40 units over the first 4 s of the window.
	for range 40 {
		if !l.Decide(ctx, clock.Now(), r, key, r.Limit, 1).Allowed {
			t.Fatal("refused within the limit")
		}
		l.Flush(ctx, clock.Now())
		clock.Add(100 * time.Millisecond)
	}
	// Another edge: 40 units at 9.9 s, which this edge never saw in the window.
	ops := []store.Op{{Key: key, Start: t0.UnixMilli(), Delta: 40, TTL: 20 * time.Second}}
	backend.Do(ctx, ops)
	// The next window: the flusher reads the previous one once its grace is over.
	clock.Add(10*time.Second - 4*time.Second + time.Second)
	l.Decide(ctx, clock.Now(), r, key, r.Limit, 1)
	l.Flush(ctx, clock.Now())
	// At 15 s the trailing window holds the 40 late units (and the one at 11 s).
	clock.Add(4 * time.Second)
	d := l.Decide(ctx, clock.Now(), r, key, r.Limit, 1)
	if d.Estimate < 40 {
		t.Errorf("estimate at 15 s %.2f, want at least the 41 units in the trailing window (the other edge's 40 at 9.9 s weigh fully)", d.Estimate)
	}
}

// TestALateStartCountsWholeInTheNextWindow: a client whose first units
// come 0.3 s before a window ends, too few for a shape (under a sixteenth
// of the limit), then runs at twice its limit, on one edge or dealt over
// two: its trailing window never holds more than the limit. Spread over
// the whole window, those units weighed less and less in the next one
// while all of them still counted, and the client got about the limit
// plus what they had lost (105 of 100, on one edge or two).
func TestALateStartCountsWholeInTheNextWindow(t *testing.T) {
	for _, n := range []int{1, 2} {
		worst := lateStart(t, n)
		t.Logf("%d edges: most admitted in a trailing window: %d of 100", n, worst)
		if worst > 100 {
			t.Errorf("%d edges: the client had %d in a trailing window: want at most its limit, 100", n, worst)
		}
	}
}

// lateStart runs TestALateStartCountsWholeInTheNextWindow's client over n
// edges and returns the most it had admitted in a trailing window.
func lateStart(t *testing.T, n int) uint64 {
	const limit = 100
	w := 10 * time.Second
	clock := newSimClock(t0)
	backend := store.NewMemStore(clock)
	edges := make([]*Limiter, n)
	for i := range edges {
		edges[i] = newTestLimiter(t, clock, backend, Config{})
	}
	pol := &Policy{Limit: limit, Window: w}
	key := uint64(0x1a7e)
	ctx := context.Background()
	judge := algo.SlidingLog{Limit: 1 << 20, Window: w}
	var log algo.SlidingLogState
	worst, k := uint64(0), 0
	decide := func(tt int64) {
		clock.t.Store(tt)
		if edges[k%n].Decide(ctx, time.Unix(0, tt), pol, key, limit, 1).Allowed {
			judge.Add(&log, tt, 1)
			worst = max(worst, uint64(judge.Count(&log, tt)))
		}
		k++
		for _, e := range edges {
			e.Flush(ctx, time.Unix(0, tt))
		}
	}
	base := t0.UnixNano() // on the window grid
	for i := range 6 {
		decide(base + int64(9700*time.Millisecond) + int64(i)*int64(10*time.Millisecond))
	}
	for tt := base + int64(w); tt < base+int64(2*w); tt += int64(w) / (2 * limit) {
		decide(tt)
	}
	return worst
}
