package window

import (
	"context"
	"testing"
	"time"
)

func TestLimiterMemoryIsBounded(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{MaxKeys: 1024, Shards: 4})
	r := mustRules(t, perMinute).Rules[0]
	var key [8]byte
	for i := 0; i < 100_000; i++ {
		key[0], key[1], key[2] = byte(i), byte(i>>8), byte(i>>16)
		l.Decide(context.Background(), clock.Now(), &r.Policy, r.Hash(key[:]), r.Limit, 1)
		if i%1000 == 0 {
			clock.Add(5 * time.Millisecond)
			l.Flush(context.Background(), clock.Now())
		}
	}
	if n := l.Keys(); n > 1024 {
		t.Errorf("a flood of 100,000 keys left %d views, want at most MaxKeys = 1024", n)
	}
	for i := range l.shards {
		s := &l.shards[i]
		if len(s.slab) > s.max || cap(s.slab) > s.max {
			t.Errorf("shard slab len %d cap %d over its bound %d", len(s.slab), cap(s.slab), s.max)
		}
	}
	// Idle keys go after two windows.
	for i := 0; i < 200; i++ {
		clock.Add(time.Second)
		l.Flush(context.Background(), clock.Now())
	}
	if n := l.Keys(); n != 0 {
		t.Errorf("%d views left after 200 s idle, want 0", n)
	}
}

// TestFloodDoesNotEvictReturningKeys floods a small key table with
// one-request keys while a few keys keep coming back: the returning keys
// keep their views (a key evicted and recreated would forget what it had
// admitted).
func TestFloodDoesNotEvictReturningKeys(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, NewMemStore(clock), Config{MaxKeys: 4096, Shards: 4})
	r := mustRules(t, perMinute).Rules[0]
	legit := []uint64{r.Hash([]byte("a")), r.Hash([]byte("b")), r.Hash([]byte("c"))}
	admitted := make([]int, len(legit))
	var key [8]byte
	for i := 0; i < 200_000; i++ {
		key[0], key[1], key[2], key[3] = byte(i), byte(i>>8), byte(i>>16), 0xfe
		l.Decide(context.Background(), clock.Now(), &r.Policy, r.Hash(key[:]), r.Limit, 1)
		if i%100 == 0 {
			for j, k := range legit {
				if l.Decide(context.Background(), clock.Now(), &r.Policy, k, r.Limit, 1).Allowed {
					admitted[j]++
				}
			}
		}
		if i%1000 == 999 {
			clock.Add(5 * time.Millisecond)
			l.Flush(context.Background(), clock.Now())
		}
	}
	// 2,000 attempts each within one minute against a limit of 100.
	for j, n := range admitted {
		if n != 100 {
			t.Errorf("returning key %d admitted %d under a flood, want its limit of 100 (evicted views forget)", j, n)
		}
	}
}
