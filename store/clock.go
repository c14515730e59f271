package store

import "time"

// Clock tells a Limiter, Slots or MemStore what time it is. time.Now satisfies it through
// SystemClock; tests pass their own.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock is the wall clock.
var SystemClock Clock = systemClock{}
