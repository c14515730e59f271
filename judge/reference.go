package judge

import (
	"math"
	"math/bits"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
)

// Reference kinds: which exact truth a key's state keeps.
const (
	refLog    uint8 = iota // sliding_window, sliding_log: the exact sliding logs
	refBucket              // token_bucket, leaky_bucket: exact GCRA buckets
	refFixed               // fixed_window: the exact counts of the aligned window
)

// refOf returns the reference kind that judges algorithm a. Unknown values
// (event.Decode refuses them) are judged as a sliding window.
func refOf(a uint8) uint8 {
	switch policy.Algorithm(a) {
	case policy.TokenBucket, policy.LeakyBucket:
		return refBucket
	case policy.FixedWindow:
		return refFixed
	}
	return refLog
}

// maxDrain bounds the time a full reference bucket takes to drain, as
// algo.LeakyBucket.Validate does, so that every instant the bucket
// computes fits in int64 Unix nanoseconds.
const maxDrain = int64(100 * 365 * 24 * time.Hour)

// bucketDrain returns the time a full bucket of burst units leaking limit
// per w ns takes to drain, ⌈burst·w/limit⌉ ns, and whether the bucket's
// exact arithmetic holds (algo.LeakyBucket.Validate: burst × w + limit
// fits in an int64 and the drain is at most maxDrain). All three are > 0.
func bucketDrain(limit, burst uint32, w int64) (int64, bool) {
	if int64(burst) > (math.MaxInt64-int64(limit))/w {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(burst), uint64(w))
	q, r := bits.Div64(hi, lo, uint64(limit))
	if r > 0 {
		q++
	}
	if q > uint64(maxDrain) {
		return 0, false
	}
	return int64(q), true
}

// burstOf returns the capacity of p's bucket: its Burst, or its Limit when
// Burst is 0.
func burstOf(p *pending) int64 {
	if p.burst == 0 {
		return int64(p.limit)
	}
	return int64(p.burst)
}

// span is the length of time key state judged by p covers: its window, or
// for a bucket the time a full bucket takes to drain when that is longer.
// Keys are listed, and expire, by it.
func span(p *pending, kind uint8, w int64) int64 {
	if kind != refBucket {
		return w
	}
	d, _ := bucketDrain(p.limit, uint32(burstOf(p)), w) // valid: add checked it
	return max(w, d)
}

// gcra is a reference bucket: an exact GCRA (algo.LeakyBucket) that is
// poured whatever its level, and the start of its busy period.
type gcra struct {
	s algo.LeakyBucketState
	// busy is when the bucket last started to fill from empty, Unix ns:
	// it has held units ever since, so the units poured from busy on are
	// its level plus what leaked since busy.
	busy int64
}

// empty reports whether the bucket holds nothing at t.
func (g *gcra) empty(t int64) bool {
	return g.s.TAT < t || g.s.TAT == t && g.s.Frac == 0
}

// level returns the units in the bucket at t, at least 0.
func (g *gcra) level(lb algo.LeakyBucket, t int64) float64 {
	if g.empty(t) {
		return 0
	}
	return (float64(g.s.TAT-t)*float64(lb.Rate) + float64(g.s.Frac)) / float64(lb.Per)
}

// norm keeps the state readable under lb: a fraction from another rate (the
// key's limit changed) is dropped, as the edges' shared state does. Less
// than a nanosecond is lost.
func (g *gcra) norm(lb algo.LeakyBucket) {
	if g.s.Frac < 0 || g.s.Frac >= lb.Rate {
		g.s.Frac = 0
	}
}

// take pours n > 0 units into the bucket at t, whatever its level, and
// reports whether they fit (what lb.Allow would have admitted). It also
// returns the level before them, and the units poured over the busy period
// that ends with them with the bound the bucket promises for that interval,
// Capacity + Rate × its length (see ratio).
func (g *gcra) take(lb algo.LeakyBucket, t, n int64) (fit bool, before, busyUnits, busyBound float64) {
	g.norm(lb)
	before = g.level(lb, t)
	if g.empty(t) {
		g.busy = t
	}
	s := g.s
	if fit, _, _ = lb.Allow(&s, t, n); fit {
		g.s = s
	} else {
		g.pour(lb, t, n)
	}
	leaked := float64(lb.Rate) * float64(t-g.busy) / float64(lb.Per)
	return fit, before, before + float64(n) + leaked, float64(lb.Capacity) + leaked
}

// add pours n > 0 units at t whatever the level, without judging them.
func (g *gcra) add(lb algo.LeakyBucket, t, n int64) {
	g.norm(lb)
	if g.empty(t) {
		g.busy = t
	}
	g.pour(lb, t, n)
}

