package algo

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// LeakyBucket is the leaky bucket as a meter, in the form of the generic cell
// rate algorithm (GCRA, "virtual scheduling"): a bucket of Capacity units
// leaks Rate units every Per, continuously, and a request of n units is
// admitted if the bucket's level plus n is at most Capacity, whereupon it
// pours in. Nothing is queued: a request that does not fit is refused.
//
// The state is one instant, the theoretical arrival time (TAT): when the
// bucket would be empty if nothing more arrived. The level at now is
// (TAT − now) × Rate / Per, so a request fits when TAT − now + n·Per/Rate ≤
// Capacity·Per/Rate. As a meter the leaky bucket admits exactly what a token
// bucket with Burst = Capacity admits (the level is the token bucket's
// debt), and the Limiter runs token_bucket rules as this meter with
// Capacity = Burst: GCRA stores one instant instead of a level and a time.
// A leaky_bucket rule's delay action is the queue form: the same meter of
// Capacity Burst + 1, a request admitted waiting until the units before it
// have leaked.
//
// Arithmetic is exact: TAT carries its fraction of a nanosecond in units of
// 1/Rate ns, so a rate such as 3 per second drifts by nothing. Capacity × Per
// must fit in an int64; Validate checks it.
//
// A LeakyBucket is configuration: a small value, safe to copy and to share
// between goroutines. Per-key state lives in a LeakyBucketState that the
// caller owns; the methods read no clock (now is a parameter, in Unix
// nanoseconds), allocate nothing and do no I/O.
type LeakyBucket struct {
	// Rate is the number of units that leak out per Per. Rate ≤ 0 refuses
	// every request of n > 0.
	Rate int64
	// Per is the period of Rate, e.g. time.Second. Per ≤ 0 refuses every
	// request of n > 0.
	Per time.Duration
	// Capacity is the bucket's size in units: the largest burst admitted at
	// once from an empty bucket, and the largest n ever admitted.
	Capacity int64
}

// LeakyBucketState is one key's bucket under a LeakyBucket. It is 16 bytes and
// is meant to be stored by value, one per key.
//
// The zero value is an empty bucket at any instant ≥ 0. A LeakyBucketState is
// not safe for concurrent use: the caller serializes the calls that pass the
// same state.
type LeakyBucketState struct {
	// TAT is the whole-nanosecond part of the theoretical arrival time, Unix
	// nanoseconds: the bucket is empty from TAT + Frac/Rate ns on. A call
	// with a now earlier than a previous one sees the bucket fuller than it
	// was (it has had less time to leak), so a clock that steps back refuses
	// more, never less.
	TAT int64
	// Frac is the fractional part of TAT in units of 1/Rate ns, 0 ≤ Frac < Rate.
	Frac int64
}

// Validate reports every problem with the configuration, each naming the
// field and its bad value, or nil when there is none.
func (lb LeakyBucket) Validate() error {
	var errs []error
	if lb.Rate <= 0 {
		errs = append(errs, fmt.Errorf("algo: LeakyBucket.Rate %d: must be > 0", lb.Rate))
	}
	if lb.Per <= 0 {
		errs = append(errs, fmt.Errorf("algo: LeakyBucket.Per %v: must be > 0", lb.Per))
	}
	if lb.Capacity <= 0 {
		errs = append(errs, fmt.Errorf("algo: LeakyBucket.Capacity %d: must be > 0", lb.Capacity))
	}
	if lb.Rate > 0 && lb.Per > 0 && lb.Capacity > 0 && !algMulAddFits(lb.Capacity, int64(lb.Per), lb.Rate) {
		errs = append(errs, fmt.Errorf("algo: LeakyBucket.Capacity %d × Per %v overflows int64 nanoseconds: state a shorter Per", lb.Capacity, lb.Per))
	} else if lb.Rate > 0 && lb.Per > 0 && lb.Capacity > 0 && lb.Capacity*int64(lb.Per)/lb.Rate > int64(MaxDrain) {
		errs = append(errs, fmt.Errorf("algo: LeakyBucket of Capacity %d draining %d per %v: a full bucket drains in more than %v", lb.Capacity, lb.Rate, lb.Per, MaxDrain))
	}
	return errors.Join(errs...)
}

// MaxDrain bounds the time a full bucket takes to drain, so that a
// theoretical arrival time (now plus at most that) fits in int64 Unix
// nanoseconds for centuries.
const MaxDrain = 100 * 365 * 24 * time.Hour

func (lb LeakyBucket) valid() bool { return lb.Rate > 0 && lb.Per > 0 && lb.Capacity > 0 }

