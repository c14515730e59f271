package algo

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func at(d time.Duration) int64 { return int64(d) }

func TestSlidingWindowEstimateWorkedExamples(t *testing.T) {
	minute := SlidingWindow{Limit: 100, Window: time.Minute}
	tests := []struct {
		name       string
		sw         SlidingWindow
		elapsed    time.Duration
		prev, curr uint64
		want       float64
	}{
		// 20 % through the minute, 80 before and 15 now: 80 × 0.8 + 15.
		{"80 then 15, at 20%", minute, 12 * time.Second, 80, 15, 79},
		// 75 % through the minute: 80 × 0.25 + 15.
		{"80 then 15, at 75%", minute, 45 * time.Second, 80, 15, 35},
		// Cloudflare's blog: 42 × 0.75 + 18 = 49.5, 15 s into the minute.
		{"cloudflare", minute, 15 * time.Second, 42, 18, 49.5},
		{"window start", minute, 0, 80, 0, 80},
	}
	base := at(1000 * time.Hour) // a multiple of a minute
	for _, tt := range tests {
		got := tt.sw.Decide(base+at(tt.elapsed), tt.prev, tt.curr, 1).Estimate
		if math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: Decide's Estimate = %v, want %v", tt.name, got, tt.want)
		}
	}
	v := minute.Decide(base+at(12*time.Second), 80, 15, 1)
	if !v.Allowed || v.Remaining != 20 {
		t.Errorf("Decide at 79 of 100: got allowed=%v remaining=%d, want true 20", v.Allowed, v.Remaining)
	}
}

func TestSlidingWindowReleaseIsExact(t *testing.T) {
	sw := SlidingWindow{Limit: 100, Window: time.Minute}
	base := at(1000 * time.Hour)
	tests := []struct {
		name       string
		elapsed    time.Duration
		prev, curr uint64
		cost       uint64
		want       time.Duration // from base
	}{
		// 80×(1−f)+30 ≤ 99 ⇔ f ≥ 11/80 ⇒ 8.25 s into the window.
		{"prev decays this window", time.Second, 80, 30, 1, 8250 * time.Millisecond},
		// curr alone is over: next window, 120×(1−f) ≤ 99 ⇔ f ≥ 21/120 ⇒ 10.5 s.
		{"current count carries over", 30 * time.Second, 0, 120, 1, time.Minute + 10500*time.Millisecond},
		{"already under", 59 * time.Second, 100, 10, 1, 59 * time.Second},
		{"cost of 10", time.Second, 100, 50, 10, 60 * time.Second * 60 / 100}, // 100(1−f)+50 ≤ 90 ⇔ f ≥ .6
	}
	for _, tt := range tests {
		now := base + at(tt.elapsed)
		got := sw.Release(now, tt.prev, tt.curr, tt.cost)
		if got != base+at(tt.want) {
			t.Errorf("%s: Release = %v, want %v", tt.name, time.Duration(got-base), tt.want)
		}
		// At the release time a request of this cost fits; 1 ns before, it did not.
		if !decideLater(sw, now, tt.prev, tt.curr, got, tt.cost) {
			t.Errorf("%s: refused at the release time", tt.name)
		}
		if got > now && decideLater(sw, now, tt.prev, tt.curr, got-1, tt.cost) {
			t.Errorf("%s: admitted 1ns before the release time", tt.name)
		}
	}
	if got := sw.Release(base, 0, 0, 101); got != 0 {
		t.Errorf("Release with cost over the limit = %d, want 0", got)
	}
}

// decideLater decides at t ≥ now for a key with counts prev, curr at now
// that sends nothing more: in the next window curr has become prev.
func decideLater(sw SlidingWindow, now int64, prev, curr uint64, t int64, cost uint64) bool {
	switch WindowStart(t, int64(sw.Window)) - WindowStart(now, int64(sw.Window)) {
	case 0:
		return sw.Decide(t, prev, curr, cost).Allowed
	case int64(sw.Window):
		return sw.Decide(t, curr, 0, cost).Allowed
	}
	return sw.Decide(t, 0, 0, cost).Allowed
}

func TestSlidingWindowReleaseProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		sw := SlidingWindow{Limit: 1 + rng.Uint64N(1000), Window: time.Duration(1+rng.Int64N(3600)) * time.Millisecond * 7}
		now := rng.Int64N(1 << 50)
		prev, curr, cost := rng.Uint64N(2*sw.Limit+1), rng.Uint64N(2*sw.Limit+1), 1+rng.Uint64N(3)
		got := sw.Release(now, prev, curr, cost)
		if cost > sw.Limit {
			if got != 0 {
				t.Fatalf("%+v Release(%d, %d, %d, %d) = %d, want 0", sw, now, prev, curr, cost, got)
			}
			continue
		}
		if got < now || !decideLater(sw, now, prev, curr, got, cost) || got > now && decideLater(sw, now, prev, curr, got-1, cost) {
			t.Fatalf("%+v Release(%d, %d, %d, %d) = %d: not the first admitting instant", sw, now, prev, curr, cost, got)
		}
	}
}
