package store

import (
	"sync/atomic"
	"time"
)

// simClock is a clock the test sets.
type simClock struct{ t atomic.Int64 }

func (c *simClock) Now() time.Time { return time.Unix(0, c.t.Load()) }