// Level returns the bucket's level at now in units of 1/Per unit (so one
// unit is Per, and a full bucket Capacity·Per), or math.MaxInt64 when now is
// so far before TAT that the level does not fit.
func (lb LeakyBucket) Level(s LeakyBucketState, now int64) int64 {
	if s.TAT < now || (s.TAT == now && s.Frac == 0) {
		return 0
	}
	d := s.TAT - now
	if d > (math.MaxInt64-s.Frac)/lb.Rate {
		return math.MaxInt64
	}
	return d*lb.Rate + s.Frac
}

// fits reports whether n > 0 units fit in a valid bucket at level lvl.
func (lb LeakyBucket) fits(lvl, n int64) bool {
	return n <= lb.Capacity && lvl <= (lb.Capacity-n)*int64(lb.Per)
}

// Allow reports whether n units fit in the bucket at now and, if so, pours
// them into *s. It also returns the whole units of room left after the call
// and releaseAt, the earliest instant ≥ now at which n more units would fit
// if nothing else arrived: now if they fit, the instant enough has leaked
// otherwise, math.MaxInt64 when n > Capacity or the configuration is invalid
// (never).
//
// now is in Unix nanoseconds. n ≤ 0 pours nothing and is allowed. Allow does
// not allocate.
func (lb LeakyBucket) Allow(s *LeakyBucketState, now, n int64) (ok bool, remaining, releaseAt int64) {
	if !lb.valid() {
		return n <= 0, 0, lb.releaseInvalid(now, n)
	}
	lvl := lb.Level(*s, now)
	ok = n <= 0
	if n > 0 && lb.fits(lvl, n) {
		tat, frac := s.TAT, s.Frac
		if lvl == 0 { // empty: the n units start draining now
			tat, frac = now, 0
		}
		total := frac + n*int64(lb.Per) // < Rate + Capacity·Per, fits (Validate)
		s.TAT, s.Frac = tat+total/lb.Rate, total%lb.Rate
		if s.TAT < tat { // past int64: a configuration Validate refuses
			s.TAT, s.Frac = math.MaxInt64, 0
		}
		lvl += n * int64(lb.Per)
		ok = true
	}
	return ok, lb.room(lvl), lb.release(*s, now, n, lvl)
}

// Remaining returns the whole units of room in the bucket at now. It does
// not modify s.
func (lb LeakyBucket) Remaining(s LeakyBucketState, now int64) int64 {
	if !lb.valid() {
		return 0
	}
	return lb.room(lb.Level(s, now))
}

// Release returns the earliest instant ≥ now, in Unix nanoseconds, at which n
// units would fit if nothing else arrived first, exact to the nanosecond
// (rounded up): now when they fit, math.MaxInt64 when n > Capacity or the
// configuration is invalid. It does not modify s.
func (lb LeakyBucket) Release(s LeakyBucketState, now, n int64) int64 {
	if !lb.valid() {
		return lb.releaseInvalid(now, n)
	}
	return lb.release(s, now, n, lb.Level(s, now))
}

func (lb LeakyBucket) room(lvl int64) int64 {
	free := lb.Capacity*int64(lb.Per) - lvl
	if free <= 0 {
		return 0
	}
	return free / int64(lb.Per)
}

func (lb LeakyBucket) release(s LeakyBucketState, now, n, lvl int64) int64 {
	switch {
	case n <= 0 || lb.fits(lvl, n):
		return now
	case n > lb.Capacity:
		return math.MaxInt64
	}
	// The level at t is (TAT − t)·Rate + Frac; it is ≤ (Capacity − n)·Per
	// from t = TAT + ⌈(Frac − (Capacity − n)·Per) / Rate⌉ on.
	return max(now, s.TAT+algCeilDiv(s.Frac-(lb.Capacity-n)*int64(lb.Per), lb.Rate))
}

func (LeakyBucket) releaseInvalid(now, n int64) int64 {
	if n <= 0 {
		return now
	}
	return math.MaxInt64
}

// DrainedTo returns the first instant (Unix ns) at which the level of
// the bucket in state s, sent nothing more, is at most level units: s.TAT
// for level 0. It may be before now.
func (lb LeakyBucket) DrainedTo(s LeakyBucketState, level int64) int64 {
	return s.TAT + algCeilDiv(s.Frac-level*int64(lb.Per), lb.Rate)
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

// algMulAddFits reports whether a × b + c fits in an int64, for a, b, c > 0.
func algMulAddFits(a, b, c int64) bool {
	return algMulFits(a, b) && a*b <= math.MaxInt64-c
}
