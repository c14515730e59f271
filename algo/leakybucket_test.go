package algo_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
)

// TestLeakyBucketRefillTable runs TestTokenBucketRefillTable's table through the
// meter with Capacity 20 leaking 10/s: the same decisions, and the GCRA state
// (the theoretical arrival time) after each row.
func TestLeakyBucketRefillTable(t *testing.T) {
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	ms := int64(time.Millisecond)
	rows := []struct {
		now                       int64
		requests                  int
		wantAllowed, wantRejected int
		wantRoom                  int64
		wantTAT                   int64
	}{
		{0, 1, 1, 0, 19, 100 * ms},
		{100 * ms, 1, 1, 0, 19, 200 * ms},
		{100 * ms, 25, 19, 6, 0, 2100 * ms},
		{2100 * ms, 1, 1, 0, 19, 2200 * ms},
	}
	var st algo.LeakyBucketState // zero: an empty bucket
	for _, row := range rows {
		allowed, rejected := 0, 0
		for range row.requests {
			if ok, _, _ := lb.Allow(&st, row.now, 1); ok {
				allowed++
			} else {
				rejected++
			}
		}
		room := lb.Remaining(st, row.now)
		if allowed != row.wantAllowed || rejected != row.wantRejected || room != row.wantRoom || st.TAT != row.wantTAT || st.Frac != 0 {
			t.Errorf("t=%v, %d requests: allowed %d, rejected %d, room %d, state %+v; want %d, %d, %d, {TAT:%d Frac:0}",
				time.Duration(row.now), row.requests, allowed, rejected, room, st,
				row.wantAllowed, row.wantRejected, row.wantRoom, row.wantTAT)
		}
	}
}

func TestLeakyBucketAllow(t *testing.T) {
	ms := int64(time.Millisecond)
	tests := []struct {
		name          string
		lb            algo.LeakyBucket
		steps         [][2]int64 // {now, n}
		wantOK        bool       // of the last step
		wantRemaining int64
		wantRelease   int64
		wantState     algo.LeakyBucketState
	}{
		{
			name:   "full bucket refuses until one unit has leaked",
			lb:     algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {10 * ms, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 100 * ms,
			wantState: algo.LeakyBucketState{TAT: 500 * ms},
		},
		{
			name:   "n units wait for n units of room",
			lb:     algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {150 * ms, 4}},
			wantOK: false, wantRemaining: 1, wantRelease: 400 * ms,
			wantState: algo.LeakyBucketState{TAT: 500 * ms},
		},
		{
			name:   "an emptied bucket restarts from now",
			lb:     algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {10_000 * ms, 2}},
			wantOK: true, wantRemaining: 3, wantRelease: 10_000 * ms,
			wantState: algo.LeakyBucketState{TAT: 10_200 * ms},
		},
		{
			name:   "n above Capacity never fits",
			lb:     algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 6}},
			wantOK: false, wantRemaining: 5, wantRelease: math.MaxInt64,
		},
		{
			name:   "3 per second keeps the third of a nanosecond",
			lb:     algo.LeakyBucket{Rate: 3, Per: time.Second, Capacity: 1},
			steps:  [][2]int64{{0, 1}, {0, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 333_333_334,
			wantState: algo.LeakyBucketState{TAT: 333_333_333, Frac: 1},
		},
		{
			name:   "3 per second: the fractions add up to exactly 1 s",
			lb:     algo.LeakyBucket{Rate: 3, Per: time.Second, Capacity: 3},
			steps:  [][2]int64{{0, 1}, {0, 1}, {0, 1}},
			wantOK: true, wantRemaining: 0, wantRelease: 333_333_334,
			wantState: algo.LeakyBucketState{TAT: 1_000_000_000, Frac: 0},
		},
		{
			name:   "a clock that steps back sees a fuller bucket",
			lb:     algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{1000 * ms, 3}, {900 * ms, 3}},
			wantOK: false, wantRemaining: 1, wantRelease: 1100 * ms,
			wantState: algo.LeakyBucketState{TAT: 1300 * ms},
		},
	}
	for _, tt := range tests {
		var st algo.LeakyBucketState
		var ok bool
		var remaining, release int64
		for _, step := range tt.steps {
			ok, remaining, release = tt.lb.Allow(&st, step[0], step[1])
		}
		if ok != tt.wantOK || remaining != tt.wantRemaining || release != tt.wantRelease || st != tt.wantState {
			t.Errorf("%s: last Allow = (%v, %d, %d), state %+v; want (%v, %d, %d), %+v",
				tt.name, ok, remaining, release, st, tt.wantOK, tt.wantRemaining, tt.wantRelease, tt.wantState)
		}
	}
}

func TestLeakyBucketValidate(t *testing.T) {
	tests := []struct {
		lb   algo.LeakyBucket
		want []string
	}{
		{algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}, nil},
		{algo.LeakyBucket{Rate: -1, Per: time.Second, Capacity: 20}, []string{"LeakyBucket.Rate -1"}},
		{algo.LeakyBucket{Rate: 1, Per: 0, Capacity: 20}, []string{"LeakyBucket.Per 0s"}},
		{algo.LeakyBucket{Rate: 1, Per: time.Second}, []string{"LeakyBucket.Capacity 0"}},
		{algo.LeakyBucket{Rate: 1, Per: 24 * time.Hour, Capacity: 1_000_000}, []string{"Capacity 1000000 × Per 24h0m0s overflows"}},
	}
	for _, tt := range tests {
		algCheckProblems(t, fmt.Sprintf("%+v", tt.lb), tt.lb.Validate(), tt.want)
	}
}

