package algo

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// SlidingLog is the exact sliding-window limit: at most Limit units in any
// window (t − Window, t]. Its state is the log of the instants of the units
// it has logged, so it answers exactly where the sliding-window counter
// estimates; the aggregator uses it as the ground truth the edges' decisions
// are judged against.
//
// The semantics, for one SlidingLogState:
//
//   - Count(now) is the number of logged units whose instant t satisfies
//     now − Window < t ≤ now. A unit logged at t counts from t until just
//     before t + Window.
//   - Add(now, n) logs n units at now, unconditionally (to record attempts).
//   - Allow(now, n) logs n units at now if and only if Count(now) + n ≤
//     Limit, and reports whether it did.
//   - Release(now, n) is the first instant t ≥ now at which Count(t) + n ≤
//     Limit if nothing more were logged: now if the units fit, else the
//     instant enough logged units have left the window (a logged instant plus
//     Window), math.MaxInt64 when n > Limit.
//
// Instants must be non-decreasing per state: every method's now is clamped to
// the latest now already passed to that state (so an out-of-order event is
// treated as happening at the latest instant seen, and a query can never look
// back past what was already forgotten). Clamping rather than returning an
// error keeps every method error-free; a caller that cares feeds events in
// order, as the aggregator does after its watermark.
//
// Memory is the sliding log's cost: the log keeps one 16-byte entry per distinct
// instant still in the window (units logged at the same instant share one).
// With Allow alone that is at most Limit entries, O(Limit) per key; Add can
// log more (every attempt in the window). Entries leave the log as they leave
// the window, and the ring that holds them shrinks when it is at most a
// quarter full.
//
// A SlidingLog is configuration: a small value, safe to copy and to share
// between goroutines. Per-key state lives in a SlidingLogState that the
// caller owns; the methods read no clock (now is a parameter, in Unix
// nanoseconds) and do no I/O. They allocate only to grow or shrink the ring:
// a key whose traffic is steady allocates nothing.
type SlidingLog struct {
	// Limit is the most units admitted by Allow in any window. Limit ≤ 0
	// makes Allow refuse every request of n > 0 (Add and Count still work).
	Limit int64
	// Window is the length of the sliding window. Window ≤ 0 makes the
	// window empty: Count is always 0, and Allow admits any n ≤ Limit.
	Window time.Duration
}

// SlidingLogState is one key's log under a SlidingLog. It holds a slice, so
// store it by pointer or in place (as a map value, copy it out, call, copy it
// back); a copy shares its ring with the original.
//
// The zero value is an empty log. A SlidingLogState is not safe for
// concurrent use: the caller serializes the calls that pass the same state,
// queries included (they drop expired entries).
type SlidingLogState struct {
	ring    []slEntry // circular, len a power of two (or 0)
	head    int       // ring index of the oldest entry
	size    int       // entries in use
	added   int64     // units ever logged
	dropped int64     // units ever dropped from the front (expired)
	latest  int64     // the latest now seen, Unix ns, valid when seen
	seen    bool
}

// slEntry is the log's entry for one instant: cum is the value of added
// after the units logged at that instant, so the units at an entry are its
// cum minus the previous entry's, and cum is non-decreasing along the ring.
type slEntry struct {
	at  int64 // Unix ns
	cum int64
}

const slMinRing = 8 // smallest ring allocated, entries

// Validate reports every problem with the configuration, each naming the
// field and its bad value, or nil when there is none.
func (l SlidingLog) Validate() error {
	var errs []error
	if l.Limit <= 0 {
		errs = append(errs, fmt.Errorf("algo: SlidingLog.Limit %d: must be > 0", l.Limit))
	}
	if l.Window <= 0 {
		errs = append(errs, fmt.Errorf("algo: SlidingLog.Window %v: must be > 0", l.Window))
	}
	return errors.Join(errs...)
}

// Len returns the number of entries the log holds (distinct instants, some
// possibly expired and not yet dropped): its memory is 16 bytes per entry of
// a ring of at most twice that, and at least 8.
func (s *SlidingLogState) Len() int { return s.size }

// Cap returns the entries the log's ring has room for, 16 bytes each: its
// memory, at least 8 entries once it has held one.
func (s *SlidingLogState) Cap() int { return len(s.ring) }

// Count returns the number of logged units in (now − Window, now] and drops
// the entries that left the window. It allocates only when it shrinks the
// ring.
func (l SlidingLog) Count(s *SlidingLogState, now int64) int64 {
	l.advance(s, now)
	return s.added - s.dropped
}

// Remaining returns max(0, Limit − Count(now)), dropping expired entries as
// Count does.
func (l SlidingLog) Remaining(s *SlidingLogState, now int64) int64 {
	return max(0, l.Limit-l.Count(s, now))
}

// Add logs n units at now, whatever the count. n ≤ 0 logs nothing (it still
// advances the log to now).
func (l SlidingLog) Add(s *SlidingLogState, now, n int64) {
	now = l.advance(s, now)
	if n > 0 {
		s.push(now, n)
	}
}

