package decision

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/rules"
)

// coreMetrics are the decision core's: every rule decision, and what was
// refused before any.
type coreMetrics struct {
	requests     *prometheus.CounterVec // rule, decision, source
	missingKey   prometheus.Counter
	duplicateKey prometheus.Counter
	badCost      prometheus.Counter
	badPath      prometheus.Counter // a path origins read differently (front ends count it)
	blockDropped prometheus.Counter
	delayed      prometheus.Histogram // leaky-bucket queue waits
	delayRefused prometheus.Counter
	// globalFallbacks counts decisions of global rules made while the
	// other PoPs' counts were stale: held to CoreConfig.GlobalShare.
	globalFallbacks prometheus.Counter
	shed            [4]prometheus.Counter // by rules.Priority
	// bodyKey counts body key parts not read, by BodyReason.
	bodyKey [numBodyReasons]prometheus.Counter
}

// ruleCounters are one rule's request counters, resolved once per reload
// so the request path never looks up a label.
type ruleCounters struct {
	allowed, allowedFallback               prometheus.Counter
	limited, limitedCache, limitedFallback prometheus.Counter
	shadowLimited                          prometheus.Counter
}

const namespace, subsystem = "poplimit", "edge"

func newCoreMetrics(reg prometheus.Registerer, c *Core) (*coreMetrics, error) {
	bad := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "bad_requests_total", Help: "Requests refused with 400 before any decision, by reason."}, []string{"reason"})
	m := &coreMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "requests_total",
			Help: "Rule decisions, by rule, decision (allowed, limited, shadow_limited) and source (limiter, blockcache, fallback)."},
			[]string{"rule", "decision", "source"}),
		missingKey:   bad.WithLabelValues("missing_key"),
		duplicateKey: bad.WithLabelValues("duplicate_key"),
		badCost:      bad.WithLabelValues("bad_cost"),
		badPath:      bad.WithLabelValues("ambiguous_path"),
		blockDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "block_cache_dropped_total", Help: "Refused keys the block cache did not take; their next request goes to the limiter."}),
		delayed: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "queue_delay_seconds", Help: "How long leaky-bucket queues (action: delay) held the requests they admitted.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 60}}),
		delayRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "queue_full_total", Help: "Requests a leaky-bucket queue admitted but the edge refused: MaxDelayed requests were already waiting."}),
		globalFallbacks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "global_fallbacks_total", Help: "Decisions of global rules made while the other PoPs' counts were stale (cut off from their topic): held to -global-share of the limit."}),
	}
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "shed_total", Help: "Requests shed with 503 because the upstream was overloaded, by priority class."}, []string{"priority"})
	for p := rules.Critical; p <= rules.Low; p++ {
		m.shed[p] = shed.WithLabelValues(p.String())
	}
	bodyKey := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "body_key_fallbacks_total",
		Help: "Requests whose rule's key part from the body (form:, json:) was not read, by reason (absent, malformed, too_large, content_type, too_deep, too_many_fields, unread); the rule's missing_key says what followed."},
		[]string{"reason"})
	for r := BodyAbsent; r < numBodyReasons; r++ {
		m.bodyKey[r] = bodyKey.WithLabelValues(r.String())
	}
	if reg == nil {
		return m, nil
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "upstream_in_flight", Help: "Requests being proxied to the upstream."}, func() float64 { return float64(c.inflight.Load()) })
	for _, col := range []prometheus.Collector{m.requests, bad, m.blockDropped, m.delayed, m.delayRefused, m.globalFallbacks, shed, inflight, bodyKey} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ruleSeries are the (decision, source) pairs of a rule's series in
// requests_total, in the order of ruleCounters' fields: forRule creates
// exactly these, and dropRemoved deletes exactly these.
var ruleSeries = [...][2]string{
	{"allowed", "limiter"}, {"allowed", "fallback"},
	{"limited", "limiter"}, {"limited", "blockcache"}, {"limited", "fallback"},
	{"shadow_limited", "limiter"},
}

func (m *coreMetrics) forRule(name string) ruleCounters {
	var c [len(ruleSeries)]prometheus.Counter
	for i, s := range ruleSeries {
		c[i] = m.requests.WithLabelValues(name, s[0], s[1])
	}
	return ruleCounters{
		allowed: c[0], allowedFallback: c[1],
		limited: c[2], limitedCache: c[3], limitedFallback: c[4],
		shadowLimited: c[5],
	}
}

// dropRemoved forgets the series of rules that a reload removed, so the
// rule label stays bounded by the rules in force. It costs one map lookup
// per old rule and one hashed delete per removed series: a scan of every
// series per removed rule (DeletePartialMatch) costs rules × series, which
// for tens of thousands of envoyproxy/ratelimit descriptors is minutes of
// CPU.
func (m *coreMetrics) dropRemoved(old, cur *rules.Rules) {
	keep := make(map[string]struct{}, len(cur.Rules))
	for _, r := range cur.Rules {
		keep[r.Name] = struct{}{}
	}
	for _, r := range old.Rules {
		if _, ok := keep[r.Name]; ok {
			continue
		}
		for _, s := range ruleSeries {
			m.requests.DeleteLabelValues(r.Name, s[0], s[1])
		}
	}
}
