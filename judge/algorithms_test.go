package judge

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

func algorithm(a policy.Algorithm) opt { return func(e *event.Event) { e.Algorithm = a } }
func burstOfN(n uint32) opt            { return func(e *event.Event) { e.Burst = n } }
func delayed(us uint32) opt {
	return func(e *event.Event) { e.Delayed, e.DelayMicros = true, us }
}

var (
	tb  = algorithm(policy.TokenBucket)
	lbk = algorithm(policy.LeakyBucket)
	fw  = algorithm(policy.FixedWindow)
	slg = algorithm(policy.SlidingLog)
)

// TestJudgeAlgorithms judges hand-made traces of every algorithm. ev's
// default rule is 10 per 10 s: a bucket of it refills (leaks) 1 unit a
// second.
func TestJudgeAlgorithms(t *testing.T) {
	zeroLateness := func(c *Config) { c.AllowedLateness = 0 }
	// Delays of a queue serving one a second from 0: the i-th at i s.
	queued := func(n int, stepUs uint32, opts ...opt) []event.Event {
		evs := make([]event.Event, n)
		for i := range evs {
			evs[i] = ev(0, 1, A, append(opts, delayed(uint32(i)*stepUs))...)
		}
		return evs
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		events []event.Event
		want   outcome
	}{
		// Token bucket, rate 1/s.
		{
			name: "token bucket: a burst of Burst, then the rate",
			// 5 at once from a full bucket, then one a second for 10 s;
			// a 6th at 0 and one at 1500 refused (the bucket had none).
			events: cat(burst(0, 5, 0, 1, A, tb, burstOfN(5)), burst(0, 1, 0, 1, L, tb, burstOfN(5)),
				burst(1000, 1, 0, 1, A, tb, burstOfN(5)), burst(1500, 1, 0, 1, L, tb, burstOfN(5)),
				burst(2000, 9, 1000, 1, A, tb, burstOfN(5))),
			want: outcome{Enforced: [3]int64{17, 0, 0}},
		},
		{
			name: "token bucket: 10 at one instant, burst 5",
			// The 6th to the 10th each make the bucket overflow.
			events: burst(0, 10, 0, 1, A, tb, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{10, 5, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "token bucket: twice the rate",
			// 2/s from 0: before the k-th (k from 0) the bucket holds
			// k − k/2 = k/2, so it overflows from k = 9 on: 11 of 20.
			events: burst(0, 20, 500, 1, A, tb, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{20, 11, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "token bucket: wrongly limited",
			// The 4th at 0 refused with 3 of 5 used; after 5 at 10 000
			// (empty again by then) the 6th refused rightly.
			events: cat(burst(0, 3, 0, 1, A, tb, burstOfN(5)), burst(0, 1, 0, 1, L, tb, burstOfN(5)),
				burst(10_000, 5, 0, 1, A, tb, burstOfN(5)), burst(10_000, 1, 0, 1, L, tb, burstOfN(5))),
			want: outcome{Enforced: [3]int64{10, 0, 1}, FalsePositiveKeys: 1},
		},
		{
			name: "token bucket: Burst 0 is Limit",
			// Burst 10: 10 at once fit, the 11th does not.
			events: burst(0, 11, 0, 1, A, tb, burstOfN(0)),
			want:   outcome{Enforced: [3]int64{11, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "token bucket: cost",
			// Burst 5: 3 + 3 is 6 > 5, and the bucket of what was admitted
			// holds 6; 4 s later 2 are left: 2 + 3 fit.
			events: cat(burst(0, 2, 0, 1, A, tb, burstOfN(5), cost(3)), burst(4000, 1, 0, 1, A, tb, burstOfN(5), cost(3))),
			want:   outcome{Enforced: [3]int64{3, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "token bucket: block counts every attempt",
			// Burst 5, block. Key 1: 5 admitted, the 6th starts a block
			// (right), 2 from the cache; at 3000 the edge admits: 8 − 3
			// = 5 attempts in the bucket, 6 with it: wrongly allowed.
			// Key 2: a block started on the 4th attempt: wrongly limited.
			events: cat(
				burst(0, 5, 0, 1, A, tb, burstOfN(5), blockRule),
				burst(0, 1, 0, 1, L, tb, burstOfN(5), blockRule),
				burst(0, 2, 0, 1, L, tb, burstOfN(5), blockRule, fromCache),
				burst(3000, 1, 0, 1, A, tb, burstOfN(5), blockRule),
				burst(0, 3, 0, 2, A, tb, burstOfN(5), blockRule),
				burst(0, 1, 0, 2, L, tb, burstOfN(5), blockRule),
			),
			want: outcome{Enforced: [3]int64{13, 1, 1}, FalseNegativeKeys: 1, FalsePositiveKeys: 1},
		},
		{
			name: "token bucket: a late admission still fills the bucket",
			// Burst 2. 1000, 1000 judged (lateness 0); edge 2's admission
			// at 500 arrives after them: late, poured at 1000. At 2000 the
			// bucket holds 3 − 1 = 2: the admission there overflows it.
			cfg: zeroLateness,
			events: []event.Event{ev(1000, 1, A, tb, burstOfN(2)), ev(1000, 1, A, tb, burstOfN(2)),
				ev(500, 1, A, tb, burstOfN(2), onEdge(2)), ev(2000, 1, A, tb, burstOfN(2))},
			want: outcome{Enforced: [3]int64{3, 1, 0}, Late: 1, FalseNegativeKeys: 1},
		},
		{
			name: "token bucket: arithmetic out of range is invalid",
			// Burst × window overflows int64 nanoseconds (rules refuse it).
			events: []event.Event{ev(0, 1, A, tb, burstOfN(math.MaxUint32), win(math.MaxUint32))},
			want:   outcome{Invalid: 1},
		},

		// Leaky bucket, as a meter and as a queue.
		{
			name:   "leaky bucket: 10 at one instant, capacity 5",
			events: burst(0, 10, 0, 1, A, lbk, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{10, 5, 0}, FalseNegativeKeys: 1},
		},
		{
			name:   "leaky bucket: the rate exactly",
			events: cat(burst(0, 5, 0, 1, A, lbk, burstOfN(5)), burst(1000, 20, 1000, 1, A, lbk, burstOfN(5))),
			want:   outcome{Enforced: [3]int64{25, 0, 0}},
		},
		{
			name: "leaky queue: 10 at once served one a second",
			// Judged at their served times, they go through at the rate.
			events: queued(10, 1_000_000, lbk, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{10, 0, 0}},
		},
		{
			name: "leaky queue: served twice too fast",
			// Served at 0, 0.5, …, 4.5 s: the 10th finds 4.5 in the bucket
			// of 5 and overflows it.
			events: queued(10, 500_000, lbk, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{10, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name:   "leaky queue: the delays ignored, the same burst overflows",
			events: queued(10, 0, lbk, burstOfN(5)),
			want:   outcome{Enforced: [3]int64{10, 5, 0}, FalseNegativeKeys: 1},
		},

		// Fixed window: windows start at multiples of W since the epoch.
		{
			name: "fixed window: the boundary double burst is right",
			// 10 at the end of window 0, 10 at the start of window 1: the
			// fixed window's promise holds (the sliding window's does not:
			// see TestJudgeTraces).
			events: cat(burst(9000, 10, 100, 1, A, fw), burst(10_000, 10, 100, 1, A, fw)),
			want:   outcome{Enforced: [3]int64{20, 0, 0}},
		},
		{
			name: "fixed window: the last instant of a window",
			// 10 at 0..900; 9999 is the 11th of window 0, 10 000 the first
			// of window 1.
			events: cat(burst(0, 10, 100, 1, A, fw), burst(9999, 1, 0, 1, A, fw), burst(10_000, 1, 0, 1, A, fw)),
			want:   outcome{Enforced: [3]int64{12, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "fixed window: refused at the boundary",
			// After 10 in window 0, a refusal at 9950 is right and one at
			// 10 000 (a fresh window) wrong.
			events: cat(burst(9000, 10, 10, 1, A, fw), burst(9950, 1, 0, 1, L, fw), burst(10_000, 1, 0, 1, L, fw)),
			want:   outcome{Enforced: [3]int64{12, 0, 1}, FalsePositiveKeys: 1},
		},
		{
			name: "fixed window: aligned to the epoch, not to the first event",
			// Window 7 s, limit 2: t0 is 6 s into its window, which ends at
			// 1000. Two at 0 and 500, two at 1000 and 1500: all right. Had
			// windows started at the first event, 1000 would be the 3rd.
			events: cat(burst(0, 2, 500, 1, A, fw, win(7000), limit(2)), burst(1000, 2, 500, 1, A, fw, win(7000), limit(2))),
			want:   outcome{Enforced: [3]int64{4, 0, 0}},
		},
		{
			name: "fixed window: block",
			// Limit 5, block: 5 admitted, the 6th starts a block, two from
			// the cache; at 5000 the edge admits an 9th attempt: wrong. In
			// window 1 a block starts on the first attempt: wrong.
			events: cat(
				burst(0, 5, 100, 1, A, fw, limit(5), blockRule),
				burst(500, 1, 0, 1, L, fw, limit(5), blockRule),
				burst(600, 2, 100, 1, L, fw, limit(5), blockRule, fromCache),
				burst(5000, 1, 0, 1, A, fw, limit(5), blockRule),
				burst(10_000, 1, 0, 1, L, fw, limit(5), blockRule),
			),
			want: outcome{Enforced: [3]int64{10, 1, 1}, FalseNegativeKeys: 1, FalsePositiveKeys: 1},
		},

		// Sliding log: the same truth as the sliding window.
		{
			name:   "sliding log: just over the limit",
			events: burst(0, 11, 100, 1, A, slg),
			want:   outcome{Enforced: [3]int64{11, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name:   "sliding log: the window slides exactly",
			events: cat(burst(0, 10, 100, 1, A, slg), burst(10_000, 1, 0, 1, A, slg), burst(10_050, 1, 0, 1, A, slg)),
			want:   outcome{Enforced: [3]int64{12, 1, 0}, FalseNegativeKeys: 1},
		},

		// A key whose rule changes algorithm.
		{
			name: "a new algorithm starts the key afresh",
			// A token bucket of 5 is full at 0; the rule becomes a fixed
			// window of 10: ten more in window 0 are right under it.
			events: cat(burst(0, 5, 0, 1, A, tb, burstOfN(5)), burst(100, 10, 10, 1, A, fw)),
			want:   outcome{Enforced: [3]int64{15, 0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, tt.cfg, tt.events)
			if got := outcomeOf(r); got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestBucketRatio checks the ratio of a bucket's worst key: the units of the
// busy period over Burst + rate × its length.
func TestBucketRatio(t *testing.T) {
	tests := []struct {
		name   string
		events []event.Event
		fn, fp float64 // worst false negative, false positive ratio (0: none)
	}{
		// 10 at once in a bucket of 5: twice what it holds.
		{"an instant burst", burst(0, 10, 0, 1, A, tb, burstOfN(5)), 2, 0},
		// 2/s for 10 s: 20 admitted over 9.5 s, promised 5 + 9.5.
		{"twice the rate", burst(0, 20, 500, 1, A, tb, burstOfN(5)), 20 / 14.5, 0},
		// 3 of 5 used, the 4th refused: 4/5.
		{"refused with room", cat(burst(0, 3, 0, 1, A, tb, burstOfN(5)), burst(0, 1, 0, 1, L, tb, burstOfN(5))), 0, 0.8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, nil, tt.events)
			check := func(kind string, ks []Key, want float64) {
				t.Helper()
				if want == 0 {
					if len(ks) != 0 {
						t.Errorf("%s: got %+v, want none", kind, ks)
					}
					return
				}
				if len(ks) != 1 || math.Abs(ks[0].Ratio-want) > 1e-12 {
					t.Errorf("%s: got %+v, want one key at ratio %v", kind, ks, want)
				}
			}
			check("false negatives", r.TopFalseNegatives, tt.fn)
			check("false positives", r.TopFalsePositives, tt.fp)
		})
	}
	// The overshoot of the instant burst: 6/5, 7/5, …, 10/5.
	r := run(t, nil, burst(0, 10, 0, 1, A, tb, burstOfN(5)))
	var got []int64
	for _, b := range r.Overshoot {
		got = append(got, b.Count)
	}
	// (1, 1.05] (1.05, 1.1] (1.1, 1.15] (1.15, 1.25] (1.25, 1.5] (1.5, 2] (2, 4] (4, ∞)
	if want := []int64{0, 0, 0, 1, 1, 3, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("overshoot: got %v, want %v", got, want)
	}
}

// TestByAlgorithm checks the per-algorithm breakdown, and that the same
// trace is judged by each algorithm's own truth.
func TestByAlgorithm(t *testing.T) {
	// The boundary double burst under each algorithm, one key each.
	var events []event.Event
	for k, a := range []policy.Algorithm{policy.SlidingWindow, policy.FixedWindow,
		policy.TokenBucket, policy.LeakyBucket, policy.SlidingLog} {
		events = append(events, cat(burst(9000, 10, 100, uint64(k+1), A, algorithm(a)), burst(10_000, 10, 100, uint64(k+1), A, algorithm(a)))...)
	}
	r := run(t, nil, events)
	var got []string
	var tallies [][3]int64
	for _, b := range r.ByAlgorithm {
		got = append(got, b.Name)
		tallies = append(tallies, tri(b.Enforced))
	}
	if want := []string{"fixed_window", "leaky_bucket", "sliding_log", "sliding_window", "token_bucket"}; !slices.Equal(got, want) {
		t.Fatalf("algorithm rows: got %v, want %v", got, want)
	}
	// Sliding: each of the second ten is over 10 in 10 s. Fixed: none.
	// Buckets of 10 leaking 1/s: the first ten, 0.1 s apart, leave 9.1
	// at 9900 and 9 at 10 000, where the 11th just fits; each later one
	// finds 9.9 or more: 9 overflow.
	want := [][3]int64{{20, 0, 0}, {20, 9, 0}, {20, 10, 0}, {20, 10, 0}, {20, 9, 0}}
	if !slices.Equal(tallies, want) {
		t.Errorf("tallies: got %v, want %v", tallies, want)
	}
}

// TestVersion1Event judges events decoded from the version 1 encoding,
// which has no algorithm: they are sliding-window decisions.
func TestVersion1Event(t *testing.T) {
	v1 := func(atMs int64, d event.Admission) event.Event {
		b := []byte{event.VersionV1, 0}
		if d == event.Limited {
			b[1] = 1
		}
		b = binary.BigEndian.AppendUint64(b, uint64(t0+atMs*ms))
		b = binary.BigEndian.AppendUint64(b, 1) // key hash
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(0))
		b = binary.AppendUvarint(b, 1)      // edge
		b = binary.AppendUvarint(b, 1)      // cost
		b = binary.AppendUvarint(b, 10)     // limit
		b = binary.AppendUvarint(b, 10_000) // window, ms
		b = append(b, 3, 'a', 'p', 'i')
		var e event.Event
		if err := event.Decode(b, &e); err != nil {
			t.Fatalf("decode version 1: %v", err)
		}
		if e.Algorithm != policy.SlidingWindow || e.Burst != 10 {
			t.Fatalf("version 1 decoded as %v, burst %d; want sliding_window, burst 10", e.Algorithm, e.Burst)
		}
		return e
	}
	// The fixed-window double burst: wrong under the sliding window.
	var events []event.Event
	for i := range int64(10) {
		events = append(events, v1(9000+100*i, A))
	}
	for i := range int64(10) {
		events = append(events, v1(10_000+100*i, A))
	}
	r := run(t, nil, events)
	if got, want := outcomeOf(r), (outcome{Enforced: [3]int64{20, 10, 0}, FalseNegativeKeys: 1}); got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if len(r.ByAlgorithm) != 1 || r.ByAlgorithm[0].Name != "sliding_window" {
		t.Errorf("algorithm rows: got %+v, want sliding_window only", r.ByAlgorithm)
	}
}

// TestDelayedWatermark checks that a delay does not move the watermark: the
// served time of a delayed event is in the edge's future.
func TestDelayedWatermark(t *testing.T) {
	j := newJudge(t, nil) // lateness 2 s
	j.Add(0, ev(0, 1, A, lbk, delayed(60_000_000)), ev(1000, 2, A))
	if got := j.Buffered(); got != 2 {
		t.Errorf("buffered: got %d, want 2 (nothing behind a watermark at -1 s)", got)
	}
	j.Add(0, ev(3500, 3, A)) // the watermark reaches 1500: key 2's event
	if got := j.Buffered(); got != 2 {
		t.Errorf("buffered: got %d, want 2 (the delayed one waits for 60 000)", got)
	}
	j.Flush()
	if got := outcomeOf(j.Report()); got != (outcome{Enforced: [3]int64{3, 0, 0}}) {
		t.Errorf("got %+v", got)
	}
}

// TestBucketKeyExpiry checks that a bucket's state lives as long as a full
// bucket takes to drain when that is longer than its window, and holds no
// log entries.
func TestBucketKeyExpiry(t *testing.T) {
	zero := func(c *Config) { c.AllowedLateness = 0 }
	// Burst 50 leaking 10 a second: 5 s to drain, so key 1 (last at 0)
	// expires at 10 000, not at 2000 (two windows).
	b := []opt{tb, burstOfN(50), win(1000)}
	r := run(t, zero, []event.Event{ev(0, 1, A, b...), ev(9999, 2, A, win(1000)), ev(9999, 3, A, b...)})
	if r.Keys != 3 || r.KeysEvicted["idle"] != 0 || r.LogEntries != 2 {
		t.Errorf("at 9999: keys %d, idle evictions %d, log entries %d; want 3, 0, 2", r.Keys, r.KeysEvicted["idle"], r.LogEntries)
	}
	r = run(t, zero, []event.Event{ev(0, 1, A, b...), ev(10_000, 2, A, win(1000))})
	if r.Keys != 1 || r.KeysEvicted["idle"] != 1 {
		t.Errorf("at 10 000: keys %d, idle evictions %d; want 1, 1", r.Keys, r.KeysEvicted["idle"])
	}
	// Its history mattered until 5000: an event of key 1 before that,
	// arriving once it has expired, is late.
	r = run(t, zero, []event.Event{ev(0, 1, A, b...), ev(10_000, 2, A, win(1000)), ev(4000, 1, A, b...)})
	if r.Late != 1 {
		t.Errorf("late: got %d, want 1", r.Late)
	}
}

// TestBucketMatchesDefinition replays random token-bucket traces and checks
// every verdict against the promise itself: an admission is wrong iff, with
// it, the admissions over some interval [s, t] ending at it exceed Burst +
// rate × (t − s); a refusal is wrong iff no interval of attempts does.
func TestBucketMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var totalAllowed, totalLimited int64
	defer func() {
		if totalAllowed == 0 || totalLimited == 0 {
			t.Errorf("the traces have %d wrongly allowed, %d wrongly limited: want some of each", totalAllowed, totalLimited)
		}
	}()
	for trial := range 200 {
		lim := uint32(1 + rng.IntN(20))
		windowMs := uint32(100 * (1 + rng.IntN(50)))
		burst := uint32(1 + rng.IntN(30))
		block := rng.IntN(4) == 0
		n := 1 + rng.IntN(80)
		var events []event.Event
		at := int64(0)
		for range n {
			at += int64(rng.IntN(int(windowMs) / 2))
			d := event.Allowed
			if rng.IntN(3) == 0 {
				d = event.Limited
			}
			e := ev(at, 1, d, tb, limit(lim), win(windowMs), burstOfN(burst), cost(uint32(1+rng.IntN(3))))
			if block {
				e.Action = policy.Block
			}
			events = append(events, e)
		}
		// Per = W ns: units × W > Burst × W + Limit × (t − s) is the
		// promise broken, in integers.
		w := int64(windowMs) * ms
		breaks := func(k int, admittedOnly bool) bool {
			var units int64
			for j := k; j >= 0; j-- {
				if j < k && admittedOnly && events[j].Decision != event.Allowed {
					continue
				}
				units += int64(events[j].Cost)
				if units*w > int64(burst)*w+int64(lim)*(events[k].Time-events[j].Time) {
					return true
				}
			}
			return false
		}
		var wantAllowed, wantLimited int64
		for k, e := range events {
			switch {
			case block && e.Decision == event.Allowed && breaks(k, false):
				wantAllowed++
			case block && e.Decision == event.Limited && !breaks(k, false):
				wantLimited++
			case !block && e.Decision == event.Allowed && breaks(k, true):
				wantAllowed++
			case !block && e.Decision == event.Limited && !breaks(k, false):
				wantLimited++
			}
		}
		totalAllowed, totalLimited = totalAllowed+wantAllowed, totalLimited+wantLimited
		r := run(t, nil, events)
		if r.Enforced.WronglyAllowed != wantAllowed || r.Enforced.WronglyLimited != wantLimited {
			t.Fatalf("trial %d (limit %d per %d ms, burst %d, block %v): wrongly allowed, limited %d, %d; want %d, %d",
				trial, lim, windowMs, burst, block, r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited, wantAllowed, wantLimited)
		}
	}
}

// TestFixedMatchesDefinition replays random fixed-window traces, with
// windows that do not divide t0, against a count per ⌊t / W⌋.
func TestFixedMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var totalAllowed, totalLimited int64
	defer func() {
		if totalAllowed == 0 || totalLimited == 0 {
			t.Errorf("the traces have %d wrongly allowed, %d wrongly limited: want some of each", totalAllowed, totalLimited)
		}
	}()
	for trial := range 200 {
		lim := uint32(1 + rng.IntN(10))
		windowMs := uint32(100 + rng.IntN(5000))
		var events []event.Event
		at := int64(0)
		for range 1 + rng.IntN(80) {
			at += int64(rng.IntN(int(windowMs) / 4))
			d := event.Allowed
			if rng.IntN(3) == 0 {
				d = event.Limited
			}
			events = append(events, ev(at, 1, d, fw, limit(lim), win(windowMs)))
		}
		w := int64(windowMs) * ms
		admitted, attempts := map[int64]int64{}, map[int64]int64{}
		var wantAllowed, wantLimited int64
		for _, e := range events {
			k := e.Time / w // the window's index since the epoch (times are > 0)
			attempts[k]++
			if e.Decision == event.Allowed {
				admitted[k]++
				if admitted[k] > int64(lim) {
					wantAllowed++
				}
			} else if attempts[k] <= int64(lim) {
				wantLimited++
			}
		}
		totalAllowed, totalLimited = totalAllowed+wantAllowed, totalLimited+wantLimited
		r := run(t, nil, events)
		if r.Enforced.WronglyAllowed != wantAllowed || r.Enforced.WronglyLimited != wantLimited {
			t.Fatalf("trial %d (limit %d per %d ms): wrongly allowed, limited %d, %d; want %d, %d",
				trial, lim, windowMs, r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited, wantAllowed, wantLimited)
		}
	}
}

// TestGCRAFitsAsWindow checks the reference bucket's verdicts against
// algo.LeakyBucket.Allow run as an exact limiter while the two agree,
// and its level after overflowing against a bucket poured by hand.
func TestGCRAFitsAsWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		lb := algo.LeakyBucket{Rate: int64(1 + rng.IntN(50)), Per: time.Duration(1+rng.IntN(10_000)) * time.Millisecond,
			Capacity: int64(1 + rng.IntN(40))}
		var g gcra
		var ws algo.LeakyBucketState
		now := t0
		for range 200 {
			now += int64(rng.IntN(int(lb.Per) / 4))
			n := int64(1 + rng.IntN(4))
			fit, before, _, _ := g.take(lb, now, n)
			ok, _, _ := lb.Allow(&ws, now, n)
			if fit != ok {
				t.Fatalf("%+v at %d, n %d: reference fits %v, Allow %v", lb, now, n, fit, ok)
			}
			if !ok { // the reference overflowed: from here they differ
				if before+float64(n) <= float64(lb.Capacity) {
					t.Fatalf("%+v: refused with %v + %d ≤ capacity", lb, before, n)
				}
				break
			}
		}
	}
}

// TestAddAllocsAlgorithms checks that the bucket and fixed references
// allocate nothing in steady state either.
func TestAddAllocsAlgorithms(t *testing.T) {
	for _, a := range []policy.Algorithm{policy.TokenBucket, policy.FixedWindow} {
		j := newJudge(t, func(c *Config) { c.AllowedLateness = 50 * time.Millisecond })
		e := event.Event{Rule: []byte("api"), Cost: 1, Limit: 1000, WindowMillis: 1000, Burst: 100, Edge: 1, Algorithm: a}
		now := t0
		step := func() {
			for k := range uint64(64) {
				e.Time, e.KeyHash = now, k
				e.Decision = event.Admission(k % 2)
				j.Add(now, e)
			}
			now += int64(time.Millisecond)
		}
		for range 3000 {
			step()
		}
		if got := testing.AllocsPerRun(1000, step); got != 0 {
			t.Errorf("%v: allocations per 64 events: got %v, want 0", a, got)
		}
		if r := j.Report(); r.LogEntries != 0 {
			t.Errorf("%v: log entries %d, want 0", a, r.LogEntries)
		}
	}
}
