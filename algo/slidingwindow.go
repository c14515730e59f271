package algo

import (
	"github.com/poplimit/poplimit/internal/wide"
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

// WindowStart returns the start (Unix ns) of the window of w ns that
// contains now (Unix ns): windows start at multiples of w since the epoch.
func WindowStart(now, w int64) int64 {
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
	s.DecideSpans(&v, now, prev, curr, cost, s.Even())
	return v
}

// Spans are the parts of the previous and of the current window, in ns up
// to their ends, over which their units are spread when no shape places
// them: the Window, or less for a key whose units there began late (the
// Limiter's entry.spans). The current window's is the one it will have
// once it is the previous one, for a release past it.
type Spans struct{ Prev, Next int64 }

// clampSpan is span within (0, w].
func clampSpan(span, w int64) int64 { return min(max(span, 1), w) }

// Even is the Spans of units spread over the whole windows.
func (s SlidingWindow) Even() Spans { return Spans{int64(s.Window), int64(s.Window)} }

// DecideSpans is Decide writing its verdict into v, field by field: the
// Limiter decides into the Decision it returns. The previous window's
// units are spread evenly over its last sp.Prev ns, so that at elapsed ns
// into the current window they weigh min(span, Window − elapsed)/span.
func (s SlidingWindow) DecideSpans(v *Conformance, now int64, prev, curr, cost uint64, sp Spans) {
	w := int64(s.Window)
	start := WindowStart(now, w)
	span := clampSpan(sp.Prev, w)
	left := uint64(min(w-(now-start), span)) // the previous window's weight × span
	est := float64(prev)*float64(left)/float64(span) + float64(curr)
	v.Estimate, v.ResetAt = est, start+w
	// prev×left + (curr+cost)×span ≤ Limit×span
	if wide.LE(wide.Add(wide.Mul(prev, left), wide.Mul(curr+cost, uint64(span))), wide.Mul(s.Limit, uint64(span))) {
		v.Allowed, v.Remaining, v.ReleaseAt = true, 0, 0
		if r := float64(s.Limit) - est - float64(cost); r > 0 {
			v.Remaining = uint64(r)
		}
		return
	}
	v.Allowed, v.Remaining = false, 0
	v.ReleaseAt = s.ReleaseSpans(now, prev, curr, cost, sp)
}

// Release returns the first instant (Unix ns, not before now) at which a
// request of cost units would be admitted if the key sends nothing more,
// given the counts of the previous and the current window at now; 0 when it
// never would because cost exceeds the limit. Within the current window the
// estimate falls as the previous window's weight decays; in the next window
// the current count becomes the previous one and decays in turn. The result
// is exact to the nanosecond: Decide admits at it and refuses 1 ns before.
func (s SlidingWindow) Release(now int64, prev, curr, cost uint64) int64 {
	return s.ReleaseSpans(now, prev, curr, cost, s.Even())
}

// ReleaseSpans is Release with the windows' units spread over their spans
// (DecideSpans).
func (s SlidingWindow) ReleaseSpans(now int64, prev, curr, cost uint64, sp Spans) int64 {
	if cost > s.Limit {
		return 0
	}
	w := int64(s.Window)
	start := WindowStart(now, w)
	room := s.Limit - cost // the estimate must fall to room
	if curr <= room {
		if prev == 0 {
			return now
		}
		// prev×min(span, W−e) ≤ (room−curr)×span  ⇔  e ≥ W − ⌊(room−curr)×span / prev⌋
		span := clampSpan(sp.Prev, w)
		return max(now, start+w-int64(min(wide.Div(wide.Mul(room-curr, uint64(span)), prev), uint64(span))))
	}
	// Next window: curr×min(span, W−e) ≤ room×span  ⇔  e ≥ W − ⌊room×span / curr⌋
	span := clampSpan(sp.Next, w)
	return start + 2*w - int64(wide.Div(wide.Mul(room, uint64(span)), curr))
}

// DecideFixed is DecideSpans for the fixed-window algorithm run over the same
// counters: the estimate is the current window's count alone, and a refused
// key is released when the window ends.
func (s SlidingWindow) DecideFixed(v *Conformance, now int64, curr, cost uint64) {
	w := int64(s.Window)
	start := WindowStart(now, w)
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
