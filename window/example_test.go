package window_test

import (
	"context"
	"fmt"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// fixedClock is a clock that stands still, for a reproducible example.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func ExampleLimiter() {
	// 3 per minute, as a rules file's "limit: 3, window: 1m" (package rules
	// parses those and sets the defaults: burst = limit, timeout = window).
	p := &window.Policy{Limit: 3, Window: time.Minute, Burst: 3, Timeout: time.Minute}
	now := time.Date(2026, 11, 29, 10, 0, 12, 0, time.UTC)
	clock := fixedClock{now}
	lim, err := window.New(window.Config{Clock: clock}, store.NewMemStore(clock))
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// The key is the 64-bit hash of the rule and the client key (package
	// rules computes it: Rule.Hash); the Limiter never sees the client key.
	const key = 0x9e3779b97f4a7c15
	for i := 0; i < 4; i++ {
		d := lim.Decide(context.Background(), now, p, key, p.Limit, 1)
		fmt.Println(d.Allowed, d.Remaining)
	}
	// The flusher sends one increment of 3 for the key.
	st := lim.Flush(context.Background(), now.Add(5*time.Millisecond))
	fmt.Println("flushed keys:", st.Keys)
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
	// flushed keys: 1
}

func ExampleSlidingWindow_Decide() {
	sw := algo.SlidingWindow{Limit: 100, Window: time.Minute}
	start := time.Date(2026, 11, 29, 10, 3, 0, 0, time.UTC)
	// 20 % into the minute, 80 requests in the previous minute and 15 in
	// this one: 80 × 0.8 + 15 = 79.
	v := sw.Decide(start.Add(12*time.Second).UnixNano(), 80, 15, 1)
	fmt.Println(v.Estimate, v.Allowed, v.Remaining)
	// Output: 79 true 20
}
