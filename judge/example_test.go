package judge_test

import (
	"fmt"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/judge"
)

// An edge of a sliding-window rule (the events' Algorithm, the zero value)
// that counted like a fixed window admits a burst at the end of one window
// and another at the start of the next: the judge counts exactly the
// admissions that broke "at most 3 per 10 s". Had the rule been a
// fixed_window one, all six would have been right.
func Example() {
	j, err := judge.New(judge.DefaultConfig(), nil)
	if err != nil {
		panic(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	arrived := start + int64(11*time.Second) // when the consumer got the events: the caller's clock
	for i, at := range []time.Duration{9100, 9200, 9300, 10_100, 10_200, 10_300} {
		j.Add(arrived, event.Event{
			Time:         start + int64(at*time.Millisecond),
			KeyHash:      0xfeed,
			Rule:         []byte("login"),
			Cost:         1,
			Limit:        3,
			WindowMillis: 10_000,
			Estimate:     float32(i % 3), // what a fixed window sees
			Edge:         1,
			Decision:     event.Allowed,
		})
	}
	j.Flush() // the stream is over: judge what waits for the watermark

	r := j.Report()
	fmt.Printf("%d decisions, %d wrongly allowed (%.0f%%), %d wrongly limited\n",
		r.Enforced.Decisions, r.Enforced.WronglyAllowed, 100*r.Enforced.WronglyAllowedRatio, r.Enforced.WronglyLimited)
	for _, k := range r.TopFalseNegatives {
		fmt.Printf("key %s (%s): %d wrong, up to %.2f× the limit\n", k.KeyHash, k.Rule, k.Wrong, k.Ratio)
	}
	fmt.Printf("mean relative error of the estimate: %.2f\n", r.MeanRelativeError)
	// Output:
	// 6 decisions, 3 wrongly allowed (50%), 0 wrongly limited
	// key 000000000000feed (login): 3 wrong, up to 2.00× the limit
	// mean relative error of the estimate: 0.47
}
