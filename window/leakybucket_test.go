package window_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/window"
)

// TestLeakyBucketSeedTable runs the textbook token-bucket table through the
// meter with Capacity 20 leaking 10/s: the same decisions, and the GCRA state
// (the theoretical arrival time) after each row.
func TestLeakyBucketSeedTable(t *testing.T) {
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
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
	var st window.LeakyBucketState // zero: an empty bucket
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
		lb            window.LeakyBucket
		steps         [][2]int64 // {now, n}
		wantOK        bool       // of the last step
		wantRemaining int64
		wantRelease   int64
		wantState     window.LeakyBucketState
	}{
		{
			name:   "full bucket refuses until one unit has leaked",
			lb:     window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {10 * ms, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 100 * ms,
			wantState: window.LeakyBucketState{TAT: 500 * ms},
		},
		{
			name:   "n units wait for n units of room",
			lb:     window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {150 * ms, 4}},
			wantOK: false, wantRemaining: 1, wantRelease: 400 * ms,
			wantState: window.LeakyBucketState{TAT: 500 * ms},
		},
		{
			name:   "an emptied bucket restarts from now",
			lb:     window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 5}, {10_000 * ms, 2}},
			wantOK: true, wantRemaining: 3, wantRelease: 10_000 * ms,
			wantState: window.LeakyBucketState{TAT: 10_200 * ms},
		},
		{
			name:   "n above Capacity never fits",
			lb:     window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{0, 6}},
			wantOK: false, wantRemaining: 5, wantRelease: math.MaxInt64,
		},
		{
			name:   "3 per second keeps the third of a nanosecond",
			lb:     window.LeakyBucket{Rate: 3, Per: time.Second, Capacity: 1},
			steps:  [][2]int64{{0, 1}, {0, 1}},
			wantOK: false, wantRemaining: 0, wantRelease: 333_333_334,
			wantState: window.LeakyBucketState{TAT: 333_333_333, Frac: 1},
		},
		{
			name:   "3 per second: the fractions add up to exactly 1 s",
			lb:     window.LeakyBucket{Rate: 3, Per: time.Second, Capacity: 3},
			steps:  [][2]int64{{0, 1}, {0, 1}, {0, 1}},
			wantOK: true, wantRemaining: 0, wantRelease: 333_333_334,
			wantState: window.LeakyBucketState{TAT: 1_000_000_000, Frac: 0},
		},
		{
			name:   "a clock that steps back sees a fuller bucket",
			lb:     window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 5},
			steps:  [][2]int64{{1000 * ms, 3}, {900 * ms, 3}},
			wantOK: false, wantRemaining: 1, wantRelease: 1100 * ms,
			wantState: window.LeakyBucketState{TAT: 1300 * ms},
		},
	}
	for _, tt := range tests {
		var st window.LeakyBucketState
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

// TestLeakyBucketMatchesTokenBucket checks the meter against the token bucket
// (itself checked against an exact rational model) on random sequences: as a
// meter the leaky bucket of Capacity C is the token bucket of Burst C.
func TestLeakyBucketMatchesTokenBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(0x1eaf, 1))
	pers := []time.Duration{time.Second, 100 * time.Millisecond, 3 * time.Second, time.Minute, 7}
	for trial := range 400 {
		rate, per, capacity := 1+rng.Int64N(50), pers[rng.IntN(len(pers))], 1+rng.Int64N(30)
		lb := window.LeakyBucket{Rate: rate, Per: per, Capacity: capacity}
		tb := window.TokenBucket{Rate: rate, Per: per, Burst: capacity}
		interval := max(1, int64(per)/rate)
		var ls window.LeakyBucketState
		var ts window.TokenBucketState
		now := int64(0)
		for range 300 {
			now += algGap(rng, interval, capacity)
			n := 1 + rng.Int64N(3)
			lok, lrem, lrel := lb.Allow(&ls, now, n)
			tok, trem, trel := tb.Allow(&ts, now, n)
			if lok != tok || lrem != trem || lrel != trel {
				t.Fatalf("trial %d %+v: Allow(%d, %d) = (%v, %d, %d), token bucket (%v, %d, %d)",
					trial, lb, now, n, lok, lrem, lrel, tok, trem, trel)
			}
			if lrel != math.MaxInt64 {
				if probe := ls; !algOK(lb.Allow(&probe, lrel, n)) {
					t.Fatalf("trial %d %+v: Allow(%d) at release %d from %+v refused", trial, lb, n, lrel, ls)
				}
				if probe := ls; lrel > now && algOK(lb.Allow(&probe, lrel-1, n)) {
					t.Fatalf("trial %d %+v: Allow(%d) at release−1 %d from %+v admitted", trial, lb, n, lrel-1, ls)
				}
			}
		}
	}
}

