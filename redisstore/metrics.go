package redisstore

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// opKind is the kind of an op, the bounded "op" label.
type opKind uint8

const (
	kindIncr opKind = iota
	kindDecr
	kindGet
	kindGCRA
	kindSlidingLog
	numKinds
)

var kindNames = [numKinds]string{"incr", "decr", "get", "gcra", "sliding_log"}

func (k opKind) String() string { return kindNames[k] }

// result is the outcome of one op as its caller saw it, the bounded
// "result" label.
type result uint8

const (
	resultOK          result = iota
	resultMiss               // the key did not exist: created (incr, a pour, a log), or read as 0
	resultTimeout            // ErrTimeout
	resultReply              // ErrReply: the server answered with an error (wrong type, not an integer, …)
	resultBadValue           // ErrBadValue: a stored value or a reply that does not decode
	resultUnavailable        // ErrUnavailable, ErrClosed, and the caller's cancellation
	resultInvalid            // ErrInvalid: arguments out of range, nothing sent
	numResults
)

var resultNames = [numResults]string{"ok", "miss", "timeout", "reply_error", "bad_value", "unavailable", "invalid"}

// metrics are the Store's Prometheus collectors, with every label
// combination resolved once so the hot path does no map look-ups.
type metrics struct {
	opsVec      *prometheus.CounterVec
	latencyVec  *prometheus.HistogramVec
	fallbackVec *prometheus.CounterVec
	connectsVec *prometheus.CounterVec
	healthy     prometheus.Gauge

	ops       [numKinds][numResults]prometheus.Counter
	latency   [numKinds]prometheus.Observer
	fallbacks [numScripts]prometheus.Counter
	connectOK prometheus.Counter
	connectKO prometheus.Counter
}

// newMetrics builds the collectors and registers them with reg, unless reg is
// nil. On a registration error it unregisters what it registered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "poplimit", "redis"
	m := &metrics{
		opsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "ops_total",
			Help: "Operations finished, by operation (incr, decr, get, gcra, sliding_log) and result (ok, miss, timeout, reply_error, bad_value, unavailable, invalid).",
		}, []string{"op", "result"}),
		latencyVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "op_duration_seconds",
			Help:    "Time of the call that carried an operation (one pipeline per Do, GCRABatch, SlidingLogBatch or DoState call, NOSCRIPT retry included), observed once for each operation it carries.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14), // 50µs … 410ms
		}, []string{"op"}),
		fallbackVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "script_fallbacks_total",
			Help: "Script calls a node answered with NOSCRIPT and that were sent again as EVAL, by script.",
		}, []string{"script"}),
		connectsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connects_total",
			Help: "Attempts to connect the Store (at New, then every ReconnectInterval until one succeeds), by result (ok, error).",
		}, []string{"result"}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "healthy",
			Help: "1 while the Store is connected and fewer than FailureLimit consecutive calls went unanswered, else 0.",
		}),
	}
	for k := range numKinds {
		for r := range numResults {
			m.ops[k][r] = m.opsVec.WithLabelValues(kindNames[k], resultNames[r])
		}
		m.latency[k] = m.latencyVec.WithLabelValues(kindNames[k])
	}
	for i := range scripts {
		m.fallbacks[i] = m.fallbackVec.WithLabelValues(scripts[i].name)
	}
	m.connectOK = m.connectsVec.WithLabelValues("ok")
	m.connectKO = m.connectsVec.WithLabelValues("error")
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.opsVec, m.latencyVec, m.fallbackVec, m.connectsVec, m.healthy}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("redisstore: register metrics: %w", err)
		}
	}
	return m, nil
}
