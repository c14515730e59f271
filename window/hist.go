package window

import (
	"math"
	"math/bits"

	"github.com/poplimit/poplimit/internal/wide"
	"github.com/prometheus/client_golang/prometheus"
)

// Hot keys' window shapes.
//
// The two-counter estimate prev × (W − elapsed)/W + curr assumes the
// previous window's units were spread evenly over it. When a heavy client
// starts mid-window (a replay, an attack's onset) its previous window's
// units all came late in it, the estimate weighs them too little, and up to
// twice the limit is admitted in a trailing window. So for the keys that
// matter, those whose view (prev + curr) reaches ⌈L/16⌉, the edge records
// the shape of the current window as it observes it, and at the roll that
// shape becomes the previous window's.
//
// The shape is an equi-depth histogram of the view's increases: k buckets
// in time order, each taking units until it holds ⌈L/k⌉ and keeping its
// count and the first and last instant it grew (to 1 ns for windows up to
// 4.3 s, W/2^32 beyond, rounded up), so it is as fine where a burst puts
// many units in a few milliseconds as where a trickle spreads a few over
// seconds: the mass error anywhere is within one bucket's units. When a
// window's view outgrows the k buckets (a block rule counting attempts,
// other edges' units) adjacent pairs merge and buckets take twice as much.
// What the view held when recording started is a leading segment spread
// evenly from the first instant this edge counted units in the window (kept
// in the entry's padding) to that moment.
//
// Every increase of the view is recorded: this edge's own admissions when
// they are counted, and the other edges' when a flush reply (or a sync
// decision's reply) raises the current count, within one flush interval of
// their admission (never earlier than it: the shape errs late). The
// estimate of the previous window's part still in the trailing window
// (t − W, t] becomes
//
//	prev × (histogram mass after t − W) / (histogram mass)
//
// where the units that reach the view of the previous window after the
// roll (the other edges' last ones, in the read of the window or a late
// reply) are recorded at the window's end: this edge saw none of them
// before it, and spreading them over the shape it recorded would weigh
// them as gone while they are still in the trailing window (with clients
// dealt over every edge, that was most of the estimate's error). A
// previous window this edge did not record, or whose count is still
// larger than its shape's mass, scales the shape, as prev does.
// Within a bucket of n units from first to last, one is taken to be at last
// and n − 1 spread evenly over [first, last] (interpLast). Decisions
// compare it exactly, in 128-bit integers, and a refusal's ReleaseAt is
// the first instant the same estimate admits
// (releaseShaped): exact to the nanosecond, as Release is. Keys without a
// histogram, and every window the histogram did not see, keep the uniform
// estimate and Release.
//
// Histograms live in a bounded side table per shard, at most MaxKeys/32
// in all (a record is 1,640 bytes with k = 64: at most 54 MB for the
// default MaxKeys); a key that finds it
// full keeps the uniform estimate for the window (counted by
// poplimit_window_histograms_exhausted_total). The store is unchanged:
// still two counters per key and window, still one increment per dirty key
// per flush, and cold keys' entries are still 64 bytes.

// histParams are the window-shape histograms' parameters. They are not
// operator configuration: Config.hist carries them, unexported, so that the
// package's tests can compare estimators; a zero field takes its default.
type histParams struct {
	buckets    int        // k, buckets per window (rounded down to even); default 64
	onsetShift uint       // a view reaching ⌈L/2^onsetShift⌉ starts recording; default 4
	keysDiv    int        // at most MaxKeys/keysDiv histograms in all; default 32; negative: none
	interp     histInterp // how a bucket's units are placed over it; default interpLast
}

func (p histParams) withDefaults() histParams {
	if p.buckets == 0 {
		p.buckets = 64
	}
	if p.onsetShift == 0 {
		p.onsetShift = 4
	}
	if p.keysDiv == 0 {
		p.keysDiv = 32
	}
	return p
}

// histInterp places a bucket's n units over its instants [first, last],
// as the mass after u in [first, last): c0 + c1·(last − u)/(last − first)
// (shape.place).
type histInterp uint8

const (
	interpLast histInterp = iota // one at last, n − 1 evenly: c0 = 1, c1 = n − 1
	interpEven                   // n evenly: c0 = 0, c1 = n
	interpEnds                   // one at each end, n − 2 evenly: c0 = 1, c1 = n − 2
)

// maxHistWindow bounds the windows that get histograms, so that the
// geometry's products fit in 64 bits (rules allow at most 366 days, 2^55 ns).
const maxHistWindow = 1 << 56