// pour adds n > 0 units to the bucket at t whatever its level (the
// unexported algo.LeakyBucket.pour), saturating far in the future.
func (g *gcra) pour(lb algo.LeakyBucket, t, n int64) {
	tat, frac := g.s.TAT, g.s.Frac
	if g.empty(t) {
		tat, frac = t, 0
	}
	per := int64(lb.Per)
	if n > (math.MaxInt64-frac)/per {
		g.s = algo.LeakyBucketState{TAT: math.MaxInt64}
		return
	}
	total := frac + n*per
	g.s.TAT, g.s.Frac = tat+total/lb.Rate, total%lb.Rate
	if g.s.TAT < tat {
		g.s = algo.LeakyBucketState{TAT: math.MaxInt64}
	}
}

// fixedCounts is a fixed-window reference: the units admitted and attempted
// in the window that starts at start.
type fixedCounts struct {
	start              int64 // Unix ns, a multiple of the window
	admitted, attempts int64
}

// roll moves the counts to the window of fw containing t, aligned as the
// edges align it (algo.FixedWindow.WindowStart: a multiple of the window
// since the Unix epoch), unless t is before the counted window (the window
// grew), which goes on counting.
func (f *fixedCounts) roll(fw algo.FixedWindow, t int64) {
	if s := fw.WindowStart(t); s > f.start || f.admitted == 0 && f.attempts == 0 {
		*f = fixedCounts{start: s}
	}
}

// verdict is a judged decision: whether it was wrong, and the figures the
// report derives from the truth it was judged against.
type verdict struct {
	wrongAllowed, wrongLimited bool
	// exact/bound is the decision's ratio to its limit (see Key.Ratio):
	// for a log or a fixed window the count this request included over
	// the limit; for a bucket the units of the busy period over the
	// bucket's promise for it.
	exact, bound float64
	// prior is what the edge's Estimate stands for: the count before this
	// request, or a bucket's level before it.
	prior float64
}

// judgeLog judges p (time t, cost c) against the key's exact sliding logs.
func judgeLog(st *keyState, p *pending, t, c, w int64) verdict {
	sl := algo.SlidingLog{Limit: int64(p.limit), Window: time.Duration(w)}
	limited := p.flags&fLimited != 0
	// exact is the count the verdict compares with the limit, this event
	// included; prior is the count the edge's estimate stands for.
	var exact, prior int64
	var v verdict
	switch {
	case p.flags&fBlock != 0:
		prior = sl.Count(&st.attempts, t)
		sl.Add(&st.attempts, t, c)
		exact = prior + c
		switch {
		case !limited:
			v.wrongAllowed = exact > int64(p.limit)
		case p.flags&fCache != 0: // inside an intended block
		default:
			v.wrongLimited = exact <= int64(p.limit)
		}
	case !limited: // throttle, allowed
		prior = sl.Count(&st.admitted, t)
		sl.Add(&st.admitted, t, c)
		sl.Add(&st.attempts, t, c)
		exact = prior + c
		v.wrongAllowed = exact > int64(p.limit)
	default: // throttle, limited
		prior = sl.Count(&st.admitted, t)
		n := sl.Count(&st.attempts, t)
		sl.Add(&st.attempts, t, c)
		exact = n + c
		v.wrongLimited = exact <= int64(p.limit)
	}
	v.exact, v.bound, v.prior = float64(exact), float64(p.limit), float64(prior)
	return v
}

// judgeFixed judges p against the exact counts of its fixed window.
func judgeFixed(st *keyState, p *pending, t, c, w int64) verdict {
	f := &st.fixed
	f.roll(algo.FixedWindow{Limit: int64(p.limit), Window: time.Duration(w)}, t)
	limited := p.flags&fLimited != 0
	var exact, prior int64
	var v verdict
	switch {
	case p.flags&fBlock != 0:
		prior = f.attempts
		f.attempts += c
		exact = prior + c
		switch {
		case !limited:
			v.wrongAllowed = exact > int64(p.limit)
		case p.flags&fCache != 0:
		default:
			v.wrongLimited = exact <= int64(p.limit)
		}
	case !limited:
		prior = f.admitted
		f.admitted += c
		f.attempts += c
		exact = prior + c
		v.wrongAllowed = exact > int64(p.limit)
	default:
		prior = f.admitted
		exact = f.attempts + c
		f.attempts += c
		v.wrongLimited = exact <= int64(p.limit)
	}
	v.exact, v.bound, v.prior = float64(exact), float64(p.limit), float64(prior)
	return v
}

