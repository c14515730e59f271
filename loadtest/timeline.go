package loadtest

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// A Timeline is a replay over time: requests per time step by outcome,
// latency percentiles per step, and per rule the admitted count of its
// worst keys in every trailing window. ReplayConfig.Timeline records one
// during a replay; ReadResults rebuilds one from a results file. Its
// memory is bounded: at most MaxTimelineSteps steps (the step doubles when
// a replay outlasts them) and MaxTimelineAdmits admitted requests kept for
// the keys' windows (past that, Truncated counts those not kept).
type Timeline struct {
	Start       time.Time      `json:"start"`        // the replay's start: offset 0
	StepSeconds float64        `json:"step_seconds"` // width of a step
	Steps       []Step         `json:"steps"`
	Rules       []RuleTimeline `json:"rules"`
	// Truncated counts the admitted requests whose keys' windows were not
	// kept (more than MaxTimelineAdmits).
	Truncated int64 `json:"truncated,omitempty"`
}

// Step is one time step of a Timeline, by the requests' scheduled times.
type Step struct {
	// Allowed are the 2xx answers, Limited the 429s, OtherStatus the other
	// statuses, Errors the transport errors, NotSent those due while
	// MaxOutstanding were outstanding.
	Allowed, Limited, OtherStatus, Errors, NotSent int64
	// Latency of the answered requests due in the step (from the scheduled
	// time), in milliseconds; 0 when none.
	P50Millis, P99Millis, MaxMillis float64
}

// RuleTimeline is one rule's decisions, and its worst keys.
type RuleTimeline struct {
	Rule          string `json:"rule"`
	Limit         int64  `json:"limit"`          // from the responses' quota fields; -1 unknown
	WindowSeconds int64  `json:"window_seconds"` // likewise
	Allowed       int64  `json:"allowed"`
	Limited       int64  `json:"limited"`
	// Keys are the keys (client addresses: the replay knows no other key)
	// whose admitted count in a trailing window went highest, highest
	// first, at most TimelineKeys.
	Keys []KeyTimeline `json:"keys"`
}

// KeyTimeline is one key's admitted count in the trailing window (the
// requests the rule allowed, by their send times, within the window ending
// at each instant) at times T (seconds since the start): a step function,
// sampled at its changes, at most timelinePoints points (each the highest
// count of its stretch when there are more changes).
type KeyTimeline struct {
	Key         string    `json:"key"`
	Admitted    int64     `json:"admitted"`
	MaxInWindow int64     `json:"max_in_window"`
	T           []float64 `json:"t"`
	Count       []float64 `json:"count"`
}

// Bounds of a Timeline.
const (
	MaxTimelineSteps  = 600
	MaxTimelineAdmits = 4_000_000 // 32 MB of send times
	TimelineKeys      = 5
	timelinePoints    = 1000
	maxTimelineRules  = 64
)

// TimelineRecorder collects a Timeline from Results; it is safe for
// concurrent use.
type TimelineRecorder struct {
	mu        sync.Mutex
	start     int64 // Unix ns
	step      int64 // ns
	steps     []tlStep
	rules     map[string]*tlRule
	admits    int
	truncated int64
}

type tlStep struct {
	s   Step
	lat *hdrhistogram.Histogram // µs, two significant digits
}

type tlRule struct {
	rc     RuleTimeline
	admits map[netip.Addr][]int64 // send times, Unix ns
}

// NewTimelineRecorder returns a recorder of a replay started at start
// (offset 0), with steps of one second.
func NewTimelineRecorder(start time.Time) *TimelineRecorder {
	return &TimelineRecorder{start: start.UnixNano(), step: int64(time.Second), rules: map[string]*tlRule{}}
}

// begin sets the start of a recorder that has recorded nothing.
func (t *TimelineRecorder) begin(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = start.UnixNano()
}

// Add records one request's outcome.
func (t *TimelineRecorder) Add(r *Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.stepOf(r.Scheduled.UnixNano())
	st := &t.steps[i]
	admitted := false
	switch {
	case r.NotSent:
		st.s.NotSent++
	case r.Err != nil:
		st.s.Errors++
	case r.Status >= 200 && r.Status < 300:
		st.s.Allowed++
		admitted = true
	case r.Status == 429:
		st.s.Limited++
	default:
		st.s.OtherStatus++
	}
	if !r.NotSent && r.Err == nil {
		if st.lat == nil {
			st.lat = hdrhistogram.New(1, histMaxUsec, 2)
		}
		st.lat.RecordValue(clampUsec(r.Done.Sub(r.Scheduled)))
	}
	if r.NotSent || r.Err != nil || !admitted && r.Status != 429 {
		return
	}
	rl := t.rules[r.Rule]
	if rl == nil {
		if len(t.rules) >= maxTimelineRules {
			return
		}
		rl = &tlRule{rc: RuleTimeline{Rule: r.Rule, Limit: -1, WindowSeconds: -1}, admits: map[netip.Addr][]int64{}}
		t.rules[r.Rule] = rl
	}
	if r.Quota.Limit >= 0 {
		rl.rc.Limit = r.Quota.Limit
	}
	if r.Quota.WindowSeconds > 0 {
		rl.rc.WindowSeconds = r.Quota.WindowSeconds
	}
	if !admitted {
		rl.rc.Limited++
		return
	}
	rl.rc.Allowed++
	if r.Rule == "" {
		return
	}
	if t.admits >= MaxTimelineAdmits {
		t.truncated++
		return
	}
	t.admits++
	rl.admits[r.Client] = append(rl.admits[r.Client], r.Sent.UnixNano())
}

