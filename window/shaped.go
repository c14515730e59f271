package window

import (
	"github.com/poplimit/poplimit/algo"
)

// The sliding window's estimate under the recorded shapes of a hot key's
// windows (hist.go): the algorithm of package algo with the previous
// window's units placed where this edge saw them arrive.

// decideShaped is SlidingWindow.DecideSpans for a key whose previous window's units are placed
// by their recorded shape ps (hist.go) instead of spread evenly over it:
// the previous window weighs prev × (its shape's mass after now − Window) /
// (its mass). It admits iff that + curr + cost ≤ Limit, exactly in
// integers. A refusal's ReleaseAt is releaseShaped's, which uses cs, the
// shape of the current window, for an instant in the next one. A zero
// shape is the uniform assumption: with both zero this is DecideSpans.
func decideShaped(s algo.SlidingWindow, v *algo.Conformance, now int64, prev, curr, cost uint64, sp algo.Spans, ps, cs *shape) {
	if ps.h == nil {
		s.DecideSpans(v, now, prev, curr, cost, sp)
		if !v.Allowed && cs.h != nil {
			v.ReleaseAt = releaseShaped(s, now, prev, curr, cost, sp, ps, cs)
		}
		return
	}
	w := int64(s.Window)
	start := algo.WindowStart(now, w)
	u := now - w
	a, n, f, l := ps.after(u)
	*v = algo.Conformance{Estimate: ps.prevPart(prev, a, n, f, l, u) + float64(curr), ResetAt: start + w}
	if cost <= s.Limit && curr <= s.Limit-cost {
		if prev == 0 || ps.fits(prev, s.Limit-cost-curr, a, n, f, l, u) {
			v.Allowed = true
			if r := float64(s.Limit) - v.Estimate - float64(cost); r > 0 {
				v.Remaining = uint64(r)
			}
			return
		}
	}
	v.ReleaseAt = releaseShaped(s, now, prev, curr, cost, sp, ps, cs)
}

// releaseShaped is Release under decideShaped's estimate: the first instant
// (not before now) at which decideShaped would admit cost units if the key
// sent nothing more, 0 if never. In this window the previous one's shape
// is walked until enough of it has left the trailing window; past it, the
// current window becomes the previous one, with its shape cs when it will
// have one (zero: spread over sp.Next). Without a shape ps, the previous
// window's units are spread over sp.Prev, as DecideSpans spreads them.
func releaseShaped(s algo.SlidingWindow, now int64, prev, curr, cost uint64, sp algo.Spans, ps, cs *shape) int64 {
	if cost > s.Limit {
		return 0
	}
	w := int64(s.Window)
	start := algo.WindowStart(now, w)
	room := s.Limit - cost
	if curr <= room {
		if ps.h == nil {
			return s.ReleaseSpans(now, prev, curr, cost, sp)
		}
		if prev == 0 {
			return now
		}
		return ps.first(now-w, prev, room-curr) + w
	}
	if cs.h == nil {
		return s.ReleaseSpans(now, prev, curr, cost, sp)
	}
	return cs.first(start, curr, room) + w
}
