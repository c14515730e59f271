package event_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

func ExampleAppend() {
	e := event.Event{
		Time: 1_700_000_000_000_000_000, Edge: 2, Rule: []byte("login"), KeyHash: 0xfeedface,
		Cost: 1, Limit: 5, Burst: 5, WindowMillis: 60_000, Estimate: 5.6,
		Decision: event.Limited, Mode: policy.Sync, Algorithm: policy.SlidingWindow,
	}
	buf := make([]byte, 0, event.MaxLen) // reuse it: Append then allocates nothing
	buf, err := event.Append(buf[:0], &e)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d bytes, version %d\n", len(buf), buf[0])
	// Output: 38 bytes, version 4
}

func ExampleDecode() {
	b, _ := event.Append(nil, &event.Event{Rule: []byte("api"), Limit: 100, Estimate: 101, Decision: event.Limited})
	var e event.Event
	if err := event.Decode(b, &e); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s at %.0f of %d\n", e.Rule, e.Decision, e.Estimate, e.Limit)

	err := event.Decode(b[:len(b)-1], &e)
	fmt.Println(errors.Is(err, event.ErrTruncated), err)
	// Output:
	// api: limited at 101 of 100
	// true event: truncated event
}