// judgeBucket judges p against the key's exact buckets: GCRA with rate
// Limit per window and capacity Burst.
func judgeBucket(st *keyState, p *pending, t, c, w int64) verdict {
	lb := algo.LeakyBucket{Rate: int64(p.limit), Per: time.Duration(w), Capacity: burstOf(p)}
	adm, att := &st.bucket[0], &st.bucket[1]
	limited := p.flags&fLimited != 0
	var v verdict
	switch {
	case p.flags&fBlock != 0:
		fit, before, units, bound := att.take(lb, t, c)
		v.exact, v.bound, v.prior = units, bound, before
		switch {
		case !limited:
			v.wrongAllowed = !fit
		case p.flags&fCache != 0:
		default:
			v.wrongLimited = fit
		}
	case !limited:
		fit, before, units, bound := adm.take(lb, t, c)
		att.add(lb, t, c)
		v.exact, v.bound, v.prior = units, bound, before
		v.wrongAllowed = !fit
	default:
		adm.norm(lb)
		v.prior = adm.level(lb, t)
		fit, _, units, bound := att.take(lb, t, c)
		v.exact, v.bound = units, bound
		v.wrongLimited = fit
	}
	return v
}

// addLate logs a late event's units in the key's references at t, the
// latest instant the key has seen, without judging it.
func addLate(st *keyState, kind uint8, p *pending, t, c, w int64) {
	logAdmitted := p.flags&(fBlock|fLimited) == 0
	switch kind {
	case refBucket:
		lb := algo.LeakyBucket{Rate: int64(p.limit), Per: time.Duration(w), Capacity: burstOf(p)}
		st.bucket[1].add(lb, t, c)
		if logAdmitted {
			st.bucket[0].add(lb, t, c)
		}
	case refFixed:
		st.fixed.roll(algo.FixedWindow{Limit: int64(p.limit), Window: time.Duration(w)}, t)
		st.fixed.attempts += c
		if logAdmitted {
			st.fixed.admitted += c
		}
	default:
		// The logs clamp t to the latest instant they have seen anyway.
		sl := algo.SlidingLog{Limit: int64(p.limit), Window: time.Duration(w)}
		sl.Add(&st.attempts, t, c)
		if logAdmitted {
			sl.Add(&st.admitted, t, c)
		}
	}
}

// judgeCounted judges p (time t, cost c) of a rule that counts by
// response against the exact count of the units its key's responses
// counted: the admitted log (or fixed count, or bucket) holds the units
// each request counted, logged at its arrival, whenever it settled. A
// request was wrongly allowed when the key's counted units in the window
// before it left no room for its cost, wrongly limited when they did (a
// refusal caused by units still reserved that later settled as not
// counting included), except a block refusal from the block cache, which
// is inside a block the edges started. A limited request counts nothing.
func judgeCounted(st *keyState, kind uint8, p *pending, t, c, w int64) verdict {
	limited := p.flags&fLimited != 0
	n := int64(p.counted)
	var v verdict
	var fit bool
	switch kind {
	case refBucket:
		lb := algo.LeakyBucket{Rate: int64(p.limit), Per: time.Duration(w), Capacity: burstOf(p)}
		g := &st.bucket[0]
		g.norm(lb)
		v.prior = g.level(lb, t)
		s := g.s
		fit, _, _ = lb.Allow(&s, t, c)
		v.exact, v.bound = v.prior+float64(c), float64(lb.Capacity)
		if n > 0 && !limited {
			g.add(lb, t, n)
		}
	case refFixed:
		f := &st.fixed
		f.roll(algo.FixedWindow{Limit: int64(p.limit), Window: time.Duration(w)}, t)
		v.prior = float64(f.admitted)
		fit = f.admitted+c <= int64(p.limit)
		v.exact, v.bound = float64(f.admitted+c), float64(p.limit)
		if n > 0 && !limited {
			f.admitted += n
		}
	default:
		sl := algo.SlidingLog{Limit: int64(p.limit), Window: time.Duration(w)}
		prior := sl.Count(&st.admitted, t)
		fit = prior+c <= int64(p.limit)
		v.prior, v.exact, v.bound = float64(prior), float64(prior+c), float64(p.limit)
		if n > 0 && !limited {
			sl.Add(&st.admitted, t, n)
		}
	}
	switch {
	case !limited:
		v.wrongAllowed = !fit
	case p.flags&(fBlock|fCache) == fBlock|fCache: // inside an intended block
	default:
		v.wrongLimited = fit
	}
	return v
}

// addLateCounted logs the units a late event of a counting rule counted
// in its key's reference at t, without judging it.
func addLateCounted(st *keyState, kind uint8, p *pending, t, w int64) {
	n := int64(p.counted)
	if n == 0 || p.flags&fLimited != 0 {
		return
	}
	switch kind {
	case refBucket:
		lb := algo.LeakyBucket{Rate: int64(p.limit), Per: time.Duration(w), Capacity: burstOf(p)}
		st.bucket[0].add(lb, t, n)
	case refFixed:
		st.fixed.roll(algo.FixedWindow{Limit: int64(p.limit), Window: time.Duration(w)}, t)
		st.fixed.admitted += n
	default:
		sl := algo.SlidingLog{Limit: int64(p.limit), Window: time.Duration(w)}
		sl.Add(&st.admitted, t, n)
	}
}
