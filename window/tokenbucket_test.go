package window_test

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/window"
)

// The token_bucket rule runs as a LeakyBucket meter (TokenBucketMeter);
// these tests hold that meter to the token bucket's textbook behaviour and
// to an exact rational model of it.

// TestTokenBucketRefillTable works through a table for r = 10/s, B = 20,
// row by row: tokens before the refill, the refill, tokens after the
// requests, and how many were allowed and rejected.
func TestTokenBucketRefillTable(t *testing.T) {
	tb := window.TokenBucketMeter(algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20})
	rows := []struct {
		time                              time.Duration
		requests                          int
		wantBefore, wantRefill, wantAfter int64
		wantAllowed, wantRejected         int
	}{
		{0, 1, 20, 0, 19, 1, 0},                       // 0.0 s: 20 +0 → 19, allow
		{100 * time.Millisecond, 1, 19, 1, 19, 1, 0},  // 0.1 s: 19 +1 → 19, allow
		{100 * time.Millisecond, 25, 19, 0, 0, 19, 6}, // burst of 25 at 0.1 s: 19 allowed, 6 rejected
		{2100 * time.Millisecond, 1, 0, 20, 19, 1, 0}, // 2.1 s: 0 +20 (capped) → 19, allow
		{10 * time.Second, 1, 19, 1, 19, 1, 0},        // 10 s: 7.9 s of refill is capped at +1
	}
	var st algo.LeakyBucketState // the zero value is a full bucket of tokens, even at t = 0
	last := int64(0)             // the previous row's instant
	for _, row := range rows {
		now := int64(row.time)
		before := tb.Remaining(st, last)
		refill := tb.Remaining(st, now) - before
		last = now
		allowed, rejected := 0, 0
		for range row.requests {
			if ok, _, _ := tb.Allow(&st, now, 1); ok {
				allowed++
			} else {
				rejected++
			}
		}
		after := tb.Remaining(st, now)
		if before != row.wantBefore || refill != row.wantRefill || after != row.wantAfter ||
			allowed != row.wantAllowed || rejected != row.wantRejected {
			t.Errorf("t=%v, %d requests: before %d, refill +%d, after %d, allowed %d, rejected %d; want %d, +%d, %d, %d, %d",
				row.time, row.requests, before, refill, after, allowed, rejected,
				row.wantBefore, row.wantRefill, row.wantAfter, row.wantAllowed, row.wantRejected)
		}
	}
}

