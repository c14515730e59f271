package algo

import (
	"math/rand/v2"
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
