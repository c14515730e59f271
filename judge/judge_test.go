package judge

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
)

func TestJudgeTraces(t *testing.T) {
	zeroLateness := func(c *Config) { c.AllowedLateness = 0 }
	tests := []struct {
		name   string
		cfg    func(*Config)
		events []event.Event // in arrival order
		want   outcome
	}{
		{
			name: "just under the limit",
			// 10 admitted within 1 s, then one refused: it was the 11th attempt.
			events: cat(burst(0, 10, 100, 1, A), burst(1000, 1, 0, 1, L)),
			want:   outcome{Enforced: [3]int64{11, 0, 0}},
		},
		{
			name:   "just over the limit",
			events: burst(0, 11, 100, 1, A), // the 11th admission breaks the promise
			want:   outcome{Enforced: [3]int64{11, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "the window slides exactly",
			// 10 at 0..900 ms. At 10 000 the unit at 0 has left (t−W, t] (open
			// at t−W): 9+1, fine. At 10 050: 100..900 and 10 000 are 10, +1 = 11.
			events: cat(burst(0, 10, 100, 1, A), burst(10_000, 1, 0, 1, A), burst(10_050, 1, 0, 1, A)),
			want:   outcome{Enforced: [3]int64{12, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "boundary double burst, sliding-window edge",
			// 10 in the last second of window 0, then the burst again in the
			// first second of window 1: a sliding-window counter estimates
			// 10 × 0.9 + curr, admits one more and refuses the rest. The one
			// it admitted is the 11th admission in 10 s.
			events: cat(burst(9000, 10, 100, 1, A), burst(10_000, 1, 0, 1, A), burst(10_100, 9, 100, 1, L)),
			want:   outcome{Enforced: [3]int64{20, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "boundary double burst, fixed-window edge",
			// A fixed window starts over at 10 000 and admits all ten again:
			// each is wrongly allowed, at 11/10 up to 20/10 of the limit.
			events: cat(burst(9000, 10, 100, 1, A), burst(10_000, 10, 100, 1, A)),
			want:   outcome{Enforced: [3]int64{20, 10, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "wrongly limited",
			// The 5th attempt refused: a client within its limit. The 12th,
			// refused after 11 attempts, is right.
			events: cat(burst(0, 4, 100, 1, A), burst(400, 1, 0, 1, L), burst(500, 6, 100, 1, A), burst(1100, 1, 0, 1, L)),
			want:   outcome{Enforced: [3]int64{12, 0, 1}, FalsePositiveKeys: 1},
		},
		{
			name: "a fresh client refused",
			// Ten refusals are attempts 1..10, within the limit: all wrongly
			// limited. The ten admissions after them stay within it too.
			events: cat(burst(0, 10, 10, 1, L), burst(100, 10, 10, 1, A)),
			want:   outcome{Enforced: [3]int64{20, 0, 10}, FalsePositiveKeys: 1},
		},
		{
			name: "cost counts units",
			// Three requests of cost 4 under a limit of 10: the third makes 12.
			events: burst(0, 3, 100, 1, A, cost(4)),
			want:   outcome{Enforced: [3]int64{3, 1, 0}, FalseNegativeKeys: 1},
		},
		{
			name: "interleaved edges out of order within the lateness",
			// Limit 3. Edge 1 decides at 100 (A), 300 (A), 500 (L); edge 2 at
			// 200 (A), 400 (L), 600 (L). Edge 1's events all arrive first.
			// In time order nothing is wrong; judged in arrival order, the
			// refusal at 500 would look wrong (3 attempts seen).
			events: cat(
				[]event.Event{ev(100, 1, A, limit(3)), ev(300, 1, A, limit(3)), ev(500, 1, L, limit(3))},
				[]event.Event{ev(200, 1, A, limit(3), onEdge(2)), ev(400, 1, L, limit(3), onEdge(2)), ev(600, 1, L, limit(3), onEdge(2))},
			),
			want: outcome{Enforced: [3]int64{6, 0, 0}},
		},
		{
			name: "the same, without lateness",
			// Edge 2's 200 and 400 arrive after 500 was judged: late, logged
			// at 500, not judged. The refusal at 500 was judged on 3 attempts.
			cfg: zeroLateness,
			events: cat(
				[]event.Event{ev(100, 1, A, limit(3)), ev(300, 1, A, limit(3)), ev(500, 1, L, limit(3))},
				[]event.Event{ev(200, 1, A, limit(3), onEdge(2)), ev(400, 1, L, limit(3), onEdge(2)), ev(600, 1, L, limit(3), onEdge(2))},
			),
			want: outcome{Enforced: [3]int64{4, 0, 1}, Late: 2, FalsePositiveKeys: 1},
		},
		{
			name: "late beyond the lateness, still counted in the logs",
			// Limit 5, lateness 2 s. 1000..5000 arrive; the watermark (3000)
			// releases 1000..3000. Edge 2's admission at 2500 arrives then:
			// late. Its unit is logged (at 3000), so 5000 and 6000 see 6 and
			// 7 admissions: two wrongly allowed.
			events: cat(
				burst(1000, 5, 1000, 1, A, limit(5)),
				[]event.Event{ev(2500, 1, A, limit(5), onEdge(2)), ev(6000, 1, A, limit(5))},
			),
			want: outcome{Enforced: [3]int64{6, 2, 0}, Late: 1, FalseNegativeKeys: 1},
		},
		{
			name: "forgotten: older than an expired state",
			// Window 1 s. Key 1 at 0 expires when key 2 is judged at 5000;
			// then key 1's event at 500 arrives: its history is gone.
			cfg: zeroLateness,
			events: []event.Event{
				ev(0, 1, A, win(1000)), ev(5000, 2, A, win(1000)), ev(500, 1, A, win(1000)),
			},
			want: outcome{Enforced: [3]int64{2, 0, 0}, Late: 1},
		},
		{
			name: "block rule with a block-cache period",
			// Limit 5 per 10 s, block. Key 1: five admitted, the 6th refused
			// by the limiter (block starts, 6 > 5: right), four answered from
			// the block cache and one more at 5000 (inside the block: right).
			// The block ends at 5500 and the edge admits: 11 attempts in the
			// window, 12 with it: wrongly allowed at 12/5.
			// Key 2: a block started on the 4th attempt (4 ≤ 5): wrongly
			// limited; the cache answers after it are right by definition.
			events: cat(
				burst(0, 5, 100, 1, A, limit(5), blockRule),
				burst(500, 1, 0, 1, L, limit(5), blockRule),
				burst(600, 4, 100, 1, L, limit(5), blockRule, fromCache),
				burst(5000, 1, 0, 1, L, limit(5), blockRule, fromCache),
				burst(5500, 1, 0, 1, A, limit(5), blockRule),
				burst(0, 3, 100, 2, A, limit(5), blockRule),
				burst(300, 1, 0, 2, L, limit(5), blockRule),
				burst(400, 2, 100, 2, L, limit(5), blockRule, fromCache),
			),
			want: outcome{Enforced: [3]int64{18, 1, 1}, FalseNegativeKeys: 1, FalsePositiveKeys: 1},
		},
		{
			name: "shadow and fallback are apart",
			events: cat(
				burst(0, 11, 10, 1, A, shadow),
				burst(0, 11, 10, 2, A, fallback),
				burst(0, 2, 10, 3, L, fallback), // fail closed, within the limit
				burst(0, 3, 10, 4, A),
			),
			want: outcome{Enforced: [3]int64{3, 0, 0}, Shadow: [3]int64{11, 1, 0}, Fallback: [3]int64{13, 1, 2}},
		},
		{
			name:   "invalid events are counted, not judged",
			events: []event.Event{ev(0, 1, A, limit(0)), ev(0, 1, A, win(0)), ev(0, 1, A)},
			want:   outcome{Enforced: [3]int64{1, 0, 0}, Invalid: 2},
		},
		{
			name: "rules keep keys apart",
			// The same key hash under two rules: 6 + 6 admissions, none over.
			events: cat(burst(0, 6, 10, 1, A), burst(0, 6, 10, 1, A, rule("login"))),
			want:   outcome{Enforced: [3]int64{12, 0, 0}},
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

func TestOvershootDistribution(t *testing.T) {
	// The fixed-window double burst: ratios 1.1, 1.2, ..., 2.0.
	r := run(t, nil, cat(burst(9000, 10, 100, 1, A), burst(10_000, 10, 100, 1, A)))
	var got []int64
	for _, b := range r.Overshoot {
		got = append(got, b.Count)
	}
	// Buckets (1, 1.05] (1.05, 1.1] (1.1, 1.15] (1.15, 1.25] (1.25, 1.5] (1.5, 2] (2, 4] (4, ∞)
	want := []int64{0, 1, 0, 1, 3, 5, 0, 0}
	if !slices.Equal(got, want) {
		t.Errorf("overshoot buckets: got %v, want %v", got, want)
	}
	if len(r.TopFalseNegatives) != 1 {
		t.Fatalf("top false negatives: got %d, want 1", len(r.TopFalseNegatives))
	}
	k := r.TopFalseNegatives[0]
	if k.KeyHash != "0000000000000001" || k.Rule != "api" || k.Wrong != 10 || k.Ratio != 2 || k.Limit != 10 {
		t.Errorf("top false negative: got %+v, want key 0000000000000001, rule api, 10 wrong, ratio 2, limit 10", k)
	}
}

func TestFalsePositiveKeys(t *testing.T) {
	// Key 1 refused at its 5th attempt (0.5 of the limit) and 9th (0.9);
	// key 2 at its 8th (0.8).
	r := run(t, nil, cat(
		burst(0, 4, 10, 1, A), burst(40, 1, 0, 1, L), burst(50, 3, 10, 1, A), burst(80, 1, 0, 1, L),
		burst(0, 7, 10, 2, A), burst(70, 1, 0, 2, L),
	))
	got := r.TopFalsePositives
	want := []Key{
		{KeyHash: "0000000000000001", Rule: "api", Limit: 10, Wrong: 2, Ratio: 0.5},
		{KeyHash: "0000000000000002", Rule: "api", Limit: 10, Wrong: 1, Ratio: 0.8},
	}
	if !slices.Equal(got, want) {
		t.Errorf("top false positives:\ngot  %+v\nwant %+v", got, want)
	}
	if r.FalsePositiveKeys != 2 || r.Enforced.WronglyLimited != 3 {
		t.Errorf("false positive keys, wrongly limited: got %d, %d, want 2, 3", r.FalsePositiveKeys, r.Enforced.WronglyLimited)
	}
}

func TestMeanRelativeError(t *testing.T) {
	tests := []struct {
		name   string
		events []event.Event
		want   float64
		n      int64
	}{
		{
			name: "throttle: admitted before the request",
			// Exact 0 (skipped), 1, 2, 3; estimates 0, 1.5, 2, 2.25: errors 0.5, 0, 0.25.
			events: []event.Event{ev(0, 1, A, estimate(0)), ev(10, 1, A, estimate(1.5)),
				ev(20, 1, A, estimate(2)), ev(30, 1, A, estimate(2.25))},
			want: 0.25, n: 3,
		},
		{
			name: "throttle: refused requests are not admitted",
			// Exact admitted before each: 0, 1, 1 (the refusal added none).
			events: []event.Event{ev(0, 1, A, estimate(0), limit(1)), ev(10, 1, L, estimate(1), limit(1)),
				ev(20, 1, L, estimate(2), limit(1))},
			want: 0.5, n: 2,
		},
		{
			name: "block: every attempt, block cache skipped",
			// Attempts before: 0, 1, 2 (cache, skipped), 3; estimates -, 1, -, 1.5.
			events: []event.Event{ev(0, 1, A, blockRule, limit(1)), ev(10, 1, L, blockRule, limit(1), estimate(1)),
				ev(20, 1, L, blockRule, limit(1), fromCache), ev(30, 1, A, blockRule, limit(1), estimate(1.5))},
			want: 0.25, n: 2,
		},
		{
			name:   "fallbacks skipped",
			events: []event.Event{ev(0, 1, A), ev(10, 1, A, fallback, estimate(100))},
			want:   0, n: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, nil, tt.events)
			if r.RelativeErrorDecisions != tt.n || math.Abs(r.MeanRelativeError-tt.want) > 1e-9 {
				t.Errorf("mean relative error: got %v over %d, want %v over %d",
					r.MeanRelativeError, r.RelativeErrorDecisions, tt.want, tt.n)
			}
		})
	}
}

func TestBreakdowns(t *testing.T) {
	r := run(t, nil, cat(
		burst(0, 11, 10, 1, A, onEdge(1)),            // edge 1, api, async: 1 wrongly allowed
		burst(0, 3, 10, 2, A, onEdge(2), syncMode),   // edge 2, sync
		burst(30, 1, 0, 2, L, onEdge(2), syncMode),   // wrongly limited
		burst(40, 2, 10, 2, L, onEdge(2), fromCache), // block cache, throttle: wrongly limited too
		burst(0, 2, 10, 3, A, rule("login"), shadow),
	))
	type row struct {
		name    string
		tally   [3]int64
		shadowN int64
	}
	flat := func(bs []Breakdown) []row {
		var out []row
		for _, b := range bs {
			out = append(out, row{b.Name, tri(b.Enforced), b.Shadow.Decisions})
		}
		return out
	}
	tests := []struct {
		name string
		got  []Breakdown
		want []row
	}{
		{"by edge", r.ByEdge, []row{{"1", [3]int64{11, 1, 0}, 2}, {"2", [3]int64{6, 0, 3}, 0}}},
		{"by rule", r.ByRule, []row{{"api", [3]int64{17, 1, 3}, 0}, {"login", [3]int64{}, 2}}},
		{"by mode", r.ByMode, []row{{"async", [3]int64{13, 1, 2}, 2}, {"sync", [3]int64{4, 0, 1}, 0}}},
		{"by source", r.BySource, []row{{"block_cache", [3]int64{2, 0, 2}, 0}, {"limiter", [3]int64{15, 1, 1}, 2}}},
	}
	for _, tt := range tests {
		if got := flat(tt.got); !slices.Equal(got, tt.want) {
			t.Errorf("%s:\ngot  %+v\nwant %+v", tt.name, got, tt.want)
		}
	}
}

func TestRuleCopied(t *testing.T) {
	j := newJudge(t, nil)
	buf := []byte("api")
	j.Add(0, event.Event{Time: t0, KeyHash: 1, Rule: buf, Cost: 1, Limit: 1, WindowMillis: 1000})
	copy(buf, "xyz") // the consumer reuses its buffer
	j.Flush()
	r := j.Report()
	if len(r.ByRule) != 1 || r.ByRule[0].Name != "api" {
		t.Errorf("rule rows after the buffer changed: got %+v, want one named api", r.ByRule)
	}
}

// TestHold replays what a consumer sees while it catches up: one partition
// is far ahead, so the watermark has passed the other partition's events
// when they arrive, and two edges' events of one key arrive a little out of
// order within that partition.
func TestHold(t *testing.T) {
	ahead := ev(60_000, 99, A) // the partition furthest ahead
	// Limit 3: edge 1 decides at 100 (A), 300 (A), 500 (L); edge 2 at 200
	// (A), 400 (L). Edge 2's events arrive 10 ms after edge 1's.
	edge1 := []event.Event{ev(100, 1, A, limit(3)), ev(300, 1, A, limit(3)), ev(500, 1, L, limit(3))}
	edge2 := []event.Event{ev(200, 1, A, limit(3), onEdge(2)), ev(400, 1, L, limit(3), onEdge(2))}
	const arrival = int64(1_000_000_000_000)
	tests := []struct {
		name    string
		hold    time.Duration
		advance time.Duration // after the last arrival, before Flush
		want    outcome
	}{
		// Held 250 ms, the five are judged in time order once the clock
		// has moved on, before any Flush: nothing wrong, nothing late.
		{"held", 250 * time.Millisecond, 300 * time.Millisecond, outcome{Enforced: [3]int64{6, 0, 0}}},
		// Without a hold they are judged on arrival: 200 and 400 are late
		// and the refusal at 500 was judged on 3 attempts.
		{"not held", 0, 300 * time.Millisecond, outcome{Enforced: [3]int64{4, 0, 1}, Late: 2, FalsePositiveKeys: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newJudge(t, func(c *Config) { c.Hold = tt.hold })
			j.Add(arrival, ahead)
			j.Add(arrival+int64(5*time.Millisecond), edge1...)
			j.Add(arrival+int64(15*time.Millisecond), edge2...)
			// The event ahead waits for its own watermark throughout.
			if got, want := j.Buffered(), map[bool]int{true: 6, false: 1}[tt.hold > 0]; got != want {
				t.Errorf("buffered before the hold is over: got %d, want %d", got, want)
			}
			j.Advance(arrival + int64(15*time.Millisecond+tt.advance))
			if got := j.Buffered(); got != 1 {
				t.Errorf("buffered after Advance past the hold: got %d, want 1", got)
			}
			j.Flush()
			if got := outcomeOf(j.Report()); got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