func TestTokenBucketAllow(t *testing.T) {
	ms := int64(time.Millisecond)
	tests := []struct {
		name          string
		tb            algo.TokenBucket // run as TokenBucketMeter
		steps         [][2]int64       // {now, n}
		wantOK        bool             // of the last step
		wantRemaining int64
		wantRelease   int64
	}{
		{
			name:  "release after the 6 rejected of a burst of 25 is one token later",
			tb:    algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps: [][2]int64{{0, 1}, {100 * ms, 1}, {100 * ms, 19}, {100 * ms, 1}},
			// empty at 0.1 s; one token per 100 ms.
			wantOK: false, wantRemaining: 0, wantRelease: 200 * ms,
		},
		{
			name:   "release of n waits for n tokens",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{0, 20}, {0, 5}},
			wantOK: false, wantRemaining: 0, wantRelease: 500 * ms,
		},
		{
			name:   "a partial token counts toward the release",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{0, 20}, {150 * ms, 3}},
			wantOK: false, wantRemaining: 1, wantRelease: 300 * ms,
		},
		{
			name:   "n above Burst is never admitted",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{0, 21}},
			wantOK: false, wantRemaining: 20, wantRelease: math.MaxInt64,
		},
		{
			name:   "admitted with tokens left releases at once",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{5 * ms, 4}},
			wantOK: true, wantRemaining: 16, wantRelease: 5 * ms,
		},
		{
			name:   "n = 0 is a query",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{0, 20}, {50 * ms, 0}},
			wantOK: true, wantRemaining: 0, wantRelease: 50 * ms,
		},
		{
			name:   "a clock that steps back refills nothing",
			tb:     algo.TokenBucket{Rate: 10, Per: time.Second, Burst: 20},
			steps:  [][2]int64{{1000 * ms, 20}, {500 * ms, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 1100 * ms,
		},
		{
			name: "3 per second refills exactly 3 in a second, no drift",
			tb:   algo.TokenBucket{Rate: 3, Per: time.Second, Burst: 3},
			// 333,333,333⅓ ns per token: the first comes back at ⌈⅓ s⌉.
			steps:  [][2]int64{{0, 3}, {0, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 333_333_334,
		},
		{
			name:   "3 per second: all 3 back at exactly 1 s",
			tb:     algo.TokenBucket{Rate: 3, Per: time.Second, Burst: 3},
			steps:  [][2]int64{{0, 3}, {int64(time.Second), 3}},
			wantOK: true, wantRemaining: 0, wantRelease: 2 * int64(time.Second), // the next 3
		},
		{
			name:   "3 per second: one nanosecond short of 1 s is one token short",
			tb:     algo.TokenBucket{Rate: 3, Per: time.Second, Burst: 3},
			steps:  [][2]int64{{0, 3}, {int64(time.Second) - 1, 3}},
			wantOK: false, wantRemaining: 2, wantRelease: int64(time.Second),
		},
	}
	for _, tt := range tests {
		tb := window.TokenBucketMeter(tt.tb)
		var st algo.LeakyBucketState
		var ok bool
		var remaining, release int64
		for _, step := range tt.steps {
			ok, remaining, release = tb.Allow(&st, step[0], step[1])
		}
		if ok != tt.wantOK || remaining != tt.wantRemaining || release != tt.wantRelease {
			t.Errorf("%s: last Allow = (%v, %d, %d), want (%v, %d, %d)",
				tt.name, ok, remaining, release, tt.wantOK, tt.wantRemaining, tt.wantRelease)
		}
	}
}

// ratBucket is a token bucket in exact rational arithmetic: the
// reference the token_bucket rule's meter is checked against.
type ratBucket struct {
	tb     algo.TokenBucket
	tokens *big.Rat
	last   int64
}

func newRatBucket(tb algo.TokenBucket) *ratBucket {
	return &ratBucket{tb: tb, tokens: new(big.Rat).SetInt64(tb.Burst)}
}

func (m *ratBucket) allow(now, n int64) (ok bool, whole int64) {
	if now > m.last {
		refill := big.NewRat(m.tb.Rate*(now-m.last), int64(m.tb.Per)) // small in these tests
		m.tokens.Add(m.tokens, refill)
		if burst := new(big.Rat).SetInt64(m.tb.Burst); m.tokens.Cmp(burst) > 0 {
			m.tokens = burst
		}
		m.last = now
	}
	if m.tokens.Cmp(new(big.Rat).SetInt64(n)) >= 0 {
		m.tokens.Sub(m.tokens, new(big.Rat).SetInt64(n))
		ok = true
	}
	whole = new(big.Int).Quo(m.tokens.Num(), m.tokens.Denom()).Int64()
	return ok, whole
}

type algEvent struct{ at, n int64 }

// algGap returns a random gap between two arrivals: a mix of bursts at one
// instant, gaps around the mean interval and long idles.
func algGap(rng *rand.Rand, interval, burst int64) int64 {
	switch rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return rng.Int64N(interval + 1)
	case 2:
		return rng.Int64N(5*interval + 1)
	default:
		return rng.Int64N(2*burst*interval + 1)
	}
}

// TestTokenBucketProperties runs many seeded random sequences through the
// token_bucket rule's meter and checks, for each: every decision and
// remaining count equals the exact rational token bucket's; every release
// time is exact (Allow succeeds at it and fails a nanosecond earlier); and
// no interval [t_i, t_j] between two admitted requests admits more than
// B + r·(t_j − t_i).
func TestTokenBucketProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(0x5eed, 000))
	pers := []time.Duration{time.Second, 100 * time.Millisecond, 3 * time.Second, time.Minute, 7}
	for trial := range 400 {
		tb := algo.TokenBucket{
			Rate:  1 + rng.Int64N(50),
			Per:   pers[rng.IntN(len(pers))],
			Burst: 1 + rng.Int64N(30),
		}
		interval := max(1, int64(tb.Per)/tb.Rate)
		model := newRatBucket(tb)
		meter := window.TokenBucketMeter(tb)
		var st algo.LeakyBucketState
		var admitted []algEvent
		now := int64(0)
		for range 300 {
			now += algGap(rng, interval, tb.Burst)
			n := 1 + rng.Int64N(3)
			before := st
			ok, remaining, release := meter.Allow(&st, now, n)
			wantOK, wantRemaining := model.allow(now, n)
			if ok != wantOK || remaining != wantRemaining {
				t.Fatalf("trial %d %+v: Allow(%d, %d) from %+v = (%v, %d), model (%v, %d)",
					trial, tb, now, n, before, ok, remaining, wantOK, wantRemaining)
			}
			if ok {
				admitted = append(admitted, algEvent{now, n})
			}
			if release < now {
				t.Fatalf("trial %d: release %d before now %d", trial, release, now)
			}
			if release != math.MaxInt64 {
				if probe := st; !algOK(meter.Allow(&probe, release, n)) {
					t.Fatalf("trial %d %+v: Allow(%d) at release %d from %+v refused", trial, tb, n, release, st)
				}
				if probe := st; release > now && algOK(meter.Allow(&probe, release-1, n)) {
					t.Fatalf("trial %d %+v: Allow(%d) at release−1 %d from %+v admitted", trial, tb, n, release-1, st)
				}
			}
		}
		// Every pair i ≤ j of admitted requests: Σn[i..j] ≤ B + Rate·(t_j − t_i)/Per.
		for i := range admitted {
			sum := int64(0)
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].n
				dt := admitted[j].at - admitted[i].at
				if (sum-tb.Burst)*int64(tb.Per) > tb.Rate*dt {
					t.Fatalf("trial %d %+v: %d admitted in [%d, %d], more than B + r·t = %d + %d·%d/%d",
						trial, tb, sum, admitted[i].at, admitted[j].at, tb.Burst, tb.Rate, dt, int64(tb.Per))
				}
			}
		}
	}
}

func algOK(ok bool, _, _ int64) bool { return ok }
