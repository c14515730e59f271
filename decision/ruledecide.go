package decision

import (
	"context"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
)

// decide runs rate rule r for the key in d.key, leaving its quota in
// d.Quota, and reports whether the request is refused (shadow rules never
// refuse).
func (c *Core) decide(sn *snapshot, r *rules.Rule, d *Verdict, t int64, cost uint64) bool {
	h := r.Hash(d.key)
	limit := sn.rules.LimitFor(r, d.key)
	rc := &sn.counters[r.Index]
	ev := &d.ev
	*ev = event.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: uint32(cost), Limit: uint32(limit),
		WindowMillis: uint32(r.Window / time.Millisecond), Edge: uint16(c.cfg.EdgeID),
		Mode: r.Mode, Action: eventAction(r.Action), Shadow: r.Shadow,
		Algorithm: r.Algorithm, Burst: uint32(burstFor(r, limit)),
		Pop: c.pop, Global: r.Scope == rules.ScopeGlobal}
	d.Quota = Quota{Rule: r, Limit: limit, fixed: &sn.fixed[r.Index]}
	bk := h ^ sn.blockSalt
	if rel, blocked := c.blocks.Blocked(bk, t); blocked {
		if r.Action == policy.Block {
			c.lim.Record(d.now, &r.Policy, h, cost) // a blocked client's real rate stays visible
		}
		rc.limitedCache.Inc()
		d.Quota.ResetAt, d.Quota.ReleaseAt = rel, rel
		d.FromBlockCache = true
		ev.Decision, ev.FromBlockCache, ev.Counting = event.Limited, true, r.Count.On()
		c.emit(r, d)
		return true
	}
	here := limit
	if r.Scope == rules.ScopeGlobal && c.deps.Global != nil {
		here = c.globalRoom(r, h, t, limit)
	}
	v := c.lim.Decide(context.Background(), d.now, sn.admit[r.Index], h, here, cost)
	if v.At > ev.Time {
		ev.Time = v.At // decided after a wait for the store: judged when decided
	}
	d.Quota.Remaining, d.Quota.ResetAt, d.Quota.ReleaseAt = v.Remaining, v.ResetAt, v.ReleaseAt
	ev.Estimate = float32(v.Estimate)
	if v.Delay > 0 && v.Allowed {
		ev.Delayed, ev.DelayMicros = true, uint32(min(v.Delay/time.Microsecond, 1<<32-1))
		d.Delay = max(d.Delay, v.Delay)
	}
	fb := v.Fallback != store.FallbackNone
	ev.Fallback, d.Fallback = fb, d.Fallback || fb
	ev.Decision = event.Limited
	switch {
	case v.Allowed && fb:
		rc.allowedFallback.Inc()
		ev.Decision = event.Allowed
	case v.Allowed:
		rc.allowed.Inc()
		ev.Decision = event.Allowed
	case r.Shadow:
		rc.shadowLimited.Inc()
	case fb:
		rc.limitedFallback.Inc()
	default:
		rc.limited.Inc()
		if v.ReleaseAt > t && !c.blocks.Block(bk, v.ReleaseAt, t) {
			c.m.blockDropped.Inc()
		}
	}
	if r.Count.On() {
		if v.Allowed && !fb && cost > 0 && d.np < maxPending {
			// Reserved: the units are taken, and the response settles
			// them (settle.go), emitting the event then.
			d.pend[d.np] = pendingUnits{rule: r, key: h, block: bk, units: cost, limit: limit, mark: v.Mark, ev: *ev}
			d.np++
			return false
		}
		// Refused, it counts nothing; admitted by the failure policy
		// (nothing reserved to settle), all it cost.
		ev.Counting = true
		if v.Allowed {
			ev.Counted = ev.Cost
		}
	}
	c.emit(r, d)
	return !v.Allowed && !r.Shadow
}

// globalRoom is what this PoP may count of a global rule's limit for key
// h at t: the limit less what the other PoPs counted in the trailing
// window, or, cut off from their counts, its share of the limit. The
// limiter decides this PoP's count against it.
func (c *Core) globalRoom(r *rules.Rule, h uint64, t int64, limit uint64) uint64 {
	others, fresh := c.deps.Global.Others(h, t, int64(r.Window))
	if !fresh {
		c.m.globalFallbacks.Inc()
		return max(1, uint64(float64(limit)*c.cfg.GlobalShare))
	}
	return limit - min(others, limit)
}

// eventAction is a rule's action as an event records it: Throttle or
// Block, the one bit the wire format holds (event/FORMAT.md). A queue
// (Delay) counts what it admits, as a throttle does; the event says Delayed.
func eventAction(a policy.Action) policy.Action {
	if a == policy.Block {
		return policy.Block
	}
	return policy.Throttle
}

// burstFor is the bucket capacity rule r runs with for limit: a tier's
// limit scales the default burst too (as the limiter does).
func burstFor(r *rules.Rule, limit uint64) uint64 {
	if r.Burst == 0 || (limit != r.Limit && r.Burst == r.Limit) {
		return limit
	}
	return r.Burst
}

// emit hands the event in d to the pipeline, which counts what it drops or
// samples out, and to the observer.
func (c *Core) emit(r *rules.Rule, d *Verdict) {
	if c.deps.Events != nil {
		c.deps.Events.Emit(&d.ev)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(r, d.key, &d.ev)
	}
}

// acquire takes a concurrency slot for the key in d.key under r; Finish
// gives it back.
func (c *Core) acquire(sn *snapshot, r *rules.Rule, d *Verdict, t int64) bool {
	h := r.Hash(d.key)
	limit := sn.rules.LimitFor(r, d.key)
	rc := &sn.counters[r.Index]
	d.Quota = Quota{Rule: r, Limit: limit, ResetAt: t + int64(time.Second), ReleaseAt: t + int64(time.Second)}
	ok, fb := c.deps.Slots.Acquire(context.Background(), d.now, r.Lease, r.Fail, h, limit)
	switch {
	case ok && fb == store.FallbackNone:
		rc.allowed.Inc()
	case ok:
		rc.allowedFallback.Inc()
	case fb != store.FallbackNone:
		rc.limitedFallback.Inc()
	case r.Shadow:
		rc.shadowLimited.Inc()
		return false
	default:
		rc.limited.Inc()
	}
	d.Fallback = d.Fallback || fb != store.FallbackNone
	if ok {
		d.held[d.nh] = heldSlot{r, h}
		d.nh++
		d.Quota.Remaining = 1 // unknown beyond "not full": say one is left
	}
	if c.cfg.Observe != nil {
		// Concurrency decisions are not rate events (the judge has no truth
		// for them) and go to no Emitter; the observer sees them.
		d.ev = event.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: 1, Limit: uint32(limit),
			Edge: uint16(c.cfg.EdgeID), Decision: event.Limited, Shadow: r.Shadow, Fallback: fb != store.FallbackNone}
		if ok {
			d.ev.Decision = event.Allowed
		}
		c.cfg.Observe(r, d.key, &d.ev)
	}
	return !ok
}
