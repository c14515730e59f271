package window

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// onsetWorst runs one heavy client through one edge: it starts at the given
// phase of the window grid and sends every 20 ms (five times its limit of
// 100 per 10 s) for three windows. As the edge does, a refused key is
// answered from a block cache until its ReleaseAt, and the edge flushes
// every 5 ms. It returns the largest number of admitted requests in any
// trailing window, judged exactly by a SlidingLog, over the limit.
func onsetWorst(t *testing.T, mode policy.Mode, phase time.Duration, hp histParams) float64 {
	t.Helper()
	const limit = 100
	w := 10 * time.Second
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{hist: hp})
	pol := &Policy{Limit: limit, Window: w, Mode: mode}
	key := uint64(0x5eed)
	judge := algo.SlidingLog{Limit: limit, Window: w}
	var log algo.SlidingLogState
	ctx := context.Background()
	begin := t0.Add(phase).UnixNano()
	var release, lastFlush int64
	worst := int64(0)
	for tt := begin; tt < begin+int64(3*w); tt += int64(20 * time.Millisecond) {
		clock.t.Store(tt)
		if tt-lastFlush >= int64(5*time.Millisecond) {
			l.Flush(ctx, time.Unix(0, tt))
			lastFlush = tt
		}
		if tt < release {
			continue // refused from the block cache
		}
		d := l.Decide(ctx, time.Unix(0, tt), pol, key, limit, 1)
		if !d.Allowed {
			if d.ReleaseAt <= tt {
				t.Fatalf("refused at %v with ReleaseAt %v", time.Duration(tt-begin), time.Duration(d.ReleaseAt-begin))
			}
			release = d.ReleaseAt
			continue
		}
		judge.Add(&log, tt, 1)
		worst = max(worst, judge.Count(&log, tt))
	}
	return float64(worst) / limit
}

// TestMidWindowOnset: a heavy client that starts mid-window (every replay,
// every attack onset) sends its whole limit late in its first window. The
// two-counter estimate takes that window's requests as spread evenly over
// it, so in the next window it lets half a limit more through while they
// are all still in the trailing window: 1.5 × the limit at phase ½. With
// the window's shape recorded (hist.go), the trailing window holds at most
// 1.10 × the limit, in async and in sync mode.
func TestMidWindowOnset(t *testing.T) {
	for _, mode := range []policy.Mode{policy.Async, policy.Sync} {
		for _, ph := range []time.Duration{5 * time.Second, 2500 * time.Millisecond, 7500 * time.Millisecond} {
			t.Run(fmt.Sprintf("%v/phase=%v", mode, ph), func(t *testing.T) {
				got := onsetWorst(t, mode, ph, histParams{})
				t.Logf("worst trailing window: %.2f × the limit", got)
				if got > 1.10 {
					t.Errorf("worst trailing window %.2f × the limit, want ≤ 1.10", got)
				}
			})
		}
	}
	// The scenario discriminates: without histograms (the side table has
	// no room, so every key keeps the uniform estimate) it fails.
	for _, mode := range []policy.Mode{policy.Async, policy.Sync} {
		if got := onsetWorst(t, mode, 5*time.Second, histParams{keysDiv: -1}); got <= 1.10 {
			t.Errorf("%v, uniform estimate: worst trailing window %.2f × the limit; the test no longer tells the estimators apart", mode, got)
		} else {
			t.Logf("%v, uniform estimate: worst trailing window %.2f × the limit", mode, got)
		}
	}
}