// histBucket is one bucket of a window's histogram: units counted from
// first to last. Instants are quanta of the window (histQuantum) from its
// start.
type histBucket struct {
	cum  uint32 // the half's base plus the units of this bucket and those before it
	f, l uint32 // the first and last instant
}

// histHalf is the histogram of one window of a key's view. Its buckets are
// in the shard's slab, in time order: a bucket takes units until it holds
// cap (equi-depth, so the shape is located where the mass is, a burst as
// finely as a trickle), then the next one; when all k are used, pairs are
// merged and cap doubles.
type histHalf struct {
	start int64  // the window recorded, Unix ns; 0 when unused
	from  int64  // the base is spread evenly over [from, at]
	at    int64  // where recording started, to a quantum
	base  uint32 // the view's count when recording started
	mass  uint32 // base plus the buckets' units (saturated: recording stops)
	cap   uint32 // units a bucket takes
	nb    uint32 // buckets in use
}

// histRec is one key's histograms: its current window's and its previous
// window's, told apart by their start.
type histRec struct {
	owner uint32 // slab index of the entry
	thr   uint32 // the threshold of L: a window whose view ends below it is not kept
	cap   uint32 // a new half's bucket capacity, ⌈L/k⌉
	last  uint32 // the window's last quantum
	q     int64  // the quantum, histQuantum(window)
	h     [2]histHalf
}

// hists is a shard's histogram slab. Its fields are protected by the
// shard's mutex.
type hists struct {
	k      int
	max    int
	shift  uint       // histParams.onsetShift
	interp histInterp // histParams.interp
	recs   []histRec
	bk     []histBucket // 2k per record
	free   []uint32
	used   int
}

// histQuantum is the resolution of a histogram's instants in a window of w
// ns: 1 ns up to 2^32 ns, so that offsets fit in 32 bits.
func histQuantum(w int64) int64 { return max(1, (w+(1<<32-1))>>32) }

// quantize returns the offset of t in the window [start, start + w) in
// quanta of q, rounded up (a unit is never taken as gone before it is),
// except in the window's last quantum, last = (w − 1)/q.
func quantize(t, start, w, q int64, last uint32) uint32 {
	t = min(max(t, start), start+w-1)
	if q == 1 {
		return uint32(t - start)
	}
	return min(uint32((t-start+q-1)/q), last)
}

// firstShift is the resolution (a power of two) of an entry's first
// instant in a window of w ns: offsets under 2^15.
func firstShift(w int64) uint { return uint(max(0, bits.Len64(uint64(w))-15)) }

// histOK reports whether windows of w ns get histograms.
func histOK(w int64, k int) bool { return k >= 2 && w > 0 && w <= maxHistWindow }

// threshold is the view at which a key of limit L starts recording.
func (hs *hists) threshold(limit uint64) uint64 {
	sh := hs.shift
	return max(1, limit>>sh+min(limit&(1<<sh-1), 1))
}

// init sizes the slab for a shard of max entries.
func (hs *hists) init(max int, p histParams) {
	hs.k = p.buckets &^ 1 // merging takes pairs
	hs.shift, hs.interp = p.onsetShift, p.interp
	if p.keysDiv > 0 {
		hs.max = (max + p.keysDiv - 1) / p.keysDiv
	}
}

// half returns half h of record r's buckets.
func (hs *hists) half(r uint32, h int) []histBucket {
	o := (int(r)*2 + h) * hs.k
	return hs.bk[o : o+hs.k : o+hs.k]
}

// alloc returns a free record's index + 1, or 0 when the slab is full.
func (hs *hists) alloc() uint32 {
	if n := len(hs.free); n > 0 {
		r := hs.free[n-1]
		hs.free = hs.free[:n-1]
		hs.used++
		return r + 1
	}
	if len(hs.recs) >= hs.max {
		return 0
	}
	hs.recs = append(hs.recs, histRec{})
	hs.bk = append(hs.bk, make([]histBucket, 2*hs.k)...)
	hs.used++
	return uint32(len(hs.recs))
}

func (hs *hists) release(id uint32) {
	hs.recs[id-1] = histRec{}
	hs.free = append(hs.free, id-1)
	hs.used--
}

// histFree drops entry e's histograms, if any. s.mu must be held.
func (s *shard) histFree(e *entry) {
	if e.hist != 0 {
		s.hists.release(e.hist)
		e.hist = 0
	}
}

