package shardproxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Client's Prometheus collectors, with every label
// combination resolved once so the hot path does no map look-ups.
type metrics struct {
	opsVec     *prometheus.CounterVec
	latencyVec *prometheus.HistogramVec
	ejections  prometheus.Counter
	ejected    prometheus.Gauge
	shards     prometheus.Gauge

	ops     [numKinds][numResults]prometheus.Counter
	latency [numKinds]prometheus.Observer
}

// newMetrics builds the collectors and registers them with reg, unless reg is
// nil. On a registration error it unregisters what it registered.
func newMetrics(reg prometheus.Registerer, nshards int) (*metrics, error) {
	const ns, sub = "poplimit", "shardproxy"
	m := &metrics{
		opsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "ops_total",
			Help: "Operations finished, by operation (counters: incr, decr, get; values: gets, add, cas) and result (ok, miss, conflict: a lost compare-and-swap or add, error, timeout, canceled: by the caller).",
		}, []string{"op", "result"}),
		latencyVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "op_duration_seconds",
			Help:    "Time of one call to a shard, by operation: a single command (an incr with its add, a multi-get), or a pipeline, observed once for each operation it carries.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14), // 50µs … 410ms
		}, []string{"op"}),
		ejections: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "ejections_total",
			Help: "Shards ejected from the ring after consecutive failures.",
		}),
		ejected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "shards_ejected",
			Help: "Shards currently out of the ring.",
		}),
		shards: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "shards",
			Help: "Shards configured, live or ejected.",
		}),
	}
	for k := range numKinds {
		for r := range numResults {
			m.ops[k][r] = m.opsVec.WithLabelValues(kindNames[k], resultNames[r])
		}
		m.latency[k] = m.latencyVec.WithLabelValues(kindNames[k])
	}
	m.shards.Set(float64(nshards))
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.opsVec, m.latencyVec, m.ejections, m.ejected, m.shards}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("shardproxy: register metrics: %w", err)
		}
	}
	return m, nil
}