func TestLeakyBucketValidate(t *testing.T) {
	tests := []struct {
		lb   window.LeakyBucket
		want []string
	}{
		{window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}, nil},
		{window.LeakyBucket{Rate: -1, Per: time.Second, Capacity: 20}, []string{"LeakyBucket.Rate -1"}},
		{window.LeakyBucket{Rate: 1, Per: 0, Capacity: 20}, []string{"LeakyBucket.Per 0s"}},
		{window.LeakyBucket{Rate: 1, Per: time.Second}, []string{"LeakyBucket.Capacity 0"}},
		{window.LeakyBucket{Rate: 1, Per: 24 * time.Hour, Capacity: 1_000_000}, []string{"Capacity 1000000 × Per 24h0m0s overflows"}},
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
	for _, lb := range []window.LeakyBucket{{}, {Rate: 1}, {Per: time.Second}, {Capacity: 1}, {Rate: -1, Per: -1, Capacity: -1}} {
		var st window.LeakyBucketState
		ok, remaining, release := lb.Allow(&st, 1, 1)
		if ok || remaining != 0 || release != math.MaxInt64 || lb.Remaining(st, 1) != 0 || lb.Release(st, 1, 1) != math.MaxInt64 {
			t.Errorf("%+v.Allow(1, 1) = (%v, %d, %d), want (false, 0, MaxInt64)", lb, ok, remaining, release)
		}
	}
}

func TestLeakyQueueEnqueue(t *testing.T) {
	ms := int64(time.Millisecond)
	type step struct {
		now    int64
		wantAt int64
		wantOK bool
	}
	tests := []struct {
		name  string
		lq    window.LeakyQueue
		steps []step
	}{
		{
			name: "backlog of 3 at 10/s",
			lq:   window.LeakyQueue{Rate: 10, Per: time.Second, Backlog: 3},
			steps: []step{
				{0, 0, true},                // served at once
				{0, 100 * ms, true},         // waiting: 1
				{0, 200 * ms, true},         // waiting: 2
				{0, 300 * ms, true},         // waiting: 3, full
				{0, 100 * ms, false},        // retry when the 100 ms one has left
				{99 * ms, 100 * ms, false},  // still full a millisecond before
				{100 * ms, 400 * ms, true},  // 200 and 300 ms waiting: room for one
				{100 * ms, 200 * ms, false}, // full again
				{1000 * ms, 1000 * ms, true},
			},
		},
		{
			name: "no backlog: spacing only",
			lq:   window.LeakyQueue{Rate: 10, Per: time.Second},
			steps: []step{
				{0, 0, true},
				{50 * ms, 100 * ms, false},
				{100 * ms, 100 * ms, true},
				{150 * ms, 200 * ms, false},
				{250 * ms, 250 * ms, true},
			},
		},
		{
			name: "3 per second: service instants ⌈k/3 s⌉ with no drift",
			lq:   window.LeakyQueue{Rate: 3, Per: time.Second, Backlog: 5},
			steps: []step{
				{0, 0, true},
				{0, 333_333_334, true},
				{0, 666_666_667, true},
				{0, 1_000_000_000, true},
				{0, 1_333_333_334, true},
				{0, 1_666_666_667, true},
				{0, 333_333_334, false}, // 5 waiting; room once the first of them is served
			},
		},
	}
	for _, tt := range tests {
		var st window.LeakyQueueState
		for i, s := range tt.steps {
			at, ok := tt.lq.Enqueue(&st, s.now)
			if at != s.wantAt || ok != s.wantOK {
				t.Errorf("%s, step %d: Enqueue(%v) = (%v, %v), want (%v, %v)", tt.name, i,
					time.Duration(s.now), time.Duration(at), ok, time.Duration(s.wantAt), s.wantOK)
			}
		}
	}
}