// histCur returns e's record and the index of its current window's half.
func (s *shard) histCur(e *entry) (*histRec, int) {
	rec := &s.hists.recs[e.hist-1]
	if rec.h[0].start == e.start {
		return rec, 0
	}
	return rec, 1
}

// histRoll moves e's histograms to the window starting at start, from
// e.start: the current half becomes the previous one when the windows are
// consecutive and the view that ends (currView) reached the threshold;
// otherwise they are dropped. s.mu must be held.
func (s *shard) histRoll(e *entry, start int64, currView uint64) {
	if e.hist == 0 {
		return
	}
	rec, c := s.histCur(e)
	if start != e.start+e.win || currView < uint64(rec.thr) || rec.h[c].start != e.start {
		s.histFree(e)
		return
	}
	rec.h[1-c] = histHalf{start: start, from: start, at: start, cap: rec.cap}
}

// noteFirst keeps the first instant this edge counted units for e in its
// current window. s.mu must be held.
func (e *entry) noteFirst(t int64) {
	if e.first == 0 {
		e.setFirst(t)
	}
}

func (e *entry) setFirst(t int64) {
	e.first = uint16(1 + (max(t-e.start, 0) >> firstShift(e.win)))
}

// histMay reports whether histNote has anything to do for e, whose view
// grows to view: cheap enough for every decision. s.mu must be held.
func (s *shard) histMay(e *entry, view, limit uint64) bool {
	return e.hist != 0 || e.flags&flagNoHist == 0 && view >= s.hists.threshold(limit)
}

// histNote records that entry i's view of its current window grew by n
// units at t, after a decision saw the counts prev and curr (before the
// increase): into its histogram, or, when the view reaches the threshold
// of limit, by starting one (limit 0: never start). s.mu must be held.
func (s *shard) histNote(l *Limiter, i uint32, t int64, n, prev, curr, limit uint64) {
	e := &s.slab[i]
	if n == 0 {
		return
	}
	if e.hist == 0 {
		if limit == 0 || e.flags&flagNoHist != 0 || prev+curr+n < s.hists.threshold(limit) || !histOK(e.win, s.hists.k) {
			return
		}
		id := s.hists.alloc()
		if id == 0 {
			e.flags |= flagNoHist // until the next window
			l.hm.exhausted.Inc()
			return
		}
		e.hist = id
		q := histQuantum(e.win)
		last := uint32((e.win - 1) / q)
		at := e.start + int64(quantize(t, e.start, e.win, q, last))*q
		from := e.start
		if e.first != 0 {
			// The end of the first unit's quantum: a burst at one
			// instant is a point.
			sh := firstShift(e.win)
			from = min(e.start+int64(e.first)<<sh-1, at)
		}
		rec := &s.hists.recs[id-1]
		k := uint64(s.hists.k)
		*rec = histRec{owner: i, thr: sat32(s.hists.threshold(limit)), cap: sat32(max(1, (limit+k-1)/k)), last: last, q: q}
		base := sat32(curr)
		rec.h[0] = histHalf{start: e.start, from: from, at: at, base: base, mass: base, cap: rec.cap}
	}
	rec, c := s.histCur(e)
	h := &rec.h[c]
	if h.start != e.start {
		return // not recording this window
	}
	s.histAdd(rec, e.hist-1, c, quantize(max(t, h.at), e.start, e.win, rec.q, rec.last), n)
}

// histLate records that entry e's view of its previous window grew by n
// units after the roll (the other edges' last units, seen in the read of
// the window or a late reply): at the window's last instant, since this
// edge saw none of them before its end (the shape errs late). s.mu must
// be held.
func (s *shard) histLate(e *entry, n uint64) {
	if e.hist == 0 || n == 0 {
		return
	}
	rec := &s.hists.recs[e.hist-1]
	for c := range 2 {
		if h := &rec.h[c]; h.start == e.start-e.win && h.mass > 0 {
			s.histAdd(rec, e.hist-1, c, rec.last, n)
		}
	}
}

