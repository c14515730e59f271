package window

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// TokenBucket is a token bucket with lazy refill: a bucket holds at
// most Burst tokens and gains Rate tokens every Per, continuously; a request
// of n units takes n tokens or is refused whole. No timer ticks: the state is
// the bucket's level and the instant of its last refill, and each call first
// adds Rate × elapsed / Per tokens, capped at Burst.
//
// The promise: in any interval of length t, at most Burst + Rate·t/Per units
// are admitted. A short burst of up to Burst passes, the long-run average is
// Rate per Per.
//
// Arithmetic is exact. The level is kept in integer units of 1/Per token (Per
// counted in nanoseconds: one token is Per units and each nanosecond refills
// Rate units), so 10 tokens per second refill exactly one token per 100 ms
// and a rate such as 3 per second loses nothing to rounding. The price is
// that Burst × Per must fit in an int64 (Burst ≤ 9.2e9 with Per = 1 s,
// ≤ 2.5e6 with Per = 1 h); Validate checks it.
//
// A TokenBucket is configuration: a small value, safe to copy and to share
// between goroutines. Per-key state lives in a TokenBucketState that the
// caller owns; the methods read no clock (now is a parameter, in Unix
// nanoseconds), allocate nothing and do no I/O.
type TokenBucket struct {
	// Rate is the number of tokens added per Per. Rate ≤ 0 adds none.
	Rate int64
	// Per is the period of Rate, e.g. time.Second for Rate tokens per
	// second. Per ≤ 0 adds none and refuses every request of n > 0.
	Per time.Duration
	// Burst is the bucket's capacity in tokens: the largest burst admitted
	// at once, and the largest n ever admitted. Burst ≤ 0 refuses every
	// request of n > 0.
	Burst int64
}

// TokenBucketState is one key's bucket under a TokenBucket. It is 16 bytes and
// is meant to be stored by value, one per key.
//
// The zero value is a full bucket (at any instant, including 0), so a key
// never seen before may burst. A TokenBucketState is not safe for concurrent
// use: the caller serializes the calls that pass the same state.
type TokenBucketState struct {
	// Debt is how far the bucket is below full, in units of 1/Per token:
	// taking a token adds Per (in nanoseconds), each nanosecond of refill
	// subtracts Rate. 0 is a full bucket, Burst × Per an empty one.
	Debt int64
	// Last is the instant of the last refill, Unix nanoseconds. A later
	// call with an earlier now refills nothing and is judged as of Last: the
	// bucket never runs backwards.
	Last int64
}

// Validate reports every problem with the configuration, each naming the
// field and its bad value, or nil when there is none.
func (tb TokenBucket) Validate() error {
	var errs []error
	if tb.Rate <= 0 {
		errs = append(errs, fmt.Errorf("window: TokenBucket.Rate %d: must be > 0", tb.Rate))
	}
	if tb.Per <= 0 {
		errs = append(errs, fmt.Errorf("window: TokenBucket.Per %v: must be > 0", tb.Per))
	}
	if tb.Burst <= 0 {
		errs = append(errs, fmt.Errorf("window: TokenBucket.Burst %d: must be > 0", tb.Burst))
	}
	if tb.Per > 0 && tb.Burst > 0 && !algMulFits(tb.Burst, int64(tb.Per)) {
		errs = append(errs, fmt.Errorf("window: TokenBucket.Burst %d × Per %v overflows int64 nanoseconds: state a shorter Per", tb.Burst, tb.Per))
	}
	return errors.Join(errs...)
}

// refill returns s as of now: Rate units refilled per elapsed nanosecond,
// capped at a full bucket, and Last moved to now (never backwards).
func (tb TokenBucket) refill(s TokenBucketState, now int64) TokenBucketState {
	if now <= s.Last {
		return s
	}
	elapsed := now - s.Last
	s.Last = now
	if s.Debt > 0 && tb.Rate > 0 && tb.Per > 0 {
		// elapsed × Rate ≥ Debt ⇔ elapsed > ⌊Debt/Rate⌋; compare before
		// multiplying so a long idle key cannot overflow.
		if elapsed > s.Debt/tb.Rate {
			s.Debt = 0
		} else {
			s.Debt -= elapsed * tb.Rate
		}
	}
	return s
}

// Allow reports whether n tokens may be taken at now and, if so, takes them
// from *s. It refills *s to now either way. It also returns the whole tokens
// left after the call and releaseAt, the earliest instant ≥ now at which n
// more tokens could be taken if nothing else were: now if they are there,
// the instant the refill makes up the shortfall otherwise, math.MaxInt64 when
// n > Burst or nothing refills (never).
//
// now is in Unix nanoseconds. n ≤ 0 takes nothing and is allowed. Allow does
// not allocate.
func (tb TokenBucket) Allow(s *TokenBucketState, now, n int64) (ok bool, remaining, releaseAt int64) {
	cur := tb.refill(*s, now)
	ok = n <= 0
	if n > 0 && tb.fits(cur, n) {
		cur.Debt += n * int64(tb.Per)
		ok = true
	}
	*s = cur
	return ok, tb.tokens(cur), tb.release(cur, now, n)
}

// Remaining returns the whole tokens in the bucket at now (fractions of a
// token are refilling and not counted). It does not modify s.
func (tb TokenBucket) Remaining(s TokenBucketState, now int64) int64 {
	return tb.tokens(tb.refill(s, now))
}

// Release returns the earliest instant ≥ now, in Unix nanoseconds, at which n
// tokens could be taken if nothing else were taken first, exact to the
// nanosecond (rounded up). It returns now when they are there, and
// math.MaxInt64 when n > Burst or the bucket never refills. It does not
// modify s.
func (tb TokenBucket) Release(s TokenBucketState, now, n int64) int64 {
	return tb.release(tb.refill(s, now), now, n)
}

// fits reports whether n > 0 tokens are in the refilled bucket cur.
func (tb TokenBucket) fits(cur TokenBucketState, n int64) bool {
	// Debt + n·Per ≤ Burst·Per, rearranged so nothing overflows for n ≤ Burst.
	return tb.Per > 0 && n <= tb.Burst && cur.Debt <= (tb.Burst-n)*int64(tb.Per)
}

func (tb TokenBucket) tokens(cur TokenBucketState) int64 {
	if tb.Per <= 0 || tb.Burst <= 0 {
		return 0
	}
	return tb.Burst - algCeilDiv(cur.Debt, int64(tb.Per))
}

func (tb TokenBucket) release(cur TokenBucketState, now, n int64) int64 {
	switch {
	case n <= 0:
		return now
	case tb.fits(cur, n):
		return now
	case tb.Per <= 0 || n > tb.Burst || tb.Rate <= 0:
		return math.MaxInt64
	}
	// The shortfall, in units, refills at Rate units per nanosecond from
	// cur.Last (≥ now unless the caller's clock stepped back).
	short := cur.Debt - (tb.Burst-n)*int64(tb.Per)
	wait := algCeilDiv(short, tb.Rate)
	if cur.Last > math.MaxInt64-wait {
		return math.MaxInt64
	}
	return max(now, cur.Last+wait)
}

// algCeilDiv returns ⌈a/b⌉ for b > 0 and any a.
func algCeilDiv(a, b int64) int64 {
	q := a / b // truncated toward zero: already the ceiling when a ≤ 0
	if a%b > 0 {
		q++
	}
	return q
}

// algMulFits reports whether a × b fits in an int64, for a, b > 0.
func algMulFits(a, b int64) bool {
	return a <= math.MaxInt64/b
}
