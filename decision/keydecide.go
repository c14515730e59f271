package decision

import (
	"time"

	"github.com/poplimit/poplimit/rules"
)

// Generation is one generation of the rules in force, with what the core
// prepared for it. A front end that maps a request to rules itself reads
// the Generation once per request (Current) and decides every part of
// the request under it, so a reload never splits a request across two
// generations. The zero Generation has no rules.
type Generation struct{ sn *snapshot }

// Current returns the generation in force.
func (c *Core) Current() Generation { return Generation{c.rules.Load()} }

// Rules returns the generation's rules.
func (g Generation) Rules() *rules.Rules {
	if g.sn == nil {
		return nil
	}
	return g.sn.rules
}

// DecideKey decides key under rule index of g directly, with no matching
// and no key recipe: the JSON decision endpoint and Envoy's rate limit
// service, which map their requests to rules themselves. cost is taken as
// it is: 0 checks the key without counting. limit, when not 0, is the
// request's own limit over the rule's count (Envoy's per-descriptor
// override): the rule counts as always, and the Verdict's Outcome and
// Quota say whether that limit is passed and what of it remains; when the
// store failed, the rule's failure policy answers. An index outside g's
// rules, or a concurrency or shed rule (which depend on live requests),
// is Undecidable with the reason; a cost above the rule's bound is
// Denied. A rule with key_case: insensitive folds key as it folds the
// fields of a request. The Verdict must be handed back with Finish.
func (c *Core) DecideKey(g Generation, now time.Time, index int, key []byte, cost, limit uint64) *Verdict {
	if g.sn == nil || index < 0 || index >= len(g.sn.rules.Rules) {
		d := c.get(now)
		d.Outcome, d.Reason = Undecidable, "no such rule"
		return d
	}
	r := g.sn.rules.Rules[index]
	d := c.decideKey(g.sn, now, r, key, cost)
	if limit == 0 || d.Fallback || d.Outcome == Undecidable || d.Outcome == Denied {
		if d.np > 0 && d.Outcome != Allowed {
			c.keepAs(d, settledRefused) // given back: no origin answered
		}
		return d
	}
	// The rule counted; the request's limit decides: used is what the
	// rule's window holds now, this request's units included.
	used := r.Limit - min(d.Quota.Remaining, r.Limit)
	d.Quota.Limit = limit
	switch {
	case d.Outcome != Allowed || used > limit:
		d.Outcome, d.Quota.Remaining = Limited, 0
	default:
		d.Quota.Remaining = limit - used
	}
	if d.np > 0 && d.Outcome != Allowed {
		c.keepAs(d, settledRefused) // given back: no origin answered
	}
	return d
}

func (c *Core) decideKey(sn *snapshot, now time.Time, r *rules.Rule, key []byte, cost uint64) *Verdict {
	d := c.get(now)
	switch {
	case r.Kind != rules.Rate:
		d.Outcome, d.Quota.Rule = Undecidable, r
		d.Reason = "a " + r.Kind.String() + " rule depends on live requests and cannot be decided for a key"
		return d
	case cost > max(r.MaxCost, r.Cost):
		d.Outcome, d.Quota.Rule, d.Reason = Denied, r, "cost is above the rule's bound"
		return d
	}
	d.key = append(d.key[:0], key...)
	if r.KeyCase == rules.KeyCaseInsensitive {
		// As the rule reads its fields: the key given here and the one
		// read from a request for the same account meet.
		d.key = appendFoldedKey(d.key[:0], key)
	}
	t := d.now.UnixNano()
	if c.decide(sn, r, d, t, cost) {
		d.Outcome = Limited
	} else {
		c.holdAdmitted(d, t)
	}
	return d
}
