package judge

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/poplimit/poplimit/policy"
)

// DecisionTally counts judged decisions and the wrong ones among them.
// Ratios are over Decisions (allowed and limited), 0 when there are none.
type DecisionTally struct {
	Decisions           int64   `json:"decisions"`
	Allowed             int64   `json:"allowed"`
	Limited             int64   `json:"limited"`
	WronglyAllowed      int64   `json:"wrongly_allowed"`
	WronglyLimited      int64   `json:"wrongly_limited"`
	WrongRatio          float64 `json:"wrong_ratio"`
	WronglyAllowedRatio float64 `json:"wrongly_allowed_ratio"`
	WronglyLimitedRatio float64 `json:"wrongly_limited_ratio"`
}

func (t *DecisionTally) add(c *counts) {
	t.Allowed += c.allowed
	t.Limited += c.limited
	t.WronglyAllowed += c.wronglyAllowed
	t.WronglyLimited += c.wronglyLimited
}

func (t *DecisionTally) finish() {
	t.Decisions = t.Allowed + t.Limited
	if t.Decisions > 0 {
		d := float64(t.Decisions)
		t.WrongRatio = float64(t.WronglyAllowed+t.WronglyLimited) / d
		t.WronglyAllowedRatio = float64(t.WronglyAllowed) / d
		t.WronglyLimitedRatio = float64(t.WronglyLimited) / d
	}
}

// Breakdown is one row of a breakdown: the decisions of one edge, rule,
// algorithm, mode or source, per class.
type Breakdown struct {
	Name     string        `json:"name"`
	Enforced DecisionTally `json:"enforced"`
	Shadow   DecisionTally `json:"shadow,omitzero"`
	Fallback DecisionTally `json:"fallback,omitzero"`
}

// Bucket is one range of a distribution: values in (From, To], or above
// From when To is 0 (the last bucket).
type Bucket struct {
	From  float64 `json:"from"`
	To    float64 `json:"to,omitempty"`
	Count int64   `json:"count"`
}

// Key is a key with wrong enforced decisions.
type Key struct {
	KeyHash string `json:"key_hash"` // 16 hex digits
	Rule    string `json:"rule"`
	Limit   uint32 `json:"limit"` // at its latest wrong decision
	Wrong   int64  `json:"wrong_decisions"`
	// Ratio is the exact truth over the limit at its worst wrong decision:
	// the largest for a false negative (how far over), the smallest for a
	// false positive (how far under). For a sliding or fixed window it is
	// the exact count, this request included, over the limit; for a token
	// or leaky bucket the units of the reference bucket's busy period (the
	// interval since it was last empty, this request included) over what
	// the bucket promises for it, Burst + rate × its length (see the
	// package doc).
	Ratio float64 `json:"ratio"`
}

// Late counts late events of one edge for one reason.
type Late struct {
	Edge   string `json:"edge"`
	Reason string `json:"reason"` // "out_of_order" or "forgotten"
	Events int64  `json:"events"`
}

