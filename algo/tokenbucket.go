package algo

import (
	"errors"
	"fmt"
	"time"
)

// TokenBucket is a token bucket with lazy refill, as a token_bucket rule
// states it: a bucket holds at most Burst tokens and gains Rate tokens
// every Per, continuously; a request of n units takes n tokens or is
// refused whole. In any interval of length t at most Burst + Rate·t/Per
// units are admitted: a short burst of up to Burst passes, the long-run
// average is Rate per Per.
//
// The Limiter runs it as the LeakyBucket meter of Capacity Burst (GCRA),
// which admits exactly what this bucket admits: the bucket's missing
// tokens are the meter's level. Its arithmetic is exact in integer units
// of 1/Per token, so Burst × Per must fit in an int64 (Burst ≤ 9.2e9 with
// Per = 1 s, ≤ 2.5e6 with Per = 1 h); Validate checks it.
type TokenBucket struct {
	// Rate is the number of tokens added per Per.
	Rate int64
	// Per is the period of Rate, e.g. time.Second for Rate tokens per
	// second.
	Per time.Duration
	// Burst is the bucket's capacity in tokens: the largest burst admitted
	// at once, and the largest n ever admitted.
	Burst int64
}

// Validate reports every problem with the configuration, each naming the
// field and its bad value, or nil when there is none.
func (tb TokenBucket) Validate() error {
	var errs []error
	if tb.Rate <= 0 {
		errs = append(errs, fmt.Errorf("algo: TokenBucket.Rate %d: must be > 0", tb.Rate))
	}
	if tb.Per <= 0 {
		errs = append(errs, fmt.Errorf("algo: TokenBucket.Per %v: must be > 0", tb.Per))
	}
	if tb.Burst <= 0 {
		errs = append(errs, fmt.Errorf("algo: TokenBucket.Burst %d: must be > 0", tb.Burst))
	}
	if tb.Per > 0 && tb.Burst > 0 && !algMulFits(tb.Burst, int64(tb.Per)) {
		errs = append(errs, fmt.Errorf("algo: TokenBucket.Burst %d × Per %v overflows int64 nanoseconds: state a shorter Per", tb.Burst, tb.Per))
	}
	return errors.Join(errs...)
}