// histAdd adds n units at quantum x, not before the last one recorded, to
// half c of record id's histogram.
func (s *shard) histAdd(rec *histRec, id uint32, c int, x uint32, n uint64) {
	h := &rec.h[c]
	n = min(n, uint64(math.MaxUint32-h.mass))
	if n == 0 {
		return
	}
	bs := s.hists.half(id, c)
	if h.nb > 0 {
		b := &bs[h.nb-1]
		x = max(x, b.l) // in time order
		held := b.cum - h.base
		if h.nb > 1 {
			held = b.cum - bs[h.nb-2].cum
		}
		if uint64(held)+n <= uint64(h.cap) || b.f == x {
			b.cum += uint32(n)
			b.l = x
			h.mass += uint32(n)
			return
		}
	}
	if int(h.nb) == len(bs) {
		// Out of buckets: merge pairs, each taking twice as much.
		for j := range len(bs) / 2 {
			bs[j] = histBucket{cum: bs[2*j+1].cum, f: bs[2*j].f, l: bs[2*j+1].l}
		}
		h.nb /= 2
		h.cap = uint32(min(2*uint64(h.cap), math.MaxUint32))
	}
	h.mass += uint32(n)
	bs[h.nb] = histBucket{cum: h.mass, f: x, l: x}
	h.nb++
}

// shapes returns the shape of e's previous window, for its estimate, and
// of its current one if it will be kept at the roll (for a release time in
// the next window); a zero shape is the uniform assumption. s.mu must be
// held.
func (s *shard) shapes(e *entry, curr uint64) (ps, cs shape) {
	if e.hist == 0 {
		return
	}
	rec := &s.hists.recs[e.hist-1]
	q := rec.q
	for c := range 2 {
		h := &rec.h[c]
		switch {
		case h.mass == 0:
		case h.start == e.start-e.win:
			ps = shape{h: h, b: s.hists.half(e.hist-1, c)[:h.nb], q: q, interp: s.hists.interp}
		case h.start == e.start && curr >= uint64(rec.thr):
			cs = shape{h: h, b: s.hists.half(e.hist-1, c)[:h.nb], q: q, interp: s.hists.interp}
		}
	}
	return ps, cs
}

// shape is the recorded shape of one window of a key's view; h nil means
// none (the window's units are taken as spread evenly).
type shape struct {
	h      *histHalf
	b      []histBucket // the buckets in use
	q      int64        // the quantum of their instants
	interp histInterp   // how a bucket's units are placed over it
}

// seg returns bucket j's segment: its n units, from f to l (Unix ns).
func (sh *shape) seg(j int) (n uint64, f, l int64) {
	b := &sh.b[j]
	below := sh.h.base
	if j > 0 {
		below = sh.b[j-1].cum
	}
	return uint64(b.cum - below), sh.h.start + int64(b.f)*sh.q, sh.h.start + int64(b.l)*sh.q
}

