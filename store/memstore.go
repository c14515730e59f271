package store

import (
	"context"
	"sync"
	"time"
)

// MemStore is a Store in process memory, counters and states, for a
// single edge (the edge's embedded default) and for tests. Counters expire
// at their TTL like memcached's; expired counters are swept as new ones are
// made, so memory is bounded by the counters live within their TTL. Safe
// for concurrent use.
type MemStore struct {
	clock Clock

	// mu protects the fields below.
	mu      sync.Mutex
	m       map[memKey]memCounter
	sweepAt int // sweep when len(m) reaches this

	states stateMem // shared algorithm states (DoState)
}

type memKey struct {
	key   uint64
	start int64
}

type memCounter struct {
	value   uint64
	expires int64 // Unix ns
}

// NewMemStore returns an empty MemStore that reads expiry time from clock
// (SystemClock when nil).
func NewMemStore(clock Clock) *MemStore {
	if clock == nil {
		clock = SystemClock
	}
	return &MemStore{clock: clock, m: make(map[memKey]memCounter), sweepAt: 1024}
}

// Parts is 1: a MemStore is one part (Placer).
func (s *MemStore) Parts() int { return 1 }

// Place is 0 for every key (Placer).
func (s *MemStore) Place(uint64) int { return 0 }

// Healthy is true: a MemStore always answers.
func (s *MemStore) Healthy() bool { return true }

// Whole is true: a MemStore never moves a key.
func (s *MemStore) Whole() bool { return true }

// Do performs ops; it never fails.
func (s *MemStore) Do(_ context.Context, ops []Op) {
	now := s.clock.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		op := &ops[i]
		k := memKey{op.Key, op.Start}
		c, ok := s.m[k]
		if ok && c.expires <= now {
			c, ok = memCounter{}, false
		}
		switch {
		case op.Delta > 0:
			if !ok {
				c.expires = now + int64(max(op.TTL, time.Second))
			}
			c.value += uint64(op.Delta)
			s.m[k] = c
		case op.Delta < 0 && ok:
			c.value -= min(c.value, uint64(-op.Delta))
			s.m[k] = c
		}
		op.Value, op.Err = c.value, nil
	}
	if len(s.m) >= s.sweepAt {
		for k, c := range s.m {
			if c.expires <= now {
				delete(s.m, k)
			}
		}
		s.sweepAt = max(1024, 2*len(s.m))
	}
}

// Len returns the number of counters held, expired or not.
func (s *MemStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
