package judge

import (
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsOneSeriesPerLabelSet feeds events whose judge cells share a
// label set (a rule whose algorithm a reload changed; rule names that are
// not UTF-8 and read alike once made valid) and checks that a scrape
// succeeds, lints clean, exports each label set once and adds the cells
// up.
func TestMetricsOneSeriesPerLabelSet(t *testing.T) {
	alg := func(a policy.Algorithm) opt { return func(e *event.Event) { e.Algorithm = a } }
	tests := []struct {
		name   string
		events []event.Event
		rule   string // the rule label value whose series are checked
		series int    // decisions_total series of rule: one per verdict
	}{
		{
			name: "a reload changes the rule's algorithm",
			events: concat(
				burst(0, 12, 100, 1, A),                             // sliding_window: the 11th and 12th wrongly allowed
				burst(2000, 12, 100, 1, A, alg(policy.TokenBucket)), // the reloaded rule, same key
				burst(0, 3, 100, 2, A, alg(policy.FixedWindow)),
			),
			rule: "api", series: 3,
		},
		{
			name: "rule names that are not UTF-8",
			events: concat(
				burst(0, 11, 100, 1, A, rule("\xffa")),
				burst(0, 11, 100, 2, A, rule("\xfea")),
			),
			rule: "\uFFFDa", series: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			cfg := DefaultConfig()
			cfg.Hold, cfg.MaxClockSkew, cfg.MaxEventAge = 0, 0, 0 // arrival instant 0: no clock here
			j, err := New(cfg, reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tt.events {
				j.Add(0, e)
			}
			j.Flush()
			problems, err := testutil.GatherAndLint(reg)
			if err != nil {
				t.Fatalf("scrape: got %v, want none", err)
			}
			for _, p := range problems {
				t.Errorf("metric %s: %s", p.Metric, p.Text)
			}
			r := j.Report()
			if r.Judged != int64(len(tt.events)) {
				t.Fatalf("judged: got %d, want %d", r.Judged, len(tt.events))
			}
			decisions := "poplimit_aggregator_decisions_total"
			if got := testenv.MetricSum(t, reg, decisions); got != float64(r.Judged) {
				t.Errorf("%s: got %v, want %d", decisions, got, r.Judged)
			}
			if got := testenv.MetricSum(t, reg, decisions, "class", "enforced", "verdict", "wrongly_allowed"); got != float64(r.Enforced.WronglyAllowed) {
				t.Errorf("%s wrongly allowed: got %v, want %d", decisions, got, r.Enforced.WronglyAllowed)
			}
			if got := countSeries(t, reg, decisions, "rule", tt.rule); got != tt.series {
				t.Errorf("%s{rule=%q} series: got %d, want %d", decisions, tt.rule, got, tt.series)
			}
			if got := countSeries(t, reg, "poplimit_aggregator_overshoot_ratio", "rule", tt.rule); got != 1 {
				t.Errorf("overshoot_ratio{rule=%q} series: got %d, want 1", tt.rule, got)
			}
			if got := testenv.MetricSum(t, reg, "poplimit_aggregator_overshoot_ratio"); got != float64(r.Enforced.WronglyAllowed) {
				t.Errorf("overshoot_ratio count: got %v, want %d", got, r.Enforced.WronglyAllowed)
			}
			if got := testenv.MetricSum(t, reg, "poplimit_aggregator_algorithm_decisions_total"); got != float64(r.Judged) {
				t.Errorf("algorithm_decisions_total: got %v, want %d", got, r.Judged)
			}
		})
	}
}

// countSeries counts the series of metric name with label name = value.
func countSeries(t *testing.T, g prometheus.Gatherer, name, label, value string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					n++
				}
			}
		}
	}
	return n
}

func concat(parts ...[]event.Event) []event.Event {
	var all []event.Event
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}
