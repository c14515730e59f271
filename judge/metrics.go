package judge

import (
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	namespace = "poplimit"
	subsystem = "aggregator"
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

// The Judge's metrics. Ratios are left to PromQL: e.g. the wrongly decided
// ratio over an hour is
//
//	sum(rate(poplimit_aggregator_decisions_total{class="enforced",verdict!="correct"}[1h]))
//	/ sum(rate(poplimit_aggregator_decisions_total{class="enforced"}[1h]))
//
// Label values are bounded: rule and edge by MaxRules and MaxEdges, the
// others by their enumerations. No key is ever a label.
var (
	descEvents = desc("events_total",
		"Decision events given to the judge, judged or not.")
	descDuplicates = desc("duplicate_events_total",
		"Exact copies of a recent event (a batch produced or consumed twice), dropped before judging; not in events_total.")
	descInvalid = desc("invalid_events_total",
		"Events not judged and kept out of the watermark: parameters (limit or window 0, or a bucket whose burst × window "+
			"overflows its exact arithmetic), future (time more than the allowed lateness + max clock skew after the "+
			"aggregator's clock), past (time more than the max event age before it).", "reason")
	descDecisions = desc("decisions_total",
		"Judged decisions, by rule, edge, mode (async, sync), source (limiter, block_cache), "+
			"class (enforced, shadow, fallback) and verdict (correct, wrongly_allowed, wrongly_limited).",
		"rule", "edge", "mode", "source", "class", "verdict")
	descAlgDecisions = desc("algorithm_decisions_total",
		"Judged decisions, by the rule's algorithm (sliding_window, fixed_window, token_bucket, leaky_bucket, "+
			"sliding_log; each judged against its own exact truth), class and verdict, as in decisions_total.",
		"algorithm", "class", "verdict")
	descScopeDecisions = desc("scope_decisions_total",
		"Judged decisions, by the rule's scope (pop: its limit holds in each PoP, judged per PoP; global: across "+
			"PoPs, judged by key over every PoP), the PoP of the edge that decided (empty for edges of none), class "+
			"and verdict, as in decisions_total.",
		"scope", "pop", "class", "verdict")
	descLate = desc("late_events_total",
		"Events not judged because they arrived after their key judged a later event (out_of_order) "+
			"or after state that might have covered them expired (forgotten).", "edge", "reason")
	descOverflow = desc("buffer_overflow_events_total",
		"Events judged before the watermark passed them because the buffer was full.")
	descBuffered = desc("buffered_events", "Events waiting for the watermark.")
	descKeys     = desc("keys", "Keys (rule, key hash) with exact state.")
	descEntries  = desc("log_entries", "Sliding-log entries held, all keys.")
	descSlots    = desc("log_slots",
		"Sliding-log entries the keys' rings have room for (16 bytes each), all keys; -max-log-entries bounds it.")
	descEvicted = desc("keys_evicted_total",
		"Key states removed: idle (two windows, or two drain times of a bucket, without events), "+
			"max_keys and max_log_entries (bounds reached: -max-keys, or the log slots of -max-log-entries; the key's history is lost).", "reason")
	descWrongKeys = desc("wrong_keys_total",
		"Distinct keys with a wrongly decided enforced decision, by kind (false_negative: wrongly allowed, "+
			"false_positive: wrongly limited).", "kind")
	descOvershoot = desc("overshoot_ratio",
		"Exact count over the limit at each wrongly allowed enforced decision "+
			"(for token and leaky buckets: the busy period's units over Burst + rate × its length).", "rule")
	descRelErr = desc("estimate_relative_error_ratio",
		"|estimate − exact| / exact of limiter decisions (enforced and shadow) with an exact count > 0; "+
			"rate(_sum)/rate(_count) is the mean relative error.", "rule")
	descWatermark = desc("watermark_timestamp_seconds",
		"Latest event time seen minus the allowed lateness, Unix seconds.")
)

var verdictNames = [3]string{"correct", "wrongly_allowed", "wrongly_limited"}

// collector exports a Judge's counts at scrape time, so that judging an
// event touches no metric.
type collector struct{ j *Judge }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descDuplicates, descInvalid, descDecisions, descAlgDecisions, descScopeDecisions, descLate, descOverflow,
		descBuffered, descKeys, descEntries, descSlots, descEvicted, descWrongKeys, descOvershoot, descRelErr, descWatermark} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	j := c.j
	j.mu.Lock()
	defer j.mu.Unlock()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(descEvents, j.events)
	for i, n := range j.invalid {
		counter(descInvalid, n, invalidReasonNames[i])
	}
	counter(descDuplicates, j.dups.count)
	counter(descOverflow, j.overflows)
	gauge(descBuffered, float64(j.buf.len()))
	gauge(descKeys, float64(j.keys.len()))
	gauge(descEntries, float64(j.keys.entries))
	gauge(descSlots, float64(j.keys.slots))
	if j.seen {
		gauge(descWatermark, float64(j.maxSeen-j.lateness)/1e9)
	}
	for i, n := range j.evicted {
		counter(descEvicted, n, evictReasonNames[i])
	}
	counter(descWrongKeys, j.fn.distinct, "false_negative")
	counter(descWrongKeys, j.fp.distinct, "false_positive")
	// Late events of every edge that decided anything, zeros included, so
	// that dashboards and alerts see a series before anything is late.
	// Edge labels are one per label index (edgeName), so each series is
	// one cell.
	seenEdge := make(map[int32]bool)
	for k := range j.cells {
		seenEdge[k.edge] = true
	}
	for lc := range j.late {
		seenEdge[lc.edge] = true
	}
	for e := range seenEdge {
		for r := range uint8(numLateReasons) {
			counter(descLate, j.late[lateCell{edge: e, reason: r}], edgeName(e), lateReasonNames[r])
		}
	}
	// The cells are finer than the labels: a rule's cells of two
	// algorithms (a reload changed it) share every label of
	// decisions_total, and two rules whose names are not UTF-8 may read
	// alike once made valid (see ruleIndex). A scrape must see each label
	// set once, so the cells are added up per label set.
	decisions := make(map[[5]string]*[3]int64, len(j.cells))
	byAlg := make(map[[2]string]*[3]int64)
	byScope := make(map[[3]string]*[3]int64)
	for k, cs := range j.cells {
		v := [3]int64{cs.allowed + cs.limited - cs.wronglyAllowed - cs.wronglyLimited, cs.wronglyAllowed, cs.wronglyLimited}
		class := k.class.String()
		addVerdicts(decisions, [5]string{j.ruleNames[k.rule], edgeName(k.edge), k.mode.String(), k.source.String(), class}, v)
		addVerdicts(byAlg, [2]string{policy.Algorithm(k.alg).String(), class}, v)
		addVerdicts(byScope, [3]string{scopeName(k.global), j.popNames[k.pop], class}, v)
	}
	for l, v := range byScope {
		for i, n := range v {
			counter(descScopeDecisions, n, l[0], l[1], l[2], verdictNames[i])
		}
	}
	for l, v := range decisions {
		for i, n := range v {
			counter(descDecisions, n, l[0], l[1], l[2], l[3], l[4], verdictNames[i])
		}
	}
	for l, v := range byAlg {
		for i, n := range v {
			counter(descAlgDecisions, n, l[0], l[1], verdictNames[i])
		}
	}
	byRule := make(map[string]*ruleStats, len(j.perRule))
	for i := range j.perRule {
		name := j.ruleNames[i]
		if byRule[name] == nil {
			byRule[name] = new(ruleStats)
		}
		byRule[name].add(&j.perRule[i])
	}
	for name, rs := range byRule {
		ch <- constHistogram(descOvershoot, overshootBounds[:], rs.overshoot[:], rs.overshootSum, name)
		ch <- constHistogram(descRelErr, relErrBounds[:], rs.relErr[:], rs.relErrSum, name)
	}
}

// addVerdicts adds v (correct, wrongly allowed, wrongly limited) to the
// label set l of m.
func addVerdicts[L comparable](m map[L]*[3]int64, l L, v [3]int64) {
	s := m[l]
	if s == nil {
		s = new([3]int64)
		m[l] = s
	}
	for i := range v {
		s[i] += v[i]
	}
}

// add adds o's distributions to s.
func (s *ruleStats) add(o *ruleStats) {
	for i, n := range o.overshoot {
		s.overshoot[i] += n
	}
	s.overshootSum += o.overshootSum
	for i, n := range o.relErr {
		s.relErr[i] += n
	}
	s.relErrSum += o.relErrSum
}

// constHistogram builds a histogram from per-bucket counts (the last past
// every bound).
func constHistogram(d *prometheus.Desc, bounds []float64, n []int64, sum float64, labels ...string) prometheus.Metric {
	cum := make(map[float64]uint64, len(bounds))
	var total uint64
	for i, b := range bounds {
		total += uint64(n[i])
		cum[b] = total
	}
	total += uint64(n[len(bounds)])
	return prometheus.MustNewConstHistogram(d, total, sum, cum, labels...)
}
