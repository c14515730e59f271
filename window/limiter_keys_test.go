package window

import (
	"context"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/store"
)

func TestLimiterMemoryIsBounded(t *testing.T) {
	clock := newSimClock(t0)
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{MaxKeys: 1024, Shards: 4})
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
	l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{MaxKeys: 4096, Shards: 4})
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

// forget drops key's view from l, as an eviction does.
func forget(l *Limiter, key uint64) {
	s := l.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.idx.get(key)
	if !ok {
		return
	}
	e := &s.slab[i]
	s.idx.del(key)
	s.histFree(e)
	s.n.Add(-1)
	e.key = 0
	s.free = append(s.free, i)
}

// TestAViewMadeAgainSpreadsWhatItFoundFromTheWindowsStart: a client at
// twice its limit whose view is evicted (and made again) every 3.7 s, with
// histograms and without, is admitted at least its limit over the run. The
// units a view made again finds in the store came before it, from the
// window's start; spread from its own first unit instead, they weighed in
// the next window as if all had come late, and the client was refused part
// of its limit (268 of 300 with histograms off, 285 with them at 7.3 s).
func TestAViewMadeAgainSpreadsWhatItFoundFromTheWindowsStart(t *testing.T) {
	for _, c := range []struct {
		name    string
		keysDiv int
		every   time.Duration
	}{{"histograms", 0, 3700 * time.Millisecond}, {"no histograms", -1, 3700 * time.Millisecond}, {"histograms", 0, 7300 * time.Millisecond}} {
		const limit = 50
		w := 5 * time.Second
		clock := newSimClock(t0)
		l := newTestLimiter(t, clock, store.NewMemStore(clock), Config{hist: histParams{keysDiv: c.keysDiv}})
		pol := &Policy{Limit: limit, Window: w}
		key := uint64(0x1a7e)
		ctx := context.Background()
		exact := algo.SlidingLog{Limit: limit, Window: w}
		var log algo.SlidingLogState
		admitted, want := 0, 0
		base := t0.UnixNano() + int64(1234*time.Millisecond)
		next := base + int64(c.every)
		for tt := base; tt < base+int64(30*time.Second); tt += int64(w) / (2 * limit) {
			clock.t.Store(tt)
			if tt >= next {
				forget(l, key)
				next += int64(c.every)
			}
			if l.Decide(ctx, time.Unix(0, tt), pol, key, limit, 1).Allowed {
				admitted++
			}
			if ok, _, _ := exact.Allow(&log, tt, 1); ok {
				want++
			}
			l.Flush(ctx, time.Unix(0, tt))
		}
		t.Logf("%s, evicted every %v: %d admitted, an exact limiter %d", c.name, c.every, admitted, want)
		if admitted < want-5 {
			t.Errorf("%s, evicted every %v: %d admitted, want at least %d (an exact limiter's %d, less 5)", c.name, c.every, admitted, want-5, want)
		}
	}
}
