package algo

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A bucket that gives back a request's units never holds less than it
// would had the request never come, and holds exactly that while none of
// its units has leaked: checked against the bucket replayed without the
// request, over random arrivals.
func TestLeakyBucketGiveBackNeverReturnsMoreThanTheUnitsHeld(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		lb := LeakyBucket{Rate: int64(1 + rng.IntN(20)), Per: time.Duration(1+rng.IntN(1000)) * time.Millisecond, Capacity: int64(1 + rng.IntN(30))}
		if lb.Validate() != nil {
			continue
		}
		type arrival struct{ t, n int64 }
		var arr []arrival
		t0 := int64(1e12)
		at := t0
		for range 1 + rng.IntN(12) {
			at += int64(rng.IntN(int(lb.Per) * 2 / int(lb.Rate+1)))
			arr = append(arr, arrival{at, int64(1 + rng.IntN(3))})
		}
		own := rng.IntN(len(arr))
		now := arr[len(arr)-1].t + int64(rng.IntN(int(lb.Per)))
		var with, without LeakyBucketState
		var mark int64
		poured := false
		for i, a := range arr {
			lb.Pour(&with, a.t, a.n)
			if i == own {
				mark, poured = with.TAT, true
			} else {
				lb.Pour(&without, a.t, a.n)
			}
		}
		if !poured {
			t.Fatal("no own arrival")
		}
		start := mark - arr[own].n*int64(lb.Per)/lb.Rate // where its units begin
		lb.GiveBack(&with, now, mark, arr[own].n)
		got, want := lb.Level(with, now), lb.Level(without, now)
		if got < want {
			t.Fatalf("trial %d: %+v, arrivals %v, own %d, now %d: level %d after the give-back, %d without the request", trial, lb, arr, own, now, got, want)
		}
		if now < start && got-want > lb.Rate { // exact, but for less than a ns: the units' length is taken in whole ns
			t.Errorf("trial %d: none of the units had leaked, level %d, %d without the request", trial, got, want)
		}
	}
}

// A sliding log gives back the units logged at one instant, no more than
// were logged there, and only while they are in the window: the log then
// counts and releases as if they had never been logged.
func TestSlidingLogGiveBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	checked := 0
	for trial := range 2000 {
		l := SlidingLog{Limit: int64(1 + rng.IntN(20)), Window: time.Duration(1+rng.IntN(100)) * time.Millisecond}
		var with, without SlidingLogState
		t0 := int64(1e12)
		at := t0
		var times []int64
		own := rng.IntN(10)
		var ownAt, ownN int64
		for i := range 10 {
			at += int64(rng.IntN(int(l.Window) / 4))
			n := int64(1 + rng.IntN(3))
			ok, _, _ := l.Allow(&with, at, n)
			if i == own {
				if ok {
					ownAt, ownN = at, n
				}
				continue
			}
			if ok {
				l.Allow(&without, at, n)
			} else {
				// Refused with the own units in: the reference must not
				// take what the log with them did not.
				times = append(times, at)
			}
		}
		if ownN == 0 || len(times) > 0 {
			continue // the own request was refused, or changed what followed
		}
		now := at + int64(rng.IntN(int(l.Window)))
		got := l.GiveBack(&with, now, ownAt, ownN+int64(rng.IntN(2)))
		inWindow := ownAt > now-int64(l.Window)
		if inWindow && got != ownN || !inWindow && got != 0 {
			t.Fatalf("trial %d: gave back %d of %d logged at %d (now %d, window %v)", trial, got, ownN, ownAt, now, l.Window)
		}
		for _, n := range []int64{1, l.Limit} {
			if a, b := l.Release(&with, now, n), l.Release(&without, now, n); a != b {
				t.Fatalf("trial %d: release of %d: %d after the give-back, %d without the request", trial, n, a, b)
			}
		}
		if a, b := l.Count(&with, now), l.Count(&without, now); a != b {
			t.Fatalf("trial %d: count %d after the give-back, %d without the request", trial, a, b)
		}
		if l.GiveBack(&with, now, ownAt+1, 1) != 0 && !slices.Contains(loggedAt(&with), ownAt+1) {
			t.Fatalf("trial %d: an instant nothing was logged at gave units back", trial)
		}
		checked++
	}
	if checked < 200 {
		t.Errorf("only %d of 2,000 trials checked", checked)
	}
}

// loggedAt returns the instants of s's entries.
func loggedAt(s *SlidingLogState) []int64 {
	var at []int64
	for i := range s.size {
		at = append(at, s.at(i).at)
	}
	return at
}