// Allow logs n units at now if and only if Count(now) + n ≤ Limit, and
// reports whether it did. It also returns the units left in the window after
// the call (Limit − Count, at least 0) and releaseAt, as Release would return
// it after the call: now while n more fit, else the instant enough logged
// units leave the window, math.MaxInt64 when n > Limit. n ≤ 0 logs nothing
// and is allowed.
//
// Allow allocates only when the ring grows or shrinks: never while the
// number of entries in the window stays within a factor of four.
func (l SlidingLog) Allow(s *SlidingLogState, now, n int64) (ok bool, remaining, releaseAt int64) {
	now = l.advance(s, now)
	count := s.added - s.dropped
	ok = n <= 0
	if n > 0 && n <= l.Limit-count {
		s.push(now, n)
		count += n
		ok = true
	}
	return ok, max(0, l.Limit-count), l.release(s, now, n, count)
}

// Release returns the first instant t ≥ now, in Unix nanoseconds, at which
// Count(t) + n ≤ Limit if nothing more were logged: now when n fit, else the
// instant enough logged units leave the window (a logged instant plus
// Window), math.MaxInt64 when n > Limit. It drops expired entries as Count
// does, and takes O(log Len) time.
func (l SlidingLog) Release(s *SlidingLogState, now, n int64) int64 {
	now = l.advance(s, now)
	return l.release(s, now, n, s.added-s.dropped)
}

func (l SlidingLog) release(s *SlidingLogState, now, n, count int64) int64 {
	switch {
	case n <= 0 || n <= l.Limit-count:
		return now
	case n > l.Limit:
		return math.MaxInt64
	case l.Window <= 0: // the window is empty from now on
		return now
	}
	// The oldest entries must leave until count − gone + n ≤ Limit: find
	// the first entry by which at least need units are gone.
	need := s.dropped + count + n - l.Limit
	// Binary search over the ring (cum is non-decreasing); the answer is
	// below s.size, as the newest entry's cum is s.added ≥ need for n ≤ Limit.
	lo, hi := 0, s.size-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).cum >= need {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	at := s.at(lo).at
	if at > math.MaxInt64-int64(l.Window) {
		return math.MaxInt64
	}
	return at + int64(l.Window)
}

// advance clamps now to the latest instant s has seen, drops the entries at
// or before now − Window, and returns the clamped now.
func (l SlidingLog) advance(s *SlidingLogState, now int64) int64 {
	if s.seen && now < s.latest {
		now = s.latest
	}
	s.latest, s.seen = now, true
	var horizon int64 // entries at or before horizon have left the window
	switch {
	case l.Window <= 0:
		horizon = now
	case now < math.MinInt64+int64(l.Window):
		return now // nothing can be that old
	default:
		horizon = now - int64(l.Window)
	}
	mask := len(s.ring) - 1
	for s.size > 0 && s.ring[s.head].at <= horizon {
		s.dropped = s.ring[s.head].cum
		s.head = (s.head + 1) & mask
		s.size--
	}
	if n := len(s.ring); n > slMinRing && s.size <= n/4 {
		for n > slMinRing && s.size <= n/4 {
			n /= 2
		}
		s.resize(n) // one allocation, to at most half full
	}
	return now
}

// at returns the i-th oldest entry.
func (s *SlidingLogState) at(i int) slEntry {
	return s.ring[(s.head+i)&(len(s.ring)-1)]
}

// push logs n > 0 units at now, which is ≥ every logged instant.
func (s *SlidingLogState) push(now, n int64) {
	s.added += n
	if s.size > 0 {
		last := &s.ring[(s.head+s.size-1)&(len(s.ring)-1)]
		if last.at == now {
			last.cum = s.added
			return
		}
	}
	if s.size == len(s.ring) {
		s.resize(max(slMinRing, 2*len(s.ring)))
	}
	s.ring[(s.head+s.size)&(len(s.ring)-1)] = slEntry{at: now, cum: s.added}
	s.size++
}

// resize moves the entries to a new ring of capacity n, a power of two ≥
// s.size.
func (s *SlidingLogState) resize(n int) {
	ring := make([]slEntry, n)
	for i := range s.size {
		ring[i] = s.at(i)
	}
	s.ring, s.head = ring, 0
}

// GiveBack takes back up to n > 0 units logged at the instant at (a
// request whose response did not count), at now, and returns how many it
// took: those of the entry at that instant, if it is still in the window
// (units logged at one instant are alike, whoever logged them). Units the
// store logged at a later instant than at (its clock was behind another's
// latest) are not found, and stay: that can only refuse more.
func (l SlidingLog) GiveBack(s *SlidingLogState, now, at, n int64) int64 {
	l.advance(s, now)
	if n <= 0 || s.size == 0 {
		return 0
	}
	lo, hi := 0, s.size-1 // the first entry at or after at
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).at >= at {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if s.at(lo).at != at {
		return 0
	}
	prev := s.dropped
	if lo > 0 {
		prev = s.at(lo - 1).cum
	}
	mask := len(s.ring) - 1
	k := min(n, s.at(lo).cum-prev)
	for j := lo; j < s.size; j++ {
		s.ring[(s.head+j)&mask].cum -= k
	}
	s.added -= k
	if s.at(lo).cum == prev { // empty: the entries after it move up
		for j := lo; j < s.size-1; j++ {
			s.ring[(s.head+j)&mask] = s.ring[(s.head+j+1)&mask]
		}
		s.size--
	}
	return k
}