// after returns the window's recorded mass after instant u: a, the mass of
// the segments wholly after u, and the segment [f, l] of n units that
// holds u, if any (n 0: none). Segments are disjoint and in time order:
// the base over [from, at], then the buckets. Each segment's units are
// placed by sh.interp (see fits).
func (sh *shape) after(u int64) (a, n uint64, f, l int64) {
	h := sh.h
	m := uint64(h.mass)
	if u < h.at {
		if h.base == 0 || u < h.from {
			return m, 0, 0, 0
		}
		return m - uint64(h.base), uint64(h.base), h.from, h.at
	}
	// The first bucket not gone by u: its last instant is after u.
	lo, hi := 0, len(sh.b)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if h.start+int64(sh.b[mid].l)*sh.q > u {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == len(sh.b) {
		return 0, 0, 0, 0
	}
	n, f, l = sh.seg(lo)
	a = m - uint64(sh.b[lo].cum)
	if u < f {
		return a + n, 0, 0, 0
	}
	return a, n, f, l
}

// place returns how a segment of n ≥ 1 units is placed over [f, l]: c0
// units at l and c1 spread evenly, so that the mass after u in [f, l) is
// c0 + c1·(l − u)/(l − f).
func (sh *shape) place(n uint64) (c0, c1 uint64) {
	switch {
	case sh.interp == interpLast:
		return 1, n - 1
	case sh.interp == interpEnds && n >= 2:
		return 1, n - 2
	}
	return 0, n
}

// fits reports whether p × m/M ≤ r, m the mass after u given by a, n, f, l
// (see after), M = sh.h.mass: exactly, in 128-bit integers.
func (sh *shape) fits(p, r, a, n uint64, f, l, u int64) bool {
	m := uint64(sh.h.mass)
	if n == 0 || l == f {
		return wide.LE(wide.Mul(p, a), wide.Mul(r, m))
	}
	c0, c1 := sh.place(n)
	d := uint64(l - f)
	x := wide.Add(wide.Mul(a+c0, d), wide.Mul(c1, uint64(l-u)))
	return wide.LE(wide.MulX(x, p), wide.MulX(wide.Mul(r, m), d))
}

// prevPart returns p × m/M as a float, for reporting, m the mass after u
// given by a, n, f, l (see after).
func (sh *shape) prevPart(p, a, n uint64, f, l, u int64) float64 {
	m := float64(a)
	if n > 0 && l > f {
		c0, c1 := sh.place(n)
		m += float64(c0) + float64(c1)*float64(l-u)/float64(l-f)
	}
	return float64(p) * m / float64(sh.h.mass)
}

// first returns the first u ≥ u0 at which p × (mass after u)/M ≤ r: the
// first segment once gone the rest fits is found by bisection (the mass
// after each falls with time), and the instant is solved within it,
// exactly.
func (sh *shape) first(u0 int64, p, r uint64) int64 {
	if a, n, f, l := sh.after(u0); sh.fits(p, r, a, n, f, l, u0) {
		return u0
	}
	h := sh.h
	m := uint64(h.mass)
	rm := wide.Mul(r, m)
	// The base, if the buckets alone fit.
	if h.base > 0 && h.at > u0 && wide.LE(wide.Mul(p, m-uint64(h.base)), rm) {
		return sh.within(u0, p, r, m-uint64(h.base), uint64(h.base), h.from, h.at)
	}
	lo, hi := 0, len(sh.b) // the first bucket once gone the rest fits
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if wide.LE(wide.Mul(p, m-uint64(sh.b[mid].cum)), rm) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == len(sh.b) {
		return h.start // unreachable: once every bucket is gone the mass is 0
	}
	n, f, l := sh.seg(lo)
	return sh.within(u0, p, r, m-uint64(sh.b[lo].cum), n, f, l)
}

// within returns the first u in [max(u0, f), l] at which the segment [f, l]
// of n units, with a units after it, fits; it fits at l. A float estimate,
// within a few ns of the answer, is corrected to the exact instant.
func (sh *shape) within(u0 int64, p, r, a, n uint64, f, l int64) int64 {
	lo := max(u0, f)
	if l == f || lo >= l {
		return max(lo, l)
	}
	m := uint64(sh.h.mass)
	c0, c1 := sh.place(n)
	d := float64(l - f)
	guess := l
	if c1 > 0 {
		x := wide.Float(wide.Mul(r, m)) - float64(p)*float64(a+c0)
		c := max(0, min(d, x*d/(float64(c1)*float64(p))))
		guess = max(lo, min(l, l-int64(c)))
	}
	return firstFit(lo, l, guess, func(u int64) bool { return sh.fits(p, r, a, n, f, l, u) })
}

// firstFit returns the least u in [lo, hi] with ok(u), given ok(hi) and ok
// monotone, galloping from guess and then bisecting.
func firstFit(lo, hi, guess int64, ok func(int64) bool) int64 {
	a, b := lo-1, hi // !ok(a) (a < lo: none), ok(b)
	if ok(guess) {
		b = guess
		for step := int64(1); b-step >= lo; step *= 2 {
			if v := b - step; !ok(v) {
				a = v
				break
			} else {
				b = v
			}
		}
	} else {
		a = guess
		for step := int64(1); a+step < b; step *= 2 {
			if v := a + step; ok(v) {
				b = v
				break
			} else {
				a = v
			}
		}
	}
	for b-a > 1 {
		if mid := a + (b-a)/2; ok(mid) {
			b = mid
		} else {
			a = mid
		}
	}
	return b
}

// histMetrics are the histograms' metrics.
type histMetrics struct {
	exhausted prometheus.Counter
}

func newHistMetrics(reg prometheus.Registerer, l *Limiter) (*histMetrics, error) {
	const ns, sub = "poplimit", "window"
	m := &histMetrics{
		exhausted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "histograms_exhausted_total", Help: "Hot keys that found no free window-shape histogram (MaxKeys/32 in all) and kept the uniform sliding-window estimate for a window."}),
	}
	if reg == nil {
		return m, nil
	}
	used := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "histograms", Help: "Hot keys whose window shapes are recorded for the sliding-window estimate."}, func() float64 { return float64(l.Histograms()) })
	for _, c := range []prometheus.Collector{m.exhausted, used} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Histograms returns the number of keys whose window shapes are recorded.
func (l *Limiter) Histograms() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += s.hists.used
		s.mu.Unlock()
	}
	return n
}
