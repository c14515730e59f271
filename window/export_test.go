package window

import (
	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
)

// TokenBucketMeter is the LeakyBucket the Limiter runs a token_bucket
// rule of tb's rate, period and burst with, for the tests that hold it to
// the token bucket's promise.
func TokenBucketMeter(tb algo.TokenBucket) algo.LeakyBucket {
	p := Policy{Algorithm: policy.TokenBucket, Limit: uint64(tb.Rate), Window: tb.Per, Burst: uint64(tb.Burst)}
	return bucketOf(&p, p.Limit)
}
