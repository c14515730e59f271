package window

import (
	"math"
	"math/bits"
	"time"
)

// SlidingWindow is the sliding-window counter: at most Limit units per
// trailing Window, estimated from the counts of the previous and the current
// fixed window as
//
//	estimate = prev × (Window − elapsed)/Window + curr
//
// where elapsed is the time since the current window started. Windows start
// at multiples of Window since the Unix epoch. The zero value is not useful:
// Window must be positive. A SlidingWindow is an immutable value, safe for
// concurrent use.
type SlidingWindow struct {
	Limit  uint64
	Window time.Duration
}

// Conformance is the outcome of one decision by a window algorithm.
type Conformance struct {
	Allowed   bool
	Estimate  float64 // units in the trailing window before this request
	Remaining uint64  // units still admissible after this decision
	// ReleaseAt is, for a refused request, the first instant (Unix ns) at
	// which a request of the same cost would be admitted if the key sends
	// nothing more; 0 when it never would (cost above the limit).
	ReleaseAt int64
	// ResetAt is the instant (Unix ns) at which the key's current count
	// stops weighing fully: the end of the current window.
	ResetAt int64
}

// windowStart returns the start (Unix ns) of the window of w ns that
// contains now (Unix ns): windows start at multiples of w since the epoch.
func windowStart(now, w int64) int64 {
	r := now % w
	if r < 0 {
		r += w
	}
	return now - r
}

// Decide decides whether cost more units may pass at now, given the counts
// of the previous and the current window. It admits iff
// estimate + cost ≤ Limit, compared exactly in integers; the Conformance's
// float Estimate, the estimate before this request, is for reporting. It
// does not change anything: the caller counts.
func (s SlidingWindow) Decide(now int64, prev, curr, cost uint64) Conformance {
	var v Conformance
	s.decide(&v, now, prev, curr, cost, s.even())
	return v
}

// spans are the parts of the previous and of the current window, in ns up
// to their ends, over which their units are spread when no shape places
// them: the Window, or less for a key whose units there began late (the
// Limiter's entry.spans). The current window's is the one it will have
// once it is the previous one, for a release past it.
type spans struct{ prev, next int64 }

// clampSpan is span within (0, w].
func clampSpan(span, w int64) int64 { return min(max(span, 1), w) }

// even is the spans of units spread over the whole windows.
func (s SlidingWindow) even() spans { return spans{int64(s.Window), int64(s.Window)} }

// decide is Decide writing its verdict into v, field by field: the
// Limiter decides into the Decision it returns. The previous window's
// units are spread evenly over its last sp.prev ns, so that at elapsed ns
// into the current window they weigh min(span, Window − elapsed)/span.
func (s SlidingWindow) decide(v *Conformance, now int64, prev, curr, cost uint64, sp spans) {
	w := int64(s.Window)
	start := windowStart(now, w)
	span := clampSpan(sp.prev, w)
	left := uint64(min(w-(now-start), span)) // the previous window's weight × span
	est := float64(prev)*float64(left)/float64(span) + float64(curr)
	v.Estimate, v.ResetAt = est, start+w
	// prev×left + (curr+cost)×span ≤ Limit×span
	if le128(add128(mul128(prev, left), mul128(curr+cost, uint64(span))), mul128(s.Limit, uint64(span))) {
		v.Allowed, v.Remaining, v.ReleaseAt = true, 0, 0
		if r := float64(s.Limit) - est - float64(cost); r > 0 {
			v.Remaining = uint64(r)
		}
		return
	}
	v.Allowed, v.Remaining = false, 0
	v.ReleaseAt = s.release(now, prev, curr, cost, sp)
}

// Release returns the first instant (Unix ns, not before now) at which a
// request of cost units would be admitted if the key sends nothing more,
// given the counts of the previous and the current window at now; 0 when it
// never would because cost exceeds the limit. Within the current window the
// estimate falls as the previous window's weight decays; in the next window
// the current count becomes the previous one and decays in turn. The result
// is exact to the nanosecond: Decide admits at it and refuses 1 ns before.
func (s SlidingWindow) Release(now int64, prev, curr, cost uint64) int64 {
	return s.release(now, prev, curr, cost, s.even())
}

