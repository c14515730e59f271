package judge

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// benchTrace returns n events of keys keys from edges edges at rate events
// per second, delivered in batches of batch as a consumer would: each
// batch's events are in time order per edge, and edges lag each other by up
// to 200 ms. Decisions follow a per-key sliding log of the same limit, so
// verdicts are mostly correct, as in production.
func benchTrace(n, keys, edges, batch int, rate float64) []event.Event {
	rng := rand.New(rand.NewPCG(1, 2))
	rules := [][]byte{[]byte("api"), []byte("login"), []byte("search")}
	evs := make([]event.Event, 0, n)
	step := int64(float64(time.Second) / rate)
	t := t0
	for len(evs) < n {
		for e := range edges {
			for range batch / edges {
				k := uint64(rng.IntN(keys))
				lag := int64(e) * 200 * int64(time.Millisecond) / int64(max(edges-1, 1))
				d := event.Allowed
				if rng.IntN(10) == 0 {
					d = event.Limited
				}
				evs = append(evs, event.Event{
					Time: t - lag, KeyHash: k*0x9e3779b97f4a7c15 + 1, Rule: rules[k%3], Cost: 1,
					Limit: 100, WindowMillis: 10_000, Estimate: 50, Edge: uint16(e), Decision: d,
					Action: policy.Action(k % 2),
				})
				t += step
			}
		}
	}
	return evs[:n]
}

// BenchmarkAdd measures the judge's throughput on one goroutine: events/s
// and allocations per event (one op is one event).
func BenchmarkAdd(b *testing.B) {
	for _, bc := range []struct {
		name   string
		keys   int
		dedup  int
		alg    policy.Algorithm
		framed bool
	}{
		{"keys=1k", 1000, 0, policy.SlidingWindow, false},
		{"keys=100k", 100_000, 0, policy.SlidingWindow, false},
		{"keys=1k/dedup=256k", 1000, 1 << 18, policy.SlidingWindow, false},
		{"keys=1k/dedup=256k/framed", 1000, 1 << 18, policy.SlidingWindow, true},
		{"keys=1k/algorithm=fixed_window", 1000, 0, policy.FixedWindow, false},
		{"keys=1k/algorithm=token_bucket", 1000, 0, policy.TokenBucket, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const batch = 1000
			trace := benchTrace(1<<20, bc.keys, 2, batch, 200_000)
			for i := range trace {
				trace[i].Algorithm = bc.alg
				trace[i].Framed = bc.framed // as the consumer marks events of checked frames
			}
			j := newJudge(b, func(c *Config) { c.Dedup = bc.dedup })
			// Warm up: the keys, the logs and the buffer reach their
			// steady size, as in a long-running aggregator.
			for i := 0; i < len(trace); i += batch {
				chunk := trace[i:min(i+batch, len(trace))]
				j.Add(chunk[len(chunk)-1].Time, chunk...)
			}
			// Replay the trace shifted by its length, so time goes on.
			span := trace[len(trace)-1].Time - trace[0].Time + int64(time.Second)
			shift := span
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for done := 0; done < b.N; {
				for i := 0; i < len(trace) && done < b.N; i += batch {
					n := min(batch, b.N-done, len(trace)-i)
					chunk := trace[i : i+n]
					for k := range chunk {
						chunk[k].Time += shift
					}
					j.Add(chunk[len(chunk)-1].Time, chunk...)
					for k := range chunk {
						chunk[k].Time -= shift
					}
					done += n
				}
				shift += span
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}

// BenchmarkReport measures a snapshot (what /report and a scrape cost).
func BenchmarkReport(b *testing.B) {
	j := newJudge(b, nil)
	trace := benchTrace(200_000, 10_000, 4, 1000, 100_000)
	j.Add(0, trace...)
	j.Flush()
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{j: j})
	b.ReportAllocs()
	b.Run("Report", func(b *testing.B) {
		for b.Loop() {
			j.Report()
		}
	})
	b.Run("Gather", func(b *testing.B) {
		for b.Loop() {
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.MaxClockSkew, cfg.MaxEventAge = 0, 0 // arrival instant 0: no clock here
	j, err := New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	j.Add(0, benchTrace(5000, 50, 2, 100, 1000)...)
	j.Flush()
	j.Add(0, ev(0, 1, A, win(1)), ev(0, 1, A, limit(0))) // a late event and an invalid one
	j.Flush()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	r := j.Report()
	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"poplimit_aggregator_events_total", nil, float64(r.Events)},
		{"poplimit_aggregator_invalid_events_total", nil, 1},
		{"poplimit_aggregator_invalid_events_total", []string{"reason", "parameters"}, 1},
		{"poplimit_aggregator_late_events_total", nil, float64(r.Late)},
		{"poplimit_aggregator_decisions_total", nil, float64(r.Judged)},
		{"poplimit_aggregator_decisions_total", []string{"class", "enforced", "verdict", "wrongly_allowed"}, float64(r.Enforced.WronglyAllowed)},
		{"poplimit_aggregator_decisions_total", []string{"class", "enforced", "verdict", "wrongly_limited"}, float64(r.Enforced.WronglyLimited)},
		{"poplimit_aggregator_algorithm_decisions_total", nil, float64(r.Judged)},
		{"poplimit_aggregator_algorithm_decisions_total", []string{"algorithm", "sliding_window", "class", "enforced", "verdict", "wrongly_allowed"}, float64(r.Enforced.WronglyAllowed)},
		{"poplimit_aggregator_overshoot_ratio", nil, float64(r.Enforced.WronglyAllowed)},
		{"poplimit_aggregator_estimate_relative_error_ratio", nil, float64(r.RelativeErrorDecisions)},
		{"poplimit_aggregator_keys", nil, float64(r.Keys)},
	}
	for _, tt := range tests {
		if got := testenv.MetricSum(t, reg, tt.name, tt.labels...); got != tt.want {
			t.Errorf("%s%v: got %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	if r.Late != 1 {
		t.Errorf("late: got %d, want 1", r.Late)
	}
	if _, err := New(DefaultConfig(), reg); err == nil {
		t.Error("a second Judge on one registry: got nil error, want a registration error")
	}
}
