// Package metricsum reads one metric's value out of a Prometheus gatherer:
// the tests' way of checking a counter, and the simulator's way of
// reporting what the edges' own metrics counted.
package metricsum

import "github.com/prometheus/client_golang/prometheus"

// Sum returns the sum of the samples of the named metric in g whose labels
// include every pair in labels ("name", "value", …): counters, gauges and
// untyped values by value, histograms by their count of observations.
func Sum(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue samples
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Untyped != nil:
				sum += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, nil
}