// Report is a snapshot of everything the Judge has counted. Events =
// judged (Enforced + Shadow + Fallback decisions) + Late + Invalid +
// Buffered.
type Report struct {
	Events          int64 `json:"events"`           // given to Add, copies excluded
	Duplicates      int64 `json:"duplicates"`       // exact copies dropped (Config.Dedup)
	Judged          int64 `json:"judged"`           // decisions judged, all classes
	Late            int64 `json:"late"`             // not judged: see the package doc
	Invalid         int64 `json:"invalid"`          // not judged: see InvalidBreakdown
	Buffered        int   `json:"buffered"`         // waiting for the watermark
	BufferOverflows int64 `json:"buffer_overflows"` // judged before the watermark passed them
	// Watermark is the latest event time seen minus the allowed lateness,
	// Unix ns (0 before the first event).
	Watermark       int64            `json:"watermark_unix_nano"`
	Keys            int              `json:"keys"`        // keys with state
	LogEntries      int              `json:"log_entries"` // sliding-log entries, all keys (window and log rules)
	KeysEvicted     map[string]int64 `json:"keys_evicted"`
	LateBreakdown   []Late           `json:"late_breakdown"`
	AllowedLateness float64          `json:"allowed_lateness_seconds"`

	// InvalidBreakdown counts the invalid events by reason: "parameters"
	// (Limit or WindowMillis 0, or a bucket's arithmetic out of range),
	// "future" and "past" (a time out of Config.MaxClockSkew and
	// Config.MaxEventAge of the caller's clock; see the package doc).
	InvalidBreakdown map[string]int64 `json:"invalid_breakdown"`

	// Enforced is the headline: enforced decisions. Shadow and Fallback
	// are apart, not in its ratios.
	Enforced DecisionTally `json:"enforced"`
	Shadow   DecisionTally `json:"shadow"`
	Fallback DecisionTally `json:"fallback"`

	// MeanRelativeError is the mean of |estimate − exact| / exact over
	// RelativeErrorDecisions decisions (see the package doc).
	MeanRelativeError      float64  `json:"mean_relative_error"`
	RelativeErrorDecisions int64    `json:"relative_error_decisions"`
	RelativeError          []Bucket `json:"relative_error"`
	// Overshoot is the distribution of the ratio to the limit (as
	// Key.Ratio: exact/limit, or for buckets busy-period units over their
	// bound) over the wrongly allowed enforced decisions.
	Overshoot []Bucket `json:"overshoot"`

	// FalseNegativeKeys and FalsePositiveKeys count distinct keys with a
	// wrongly allowed or wrongly limited enforced decision; upper bounds
	// when WrongKeysTruncated.
	FalseNegativeKeys  int64 `json:"false_negative_keys"`
	FalsePositiveKeys  int64 `json:"false_positive_keys"`
	WrongKeysTruncated bool  `json:"wrong_keys_truncated"`
	TopFalseNegatives  []Key `json:"top_false_negatives"`
	TopFalsePositives  []Key `json:"top_false_positives"`

	ByEdge []Breakdown `json:"by_edge"`
	ByRule []Breakdown `json:"by_rule"`
	// ByAlgorithm has a row per algorithm that decided anything, named as
	// rule files name it (sliding_window, fixed_window, token_bucket,
	// leaky_bucket, sliding_log), each judged against its own truth.
	ByAlgorithm []Breakdown `json:"by_algorithm"`
	ByMode      []Breakdown `json:"by_mode"`
	BySource    []Breakdown `json:"by_source"`
	// ByScope has a row per rule scope that decided anything: "pop" (each
	// key judged within its PoP) and "global" (each key judged across
	// every PoP). ByPop has a row per PoP of the deciding edges, both
	// scopes ("" for edges of no PoP).
	ByScope []Breakdown `json:"by_scope"`
	ByPop   []Breakdown `json:"by_pop"`
}