func TestLeakyQueueWaiting(t *testing.T) {
	lq := window.LeakyQueue{Rate: 10, Per: time.Second, Backlog: 10}
	var st window.LeakyQueueState
	for range 4 {
		lq.Enqueue(&st, 0) // served at 0, 100, 200, 300 ms
	}
	ms := int64(time.Millisecond)
	for _, tt := range []struct{ now, want int64 }{{0, 3}, {99 * ms, 3}, {100 * ms, 2}, {299 * ms, 1}, {300 * ms, 0}, {5000 * ms, 0}} {
		if got := lq.Waiting(st, tt.now); got != tt.want {
			t.Errorf("Waiting(%v) = %d, want %d", time.Duration(tt.now), got, tt.want)
		}
	}
}

// TestLeakyQueueProperties runs seeded random arrival sequences through random
// queues and checks each against a model in exact scaled integers, and that
// the output never exceeds the leak rate: any k+1 consecutive services span
// at least k·Per/Rate.
func TestLeakyQueueProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(0x9ee, 2))
	pers := []time.Duration{time.Second, 100 * time.Millisecond, 3 * time.Second, time.Minute, 7}
	for trial := range 300 {
		lq := window.LeakyQueue{Rate: 1 + rng.Int64N(50), Per: pers[rng.IntN(len(pers))], Backlog: rng.Int64N(20)}
		interval := max(1, int64(lq.Per)/lq.Rate)
		var st window.LeakyQueueState
		// The model, in units of 1/Rate ns: each service instant is
		// max(arrival, previous + Per).
		var served []int64 // scaled service instants of admitted requests
		var at []int64     // what Enqueue returned for them
		now := int64(0)
		for range 300 {
			now += algGap(rng, interval, lq.Backlog+1)
			scaledNow := now * lq.Rate
			next := scaledNow
			if len(served) > 0 {
				next = max(next, served[len(served)-1]+int64(lq.Per))
			}
			waiting := int64(0)
			for k := len(served) - 1; k >= 0 && served[k] > scaledNow; k-- {
				waiting++
			}
			wantOK := next == scaledNow || waiting < lq.Backlog
			if got := lq.Waiting(st, now); got != waiting {
				t.Fatalf("trial %d %+v: Waiting(%d) = %d, model %d", trial, lq, now, got, waiting)
			}
			gotAt, ok := lq.Enqueue(&st, now)
			if ok != wantOK {
				t.Fatalf("trial %d %+v: Enqueue(%d) ok = %v, model %v (waiting %d)", trial, lq, now, ok, wantOK, waiting)
			}
			if !ok {
				// The retry instant is exact: refused a nanosecond before, admitted at it.
				if probe := st; gotAt <= now || !algEnqueued(lq.Enqueue(&probe, gotAt)) {
					t.Fatalf("trial %d %+v: refused at %d, retry %d is not admitted", trial, lq, now, gotAt)
				}
				if probe := st; gotAt-1 > now && algEnqueued(lq.Enqueue(&probe, gotAt-1)) {
					t.Fatalf("trial %d %+v: refused at %d, admitted at retry−1 %d", trial, lq, now, gotAt-1)
				}
				continue
			}
			if wantAt := (next + lq.Rate - 1) / lq.Rate; gotAt != wantAt {
				t.Fatalf("trial %d %+v: Enqueue(%d) at = %d, model %d", trial, lq, now, gotAt, wantAt)
			}
			served, at = append(served, next), append(at, gotAt)
			if w := lq.Waiting(st, now); w > lq.Backlog {
				t.Fatalf("trial %d %+v: %d waiting after Enqueue(%d), Backlog %d", trial, lq, w, now, lq.Backlog)
			}
		}
		// The output rate: k services after the i-th span at least k·Per/Rate,
		// less under a nanosecond of rounding up each instant.
		exact := int64(lq.Per)%lq.Rate == 0
		for i := range at {
			for j := i + 1; j < len(at); j++ {
				span, k := at[j]-at[i], int64(j-i)
				if exact && k*int64(lq.Per) > lq.Rate*span || !exact && k*int64(lq.Per) > lq.Rate*(span+1)-1 {
					t.Fatalf("trial %d %+v: %d services in %d ns (from %d to %d), faster than the leak rate",
						trial, lq, k+1, span, at[i], at[j])
				}
			}
		}
	}
}

