package algo

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// FixedWindow is the fixed-window counter: at most Limit units are admitted
// per window of length Window, and windows start at wall-clock multiples of
// Window since the Unix epoch (a one-minute window starts at every :00
// second), so every server that uses the same FixedWindow agrees on where a
// window begins.
//
// Its known flaw is the boundary double burst: with 100 per minute,
// 100 requests at 10:03:59 and 100 more at 10:04:00 all pass, 2×Limit in two
// seconds, because the second hundred falls in a fresh window. The
// sliding-window counter and the sliding log exist to close that gap.
//
// A FixedWindow is configuration: a small value, safe to copy and to share
// between goroutines. Per-key state lives in a FixedWindowState that the
// caller owns; the methods read no clock (now is a parameter, in Unix
// nanoseconds), allocate nothing and do no I/O.
type FixedWindow struct {
	// Limit is the number of units admitted per window. Limit ≤ 0 refuses
	// every request of n > 0.
	Limit int64
	// Window is the length of a window. It must be > 0; a FixedWindow with
	// Window ≤ 0 refuses every request of n > 0 instead of panicking.
	Window time.Duration
}

// FixedWindowState is one key's state under a FixedWindow: the window it last
// counted in and what it admitted there. It is 16 bytes and is meant to be
// stored by value, one per key.
//
// The zero value is a key that has admitted nothing. A FixedWindowState is
// not safe for concurrent use: the caller serializes the calls that pass the
// same state (one key's requests), typically under a per-shard mutex.
type FixedWindowState struct {
	// Start is the start of the window Count belongs to, Unix nanoseconds
	// (a multiple of Window).
	Start int64
	// Count is the number of units admitted in the window that starts at
	// Start.
	Count int64
}

// Validate reports every problem with the configuration, each naming the
// field and its bad value, or nil when there is none.
func (fw FixedWindow) Validate() error {
	var errs []error
	if fw.Limit <= 0 {
		errs = append(errs, fmt.Errorf("algo: FixedWindow.Limit %d: must be > 0", fw.Limit))
	}
	if fw.Window <= 0 {
		errs = append(errs, fmt.Errorf("algo: FixedWindow.Window %v: must be > 0", fw.Window))
	}
	return errors.Join(errs...)
}

// WindowStart returns the start of the window that contains now, in Unix
// nanoseconds: the largest multiple of Window that is ≤ now. Negative
// instants (before 1970) round down as well. With Window ≤ 0 it returns now.
func (fw FixedWindow) WindowStart(now int64) int64 {
	w := int64(fw.Window)
	if w <= 0 {
		return now
	}
	return now - algFloorMod(now, w)
}

// current returns the state as of now: the counter of the window containing
// now. An instant before the state's window (a clock that stepped back) is
// counted in the state's window: the count never goes backwards.
func (fw FixedWindow) current(s FixedWindowState, now int64) FixedWindowState {
	if start := fw.WindowStart(now); start > s.Start {
		return FixedWindowState{Start: start}
	}
	return s
}

// Allow reports whether n units may happen at now and, if so, counts them in
// *s. It also returns the units left in the window after the call and
// releaseAt, the earliest instant ≥ now at which n more units would be
// admitted if nothing else happened: now while quota is left, the start of
// the next window once it is spent, math.MaxInt64 when n > Limit (never).
//
// now is in Unix nanoseconds. n ≤ 0 admits without counting anything. Allow
// does not allocate.
func (fw FixedWindow) Allow(s *FixedWindowState, now, n int64) (ok bool, remaining, releaseAt int64) {
	cur := fw.current(*s, now)
	ok = n <= 0
	if n > 0 && fw.fits(cur, n) {
		cur.Count += n
		ok = true
	}
	*s = cur
	return ok, fw.remaining(cur), fw.release(cur, now, n)
}

// Remaining returns the units that may still be admitted at now in the window
// containing now, never less than 0. It does not modify s.
func (fw FixedWindow) Remaining(s FixedWindowState, now int64) int64 {
	return fw.remaining(fw.current(s, now))
}

// Release returns the earliest instant ≥ now, in Unix nanoseconds, at which n
// units would be admitted if nothing else were admitted first: now if they
// fit, else the start of the next window, or math.MaxInt64 when n > Limit or
// the configuration cannot admit anything. It does not modify s.
func (fw FixedWindow) Release(s FixedWindowState, now, n int64) int64 {
	return fw.release(fw.current(s, now), now, n)
}

func (fw FixedWindow) fits(cur FixedWindowState, n int64) bool {
	return fw.Window > 0 && n <= fw.Limit-cur.Count
}

func (fw FixedWindow) remaining(cur FixedWindowState) int64 {
	if fw.Window <= 0 || cur.Count >= fw.Limit {
		return 0
	}
	return fw.Limit - cur.Count
}

func (fw FixedWindow) release(cur FixedWindowState, now, n int64) int64 {
	switch {
	case n <= 0:
		return now
	case fw.Window <= 0 || n > fw.Limit:
		return math.MaxInt64
	case fw.fits(cur, n):
		return now
	}
	// The next window starts empty, and n ≤ Limit fits in it.
	if cur.Start > math.MaxInt64-int64(fw.Window) {
		return math.MaxInt64
	}
	return cur.Start + int64(fw.Window) // > now: cur.Start ≥ the start of now's window
}

// algFloorMod returns a mod b rounded toward negative infinity, in [0, b),
// for b > 0. (The alg prefix keeps this file's helpers apart from the rest of
// the package.)
func algFloorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