// algCheckProblems checks that err lists exactly the problems in want (one
// substring each).
func algCheckProblems(t *testing.T, what string, err error, want []string) {
	t.Helper()
	if (err == nil) != (want == nil) {
		t.Errorf("%s.Validate() = %v, want problems %q", what, err, want)
		return
	}
	if err == nil {
		return
	}
	if got := strings.Count(err.Error(), "\n") + 1; got != len(want) {
		t.Errorf("%s.Validate() = %q: %d problems, want %d", what, err, got, len(want))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s.Validate() = %q, want it to mention %q", what, err, w)
		}
	}
}

func TestLeakyBucketInvalidDoesNotPanic(t *testing.T) {
	for _, lb := range []algo.LeakyBucket{{}, {Rate: 1}, {Per: time.Second}, {Capacity: 1}, {Rate: -1, Per: -1, Capacity: -1}} {
		var st algo.LeakyBucketState
		ok, remaining, release := lb.Allow(&st, 1, 1)
		if ok || remaining != 0 || release != math.MaxInt64 || lb.Remaining(st, 1) != 0 || lb.Release(st, 1, 1) != math.MaxInt64 {
			t.Errorf("%+v.Allow(1, 1) = (%v, %d, %d), want (false, 0, MaxInt64)", lb, ok, remaining, release)
		}
	}
}

func TestLeakyAllocs(t *testing.T) {
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	var bs algo.LeakyBucketState
	now := algWall(10, 0, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		lb.Allow(&bs, now, 1)
		lb.Remaining(bs, now)
		lb.Release(bs, now, 1)
	})
	if allocs != 0 {
		t.Errorf("allocs per call round = %v, want 0", allocs)
	}
}

func BenchmarkLeakyBucketAllow(b *testing.B) {
	lb := algo.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	var st algo.LeakyBucketState
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		lb.Allow(&st, now, 1)
	}
}

func BenchmarkLeakyBucketRemaining(b *testing.B) {
	lb := algo.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	st := algo.LeakyBucketState{TAT: algWall(10, 0, 1)}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		lb.Remaining(st, now)
	}
}

func BenchmarkLeakyBucketRelease(b *testing.B) {
	lb := algo.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	st := algo.LeakyBucketState{TAT: algWall(10, 0, 2)}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		lb.Release(st, now, 1)
	}
}

// A meter: 10 per second with room for a burst of 20, nothing queued.
func ExampleLeakyBucket_Allow() {
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	var st algo.LeakyBucketState // one per key; zero is an empty bucket

	admitted := 0
	var release int64
	for range 25 {
		ok, _, rel := lb.Allow(&st, 0, 1)
		if ok {
			admitted++
		}
		release = rel
	}
	fmt.Println("admitted at once:", admitted)
	fmt.Println("next fits at:", time.Duration(release))
	fmt.Println("bucket empty at:", time.Duration(st.TAT))
	// Output:
	// admitted at once: 20
	// next fits at: 100ms
	// bucket empty at: 2s
}

// FuzzLeakyBucket drives a meter with arbitrary configurations (valid or
// not) and instants: nothing panics, release instants are never before
// now, and for valid configurations a release instant admits.
func FuzzLeakyBucket(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(20), []byte{0, 1, 1, 1, 2, 25})
	f.Add(int64(3), int64(time.Second), int64(1), []byte{0, 0, 1, 200, 0, 1})
	f.Add(int64(-1), int64(0), int64(-5), []byte{255, 255, 255})
	f.Add(int64(1), int64(math.MaxInt64), int64(math.MaxInt64), []byte{7, 7, 7})
	f.Fuzz(func(t *testing.T, rate, per, capacity int64, ops []byte) {
		lb := algo.LeakyBucket{Rate: rate, Per: time.Duration(per), Capacity: capacity}
		valid := lb.Validate() == nil
		var ls algo.LeakyBucketState
		now := int64(0)
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * min(max(1, per/200), 1<<40)
			if now > 1<<62 { // a clock of Unix nanoseconds stays far from overflow
				break
			}
			n := int64(ops[i+1]%8) - 1
			lok, lrem, lrel := lb.Allow(&ls, now, n)
			if lrel < now || lrem < 0 {
				t.Fatalf("%+v at %d, n %d: (%v, %d, %d)", lb, now, n, lok, lrem, lrel)
			}
			if !valid {
				continue
			}
			if probe := ls; lrel != math.MaxInt64 && !algOK(lb.Allow(&probe, lrel, n)) {
				t.Fatalf("%+v at %d: Allow(%d) at release %d refused", lb, now, n, lrel)
			}
		}
	})
}

// A bucket whose drain time would carry the theoretical arrival time past
// int64 is refused by Validate, and Allow saturates instead of wrapping
// (a wrapped TAT admitted a second request into a full bucket).
func TestLeakyBucketHugeDrain(t *testing.T) {
	lb := algo.LeakyBucket{Rate: 1, Per: 8e18, Capacity: 1}
	if err := lb.Validate(); err == nil {
		t.Error("Validate accepted a bucket that drains in 253 years")
	}
	now := int64(1.7e18)
	var s algo.LeakyBucketState
	if ok, _, _ := lb.Allow(&s, now, 1); !ok {
		t.Fatal("first unit refused")
	}
	if s.TAT < now {
		t.Fatalf("TAT %d wrapped below now %d", s.TAT, now)
	}
	if ok, _, _ := lb.Allow(&s, now+1, 1); ok {
		t.Error("a second unit was admitted into a full bucket")
	}
}