func algEnqueued(_ int64, ok bool) bool { return ok }

func TestLeakyQueueValidate(t *testing.T) {
	tests := []struct {
		lq   window.LeakyQueue
		want []string
	}{
		{window.LeakyQueue{Rate: 10, Per: time.Second, Backlog: 5}, nil},
		{window.LeakyQueue{Rate: 10, Per: time.Second}, nil},
		{window.LeakyQueue{Rate: 0, Per: time.Second}, []string{"LeakyQueue.Rate 0"}},
		{window.LeakyQueue{Rate: 1, Per: -time.Minute}, []string{"LeakyQueue.Per -1m0s"}},
		{window.LeakyQueue{Rate: 1, Per: time.Second, Backlog: -2}, []string{"LeakyQueue.Backlog -2"}},
		{window.LeakyQueue{Rate: 1, Per: time.Hour, Backlog: math.MaxInt64}, []string{"Backlog 9223372036854775807 × Per 1h0m0s overflows"}},
	}
	for _, tt := range tests {
		algCheckProblems(t, fmt.Sprintf("%+v", tt.lq), tt.lq.Validate(), tt.want)
	}
}

func TestLeakyQueueInvalidDoesNotPanic(t *testing.T) {
	for _, lq := range []window.LeakyQueue{{}, {Rate: 1}, {Per: time.Second}, {Rate: -1, Per: -1, Backlog: -1}} {
		var st window.LeakyQueueState
		if at, ok := lq.Enqueue(&st, 1); ok || at != math.MaxInt64 || lq.Waiting(st, 1) != 0 {
			t.Errorf("%+v.Enqueue(1) = (%d, %v), want (MaxInt64, false)", lq, at, ok)
		}
	}
}

func TestLeakyAllocs(t *testing.T) {
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	lq := window.LeakyQueue{Rate: 10, Per: time.Second, Backlog: 20}
	var bs window.LeakyBucketState
	var qs window.LeakyQueueState
	now := algWall(10, 0, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		lb.Allow(&bs, now, 1)
		lb.Remaining(bs, now)
		lb.Release(bs, now, 1)
		lq.Enqueue(&qs, now)
		lq.Waiting(qs, now)
	})
	if allocs != 0 {
		t.Errorf("allocs per call round = %v, want 0", allocs)
	}
}

func BenchmarkLeakyBucketAllow(b *testing.B) {
	lb := window.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	var st window.LeakyBucketState
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		lb.Allow(&st, now, 1)
	}
}

func BenchmarkLeakyBucketRemaining(b *testing.B) {
	lb := window.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	st := window.LeakyBucketState{TAT: algWall(10, 0, 1)}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		lb.Remaining(st, now)
	}
}

func BenchmarkLeakyBucketRelease(b *testing.B) {
	lb := window.LeakyBucket{Rate: 100, Per: time.Second, Capacity: 200}
	st := window.LeakyBucketState{TAT: algWall(10, 0, 2)}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		lb.Release(st, now, 1)
	}
}