// release is Release with the windows' units spread over their spans
// (decide).
func (s SlidingWindow) release(now int64, prev, curr, cost uint64, sp spans) int64 {
	if cost > s.Limit {
		return 0
	}
	w := int64(s.Window)
	start := windowStart(now, w)
	room := s.Limit - cost // the estimate must fall to room
	if curr <= room {
		if prev == 0 {
			return now
		}
		// prev×min(span, W−e) ≤ (room−curr)×span  ⇔  e ≥ W − ⌊(room−curr)×span / prev⌋
		span := clampSpan(sp.prev, w)
		return max(now, start+w-int64(min(div128(mul128(room-curr, uint64(span)), prev), uint64(span))))
	}
	// Next window: curr×min(span, W−e) ≤ room×span  ⇔  e ≥ W − ⌊room×span / curr⌋
	span := clampSpan(sp.next, w)
	return start + 2*w - int64(div128(mul128(room, uint64(span)), curr))
}

// decideShaped is decide for a key whose previous window's units are placed
// by their recorded shape ps (hist.go) instead of spread evenly over it:
// the previous window weighs prev × (its shape's mass after now − Window) /
// (its mass). It admits iff that + curr + cost ≤ Limit, exactly in
// integers. A refusal's ReleaseAt is releaseShaped's, which uses cs, the
// shape of the current window, for an instant in the next one. A zero
// shape is the uniform assumption: with both zero this is Decide.
func (s SlidingWindow) decideShaped(v *Conformance, now int64, prev, curr, cost uint64, sp spans, ps, cs *shape) {
	if ps.h == nil {
		s.decide(v, now, prev, curr, cost, sp)
		if !v.Allowed && cs.h != nil {
			v.ReleaseAt = s.releaseShaped(now, prev, curr, cost, sp, ps, cs)
		}
		return
	}
	w := int64(s.Window)
	start := windowStart(now, w)
	u := now - w
	a, n, f, l := ps.after(u)
	*v = Conformance{Estimate: ps.prevPart(prev, a, n, f, l, u) + float64(curr), ResetAt: start + w}
	if cost <= s.Limit && curr <= s.Limit-cost {
		if prev == 0 || ps.fits(prev, s.Limit-cost-curr, a, n, f, l, u) {
			v.Allowed = true
			if r := float64(s.Limit) - v.Estimate - float64(cost); r > 0 {
				v.Remaining = uint64(r)
			}
			return
		}
	}
	v.ReleaseAt = s.releaseShaped(now, prev, curr, cost, sp, ps, cs)
}

// releaseShaped is Release under decideShaped's estimate: the first instant
// (not before now) at which decideShaped would admit cost units if the key
// sent nothing more, 0 if never. In this window the previous one's shape
// is walked until enough of it has left the trailing window; past it, the
// current window becomes the previous one, with its shape cs when it will
// have one (zero: spread over sp.next). Without a shape ps, the previous
// window's units are spread over sp.prev, as decide spreads them.
func (s SlidingWindow) releaseShaped(now int64, prev, curr, cost uint64, sp spans, ps, cs *shape) int64 {
	if cost > s.Limit {
		return 0
	}
	w := int64(s.Window)
	start := windowStart(now, w)
	room := s.Limit - cost
	if curr <= room {
		if ps.h == nil {
			return s.release(now, prev, curr, cost, sp)
		}
		if prev == 0 {
			return now
		}
		return ps.first(now-w, prev, room-curr) + w
	}
	if cs.h == nil {
		return s.release(now, prev, curr, cost, sp)
	}
	return cs.first(start, curr, room) + w
}

// u128 is an unsigned 128-bit integer, for exact window arithmetic: counts
// up to 2^32 times windows up to 2^55 ns do not fit in 64 bits.
type u128 struct{ hi, lo uint64 }

func mul128(a, b uint64) u128 { hi, lo := bits.Mul64(a, b); return u128{hi, lo} }

func add128(a, b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	return u128{a.hi + b.hi + c, lo}
}

func le128(a, b u128) bool { return a.hi < b.hi || a.hi == b.hi && a.lo <= b.lo }

// div128 returns ⌊a/d⌋ saturated to 64 bits.
func div128(a u128, d uint64) uint64 {
	if a.hi >= d {
		return math.MaxUint64
	}
	q, _ := bits.Div64(a.hi, a.lo, d)
	return q
}

// decideFixed is decide for the fixed-window algorithm run over the same
// counters: the estimate is the current window's count alone, and a refused
// key is released when the window ends.
func (s SlidingWindow) decideFixed(v *Conformance, now int64, curr, cost uint64) {
	w := int64(s.Window)
	start := windowStart(now, w)
	*v = Conformance{Estimate: float64(curr), ResetAt: start + w}
	if curr+cost <= s.Limit {
		v.Allowed = true
		v.Remaining = s.Limit - curr - cost
		return
	}
	if cost <= s.Limit {
		v.ReleaseAt = start + w
	}
}