// stepOf returns the index of the step of Unix time ns, folding the steps
// into steps twice as wide while there would be too many.
func (t *TimelineRecorder) stepOf(ns int64) int {
	off := max(0, ns-t.start)
	for off/t.step >= MaxTimelineSteps {
		t.fold()
	}
	i := int(off / t.step)
	for len(t.steps) <= i {
		t.steps = append(t.steps, tlStep{})
	}
	return i
}

// fold merges each pair of steps into one.
func (t *TimelineRecorder) fold() {
	n := (len(t.steps) + 1) / 2
	for i := 0; i < n; i++ {
		a := t.steps[2*i]
		if 2*i+1 < len(t.steps) {
			b := t.steps[2*i+1]
			a.s.Allowed += b.s.Allowed
			a.s.Limited += b.s.Limited
			a.s.OtherStatus += b.s.OtherStatus
			a.s.Errors += b.s.Errors
			a.s.NotSent += b.s.NotSent
			switch {
			case a.lat == nil:
				a.lat = b.lat
			case b.lat != nil:
				a.lat.Merge(b.lat)
			}
		}
		t.steps[i] = a
	}
	clear(t.steps[n:])
	t.steps = t.steps[:n]
	t.step *= 2
}

// Timeline returns what was recorded.
func (t *TimelineRecorder) Timeline() *Timeline {
	t.mu.Lock()
	defer t.mu.Unlock()
	tl := &Timeline{Start: time.Unix(0, t.start), StepSeconds: float64(t.step) / 1e9, Truncated: t.truncated}
	for _, st := range t.steps {
		s := st.s
		if st.lat != nil && st.lat.TotalCount() > 0 {
			s.P50Millis = float64(st.lat.ValueAtQuantile(50)) / 1000
			s.P99Millis = float64(st.lat.ValueAtQuantile(99)) / 1000
			s.MaxMillis = float64(st.lat.Max()) / 1000
		}
		tl.Steps = append(tl.Steps, s)
	}
	for _, rl := range t.rules {
		rc := rl.rc
		rc.Keys = worstKeys(rl.admits, rc.WindowSeconds, t.start)
		tl.Rules = append(tl.Rules, rc)
	}
	slices.SortFunc(tl.Rules, func(a, b RuleTimeline) int { return cmp.Compare(a.Rule, b.Rule) })
	return tl
}

// worstKeys returns the TimelineKeys keys whose admitted count in a
// trailing window of w seconds went highest, with their counts over time.
func worstKeys(admits map[netip.Addr][]int64, w, start int64) []KeyTimeline {
	if w <= 0 {
		return nil
	}
	win := w * int64(time.Second)
	type cand struct {
		key      netip.Addr
		max, all int64
	}
	var cands []cand
	for k, ts := range admits {
		slices.Sort(ts)
		var m int64
		j := 0
		for i, at := range ts {
			for ts[j] <= at-win {
				j++
			}
			m = max(m, int64(i-j+1))
		}
		cands = append(cands, cand{k, m, int64(len(ts))})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(b.max, a.max); c != 0 {
			return c
		}
		if c := cmp.Compare(b.all, a.all); c != 0 {
			return c
		}
		return a.key.Compare(b.key)
	})
	var out []KeyTimeline
	for _, c := range cands[:min(len(cands), TimelineKeys)] {
		kt := KeyTimeline{Key: c.key.String(), Admitted: c.all, MaxInWindow: c.max}
		kt.T, kt.Count = trailingCounts(admits[c.key], win, start)
		out = append(out, kt)
	}
	return out
}

// trailingCounts returns the count of ts (sorted) within the trailing
// window of win ns at each change (each admission and each expiry), in
// seconds since start: at most timelinePoints points, each the highest
// count of its stretch when there are more changes.
func trailingCounts(ts []int64, win, start int64) (tt, cnt []float64) {
	type pt struct {
		at int64
		n  int64
	}
	pts := []pt{{ts[0] - 1, 0}}
	i, j := 0, 0 // next admission, next expiry (ts[j]+win)
	var n int64
	for i < len(ts) || j < len(ts) {
		if i < len(ts) && ts[i] < ts[j]+win {
			n++
			pts = append(pts, pt{ts[i], n})
			i++
		} else {
			n--
			pts = append(pts, pt{ts[j] + win, n})
			j++
		}
	}
	if len(pts) > timelinePoints {
		first, last := pts[0].at, pts[len(pts)-1].at
		width := (last-first)/int64(timelinePoints-1) + 1
		var out []pt
		for _, p := range pts {
			b := first + (p.at-first)/width*width
			if len(out) > 0 && out[len(out)-1].at == b {
				out[len(out)-1].n = max(out[len(out)-1].n, p.n)
				continue
			}
			out = append(out, pt{b, p.n})
		}
		pts = out
	}
	for _, p := range pts {
		tt = append(tt, float64(p.at-start)/1e9)
		cnt = append(cnt, float64(p.n))
	}
	return tt, cnt
}