// Report returns a snapshot of the counts. It takes the Judge's lock for
// time linear in the cells and the remembered wrong keys.
func (j *Judge) Report() Report {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := Report{
		Events:          j.events,
		Duplicates:      j.dups.count,
		Late:            j.lateTotal,
		Buffered:        j.buf.len(),
		BufferOverflows: j.overflows,
		Keys:            j.keys.len(),
		LogEntries:      j.keys.entries,
		KeysEvicted:     make(map[string]int64, numEvictReasons),
		AllowedLateness: j.cfg.AllowedLateness.Seconds(),
		LateBreakdown:   []Late{},
	}
	r.InvalidBreakdown = make(map[string]int64, numInvalidReasons)
	if j.seen {
		r.Watermark = j.maxSeen - j.lateness
	}
	for i, n := range j.evicted {
		r.KeysEvicted[evictReasonNames[i]] = n
	}
	for i, n := range j.invalid {
		r.InvalidBreakdown[invalidReasonNames[i]] = n
		r.Invalid += n
	}
	for lc, n := range j.late {
		r.LateBreakdown = append(r.LateBreakdown, Late{Edge: edgeName(lc.edge), Reason: lateReasonNames[lc.reason], Events: n})
	}
	slices.SortFunc(r.LateBreakdown, func(a, b Late) int {
		return cmp.Or(compareNames(a.Edge, b.Edge), cmp.Compare(a.Reason, b.Reason))
	})

	byEdge, byRule, byAlg, byMode, bySource, byScope, byPop := rows{}, rows{}, rows{}, rows{}, rows{}, rows{}, rows{}
	for k, c := range j.cells {
		classTally(&r, k.class).add(c)
		byEdge.at(edgeName(k.edge), k.class).add(c)
		byRule.at(j.ruleNames[k.rule], k.class).add(c)
		byAlg.at(policy.Algorithm(k.alg).String(), k.class).add(c)
		byMode.at(k.mode.String(), k.class).add(c)
		bySource.at(k.source.String(), k.class).add(c)
		byScope.at(scopeName(k.global), k.class).add(c)
		byPop.at(j.popNames[k.pop], k.class).add(c)
	}
	for _, t := range []*DecisionTally{&r.Enforced, &r.Shadow, &r.Fallback} {
		t.finish()
		r.Judged += t.Decisions
	}
	r.ByEdge, r.ByRule, r.ByAlgorithm = byEdge.sorted(), byRule.sorted(), byAlg.sorted()
	r.ByMode, r.BySource = byMode.sorted(), bySource.sorted()
	r.ByScope, r.ByPop = byScope.sorted(), byPop.sorted()

	var overshoot [len(overshootBounds) + 1]int64
	var relErr [len(relErrBounds) + 1]int64
	var relErrSum float64
	for i := range j.perRule {
		rs := &j.perRule[i]
		for b, n := range rs.overshoot {
			overshoot[b] += n
		}
		for b, n := range rs.relErr {
			relErr[b] += n
			r.RelativeErrorDecisions += n
		}
		relErrSum += rs.relErrSum
	}
	if r.RelativeErrorDecisions > 0 {
		r.MeanRelativeError = relErrSum / float64(r.RelativeErrorDecisions)
	}
	r.Overshoot = buckets(1, overshootBounds[:], overshoot[:])
	r.RelativeError = buckets(0, relErrBounds[:], relErr[:])

	r.FalseNegativeKeys, r.FalsePositiveKeys = j.fn.distinct, j.fp.distinct
	r.WrongKeysTruncated = j.fn.truncated || j.fp.truncated
	r.TopFalseNegatives = j.topKeys(&j.fn)
	r.TopFalsePositives = j.topKeys(&j.fp)
	return r
}

func classTally(r *Report, c Class) *DecisionTally {
	switch c {
	case Shadow:
		return &r.Shadow
	case Fallback:
		return &r.Fallback
	}
	return &r.Enforced
}

func buckets(from float64, bounds []float64, n []int64) []Bucket {
	bs := make([]Bucket, 0, len(n))
	for i, c := range n {
		b := Bucket{From: from, Count: c}
		if i < len(bounds) {
			b.To = bounds[i]
			from = bounds[i]
		}
		bs = append(bs, b)
	}
	return bs
}

func (j *Judge) topKeys(w *wrongKeys) []Key {
	ks := w.sorted()
	ks = ks[:min(len(ks), j.cfg.TopKeys)]
	out := make([]Key, 0, len(ks))
	for _, k := range ks {
		out = append(out, Key{
			KeyHash: hex16(k.id.hash),
			Rule:    j.ruleNames[k.id.rule],
			Limit:   k.limit,
			Wrong:   k.n,
			Ratio:   k.ratio,
		})
	}
	return out
}

func hex16(h uint64) string {
	s := strconv.FormatUint(h, 16)
	if len(s) < 16 {
		s = "0000000000000000"[len(s):] + s
	}
	return s
}

func edgeName(edge int32) string {
	if edge < 0 {
		return otherLabel
	}
	return strconv.Itoa(int(edge))
}

// compareNames orders numeric names (edges) numerically and puts the rest,
// "_other" included, after them by name.
func compareNames(a, b string) int {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(x, y)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return cmp.Compare(a, b)
}

// rows accumulates breakdown rows by name.
type rows map[string]*Breakdown

func (rs rows) at(name string, c Class) *DecisionTally {
	b := rs[name]
	if b == nil {
		b = &Breakdown{Name: name}
		rs[name] = b
	}
	switch c {
	case Shadow:
		return &b.Shadow
	case Fallback:
		return &b.Fallback
	}
	return &b.Enforced
}

func (rs rows) sorted() []Breakdown {
	out := make([]Breakdown, 0, len(rs))
	for _, b := range rs {
		b.Enforced.finish()
		b.Shadow.finish()
		b.Fallback.finish()
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b Breakdown) int { return compareNames(a.Name, b.Name) })
	return out
}