func BenchmarkLeakyQueueEnqueue(b *testing.B) {
	lq := window.LeakyQueue{Rate: 100, Per: time.Second, Backlog: 50}
	var st window.LeakyQueueState
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		lq.Enqueue(&st, now)
	}
}

func BenchmarkLeakyQueueWaiting(b *testing.B) {
	lq := window.LeakyQueue{Rate: 100, Per: time.Second, Backlog: 50}
	st := window.LeakyQueueState{Next: algWall(10, 0, 0) + int64(300*time.Millisecond)}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		lq.Waiting(st, now)
	}
}

// A meter: 10 per second with room for a burst of 20, nothing queued.
func ExampleLeakyBucket_Allow() {
	lb := window.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	var st window.LeakyBucketState // one per key; zero is an empty bucket

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

// A queue: a burst is smoothed to one request every 100 ms, with at most 3
// waiting.
func ExampleLeakyQueue_Enqueue() {
	lq := window.LeakyQueue{Rate: 10, Per: time.Second, Backlog: 3}
	var st window.LeakyQueueState // one per key; zero is an idle queue

	for range 5 {
		at, ok := lq.Enqueue(&st, 0)
		if ok {
			fmt.Println("serve at", time.Duration(at))
		} else {
			fmt.Println("queue full, retry at", time.Duration(at))
		}
	}
	// Output:
	// serve at 0s
	// serve at 100ms
	// serve at 200ms
	// serve at 300ms
	// queue full, retry at 100ms
}

// FuzzLeakyBucket drives a meter, the token bucket of the same shape and a
// queue with arbitrary configurations (valid or not) and instants: nothing
// panics, release instants are never before now, and for valid
// configurations the meter and the token bucket agree and a release instant
// admits.
func FuzzLeakyBucket(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(20), []byte{0, 1, 1, 1, 2, 25})
	f.Add(int64(3), int64(time.Second), int64(1), []byte{0, 0, 1, 200, 0, 1})
	f.Add(int64(-1), int64(0), int64(-5), []byte{255, 255, 255})
	f.Add(int64(1), int64(math.MaxInt64), int64(math.MaxInt64), []byte{7, 7, 7})
	f.Fuzz(func(t *testing.T, rate, per, capacity int64, ops []byte) {
		lb := window.LeakyBucket{Rate: rate, Per: time.Duration(per), Capacity: capacity}
		tb := window.TokenBucket{Rate: rate, Per: time.Duration(per), Burst: capacity}
		lq := window.LeakyQueue{Rate: rate, Per: time.Duration(per), Backlog: capacity}
		valid := lb.Validate() == nil && tb.Validate() == nil
		var ls window.LeakyBucketState
		var ts window.TokenBucketState
		var qs window.LeakyQueueState
		now := int64(0)
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * min(max(1, per/200), 1<<40)
			if now > 1<<62 { // a clock of Unix nanoseconds stays far from overflow
				break
			}
			n := int64(ops[i+1]%8) - 1
			lok, lrem, lrel := lb.Allow(&ls, now, n)
			tok, trem, trel := tb.Allow(&ts, now, n)
			at, qok := lq.Enqueue(&qs, now)
			if lrel < now || trel < now || at < now || lrem < 0 || trem < 0 || lq.Waiting(qs, now) < 0 {
				t.Fatalf("%+v at %d, n %d: meter (%v, %d, %d), bucket (%v, %d, %d), queue (%d, %v)",
					lb, now, n, lok, lrem, lrel, tok, trem, trel, at, qok)
			}
			if !valid {
				continue
			}
			if lok != tok || lrem != trem || lrel != trel {
				t.Fatalf("%+v at %d, n %d: meter (%v, %d, %d), token bucket (%v, %d, %d)", lb, now, n, lok, lrem, lrel, tok, trem, trel)
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
	lb := window.LeakyBucket{Rate: 1, Per: 8e18, Capacity: 1}
	if err := lb.Validate(); err == nil {
		t.Error("Validate accepted a bucket that drains in 253 years")
	}
	now := int64(1.7e18)
	var s window.LeakyBucketState
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
