package window

import (
	"context"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// The counter strategy: sliding and fixed windows over the store's window
// counters. A key's view is its entry in the shard's slab (shard.go): the
// global counts of its previous and current window as the store last
// reported them, plus this edge's increments in flight and not yet sent,
// and, for a hot key, its windows' shapes (hist.go). Decide's skeleton
// (limiter.go) calls the functions below.

// counterVerdict decides cost more units over the counts prev and curr at
// t into v: the fixed window from curr alone, the sliding window from
// both, with e's recorded shapes when it has them (e may be nil). s.mu
// must be held.
func (s *shard) counterVerdict(v *algo.Conformance, e *entry, t int64, r *Policy, limit, prev, curr, cost uint64) {
	sw := algo.SlidingWindow{Limit: limit, Window: r.Window}
	switch {
	case r.Algorithm == policy.FixedWindow:
		sw.DecideFixed(v, t, curr, cost)
	case e != nil && e.hist != 0:
		ps, cs := s.shapes(e, curr)
		decideShaped(sw, v, t, prev, curr, cost, e.spans(), &ps, &cs)
	case e != nil:
		sw.DecideSpans(v, t, prev, curr, cost, e.spans())
	default:
		sw.DecideSpans(v, t, prev, curr, cost, sw.Even())
	}
}

// counterStep is one async look at key's counters: it writes the decision
// into d and counts it, or asks to wait for the read of a key new here
// whose request would be admitted (once: the read answers it). d's
// Conformance is written either way. s.mu must be held.
func (s *shard) counterStep(l *Limiter, w *waits, t int64, r *Policy, key, limit, cost uint64, d *Answer) step {
	i, fresh := s.get(l, key, t, r)
	e := &s.slab[i]
	prev, curr := e.view()
	failed := e.flags&flagFailed != 0
	var unseen uint64
	if l.cfg.GuessPeers && !failed { // (only with AsyncNearLimit: Validate) the rule's failure policy answers a key the store fails, not a guess
		unseen = e.othersUnseen(t)
	}
	s.counterVerdict(&d.Conformance, e, t, r, l.heldLimit(e, t, limit), prev, curr+unseen, cost)
	v := &d.Conformance
	if w.near && v.Allowed && !failed && e.flags&flagNeedCurr == 0 && v.Remaining < e.nearReach(t, limit) {
		return stepSync // what the others may have admitted could fill the room (sync.go)
	}
	if !v.Allowed && unseen > 0 && r.Action == policy.Throttle {
		// Refused on what the others may have admitted since the last
		// reply: learn what they did at the next flush, and let the
		// refusal stand only until that reply can have come.
		e.flags |= flagRefresh
		s.enqueue(i)
		v.ReleaseAt = min(v.ReleaseAt, t+2*int64(l.cfg.FlushInterval)+int64(l.cfg.StoreTimeout)/4)
	}
	if w.may && v.Allowed && !failed && !fresh && e.flags&flagNeedCurr != 0 {
		// The read answers with the previous window too (sync.go).
		e.flags |= flagRefresh
		s.enqueue(i)
		w.ask(false, true, l.cfg.NewKeyWait, 0)
		return stepWait
	}
	if v.Allowed || r.Action == policy.Block {
		s.count(i, t, cost)
		s.sendBy(i, t, l.syncDue(e, t, r, v.Allowed, v.Remaining))
		if r.Algorithm == policy.SlidingWindow && s.histMay(e, prev+curr+cost, limit) {
			s.histNote(l, i, t, cost, prev, curr, limit)
		}
	}
	d.Limit = limit
	if !v.Allowed && r.Action == policy.Block {
		v.ReleaseAt = t + int64(r.Timeout)
	}
	if failed {
		return stepFellBack
	}
	return stepDecided
}

// counterRecord counts cost units of a blocked key without deciding.
// s.mu must be held.
func (s *shard) counterRecord(l *Limiter, t int64, r *Policy, key, cost uint64) {
	i, _ := s.get(l, key, t, r)
	e := &s.slab[i]
	prev, curr := e.view()
	s.count(i, t, cost)
	s.enqueue(i) // a blocked key is at its limit: its units go at once
	if r.Algorithm == policy.SlidingWindow && s.histMay(e, prev+curr+cost, r.Limit) {
		s.histNote(l, i, t, cost, prev, curr, r.Limit)
	}
}

// counterSync increments key's current window counter on the request
// path (reading its previous window in the same call while that is not
// known here) and decides on the reply. failed reports that the increment
// failed; d is then the admission a fail-open rule makes.
func (l *Limiter) counterSync(ctx context.Context, t int64, r *Policy, key, limit, cost uint64) (d Answer, failed bool) {
	w := int64(r.Window)
	start := algo.WindowStart(t, w)
	s := l.shardOf(key)
	s.mu.Lock()
	i, _ := s.get(l, key, t, r)
	e := &s.slab[i]
	// An async key decided near its limit (not Config.AsyncNearLimit) sends
	// its unsent units with the request's, so that the reply counts them.
	// Until the window that ended is known here (read by the flusher once
	// its grace is over, or by a round trip like this one after it), the
	// call reads that window too, as a sync key's does: the other edges'
	// last units of it are not in this edge's view yet, and a client that
	// bursts at a boundary was admitted past its limit on that view (the
	// simulator, two edges, the near-limit trace round-robin: 0.146 %
	// wrong at the worst of four phases with the read only within the
	// grace, 0.130 % with it until known). The request's
	// units are in flight too until the reply: the view counts them, so
	// that a decision made on it meanwhile does not admit into the room
	// this one may take (its reply takes them back if it refuses).
	sent := uint64(e.pend)
	e.infl, e.pend = sat32(uint64(e.infl)+sent+cost), 0
	needPrev := e.flags&flagPrevKnown == 0
	prevLocal := uint64(e.prev) + uint64(e.prevInfl) + uint64(e.prevPend)
	s.mu.Unlock()

	opsp := l.ops.Get().(*[]store.Op)
	ops := (*opsp)[:0]
	ops = append(ops, store.Op{Key: key, Start: start / 1e6, Delta: int64(cost + sent), TTL: 2 * r.Window})
	if needPrev {
		ops = append(ops, store.Op{Key: key, Start: (start - w) / 1e6})
	}
	l.syncDo(ctx, ops) // at most StoreTimeout, in a call shared with others of its part waiting
	l.m.storeOps.Add(float64(len(ops)))
	inc := ops[0]
	prev := prevLocal
	prevOK := false
	if needPrev && ops[1].Err == nil {
		prev, prevOK = max(prevLocal, ops[1].Value), true
	}
	defer func() { *opsp = ops[:0]; l.ops.Put(opsp) }()
	if inc.Err != nil {
		s.mu.Lock()
		if e := s.lookup(key); e != nil {
			e.flags |= flagFailed
		}
		s.unsend(l, key, start, w, sent, cost)
		s.mu.Unlock()
		return Answer{Conformance: algo.Conformance{Allowed: true, ResetAt: start + w}, Limit: limit}, true
	}
	// The reply counts this request: decide on the count before it, with
	// the shape of the previous window as this edge saw it (hist.go).
	before := inc.Value - min(inc.Value, cost)
	s.mu.Lock()
	i, ok := s.idx.get(key)
	e = nil
	if ok && s.slab[i].start == start {
		e = &s.slab[i]
	}
	var v algo.Conformance
	held := limit
	if e != nil {
		held = l.heldLimit(e, t, limit)
	}
	s.counterVerdict(&v, e, t, r, held, prev, before, cost)
	seen := inc.Value
	if !v.Allowed && r.Action == policy.Throttle {
		seen = before // ours is taken back below: it was never admitted
	}
	if e == nil {
		s.landed(key, start, w, sent+cost, inc.Value)
	}
	if e != nil {
		e.infl -= min(e.infl, uint32(sent+cost))
		if e.flags&flagNeedCurr == 0 {
			// The reply is a sample of the others' rate, as a
			// flush's is.
			s.noteRate(i, t, cost+sent, inc.Value)
		} else {
			s.joined(i, before, prev, prevOK)
		}
		e.reply = uint16(min(e.off(t), 1<<15-1)) + 1
		if old := uint64(e.curr); seen > old+sent && r.Algorithm == policy.SlidingWindow {
			// The view grows by what the reply shows: this request, if
			// it counts, and the other edges' since the last reply
			// (the units sent with it are in the shape already).
			e.noteFirst(t)
			s.histNote(l, i, t, seen-old-sent, prev, old, limit)
		}
		e.curr = sat32(max(uint64(e.curr), seen))
		if v.Allowed || r.Action == policy.Block {
			e.own = uint16(min(uint64(e.own)+cost, 1<<16-1))
		}
		// The reply is the global count: the flusher need not read it.
		e.flags &^= flagFailed | flagNeedCurr
		e.placePrev(t)
		if prevOK {
			if p, _ := e.view(); prev > p {
				s.histLate(e, prev-p)
				l.shareLate(e, p, prev-p)
			}
			e.prev = sat32(max(uint64(e.prev), prev))
			// Within the grace after the window started, other edges'
			// increments for the previous window may still be on their
			// way (a refused one's decrement too): read it again with
			// the next decision, in the same round trip as its increment
			// (or, if none comes, the flusher reads it once the grace is
			// over, as it does for async keys).
			if t >= start+l.grace {
				e.flags |= flagPrevKnown
			}
		}
	}
	s.mu.Unlock()
	if !v.Allowed && r.Action == policy.Throttle {
		// A throttle counts admitted requests only: take ours back.
		ops = append(ops[:0], store.Op{Key: key, Start: start / 1e6, Delta: -int64(cost)})
		l.syncDo(context.WithoutCancel(ctx), ops)
		l.m.storeOps.Inc()
		if ops[0].Err != nil {
			l.m.storeErrors.Inc()
		}
	}
	d = Answer{Conformance: v, Limit: limit}
	if !v.Allowed && r.Action == policy.Block {
		d.ReleaseAt = t + int64(r.Timeout)
	}
	return d, false
}

// unsend puts back the units sent with a near-limit decision whose
// increment failed (for key's window starting at start, of w ns) among
// its unsent units, for the flusher to send, as a flush's failure does,
// and takes the request's own units out of flight: the view decides it
// again. s.mu must be held.
func (s *shard) unsend(l *Limiter, key uint64, start, w int64, units, request uint64) {
	i, ok := s.idx.get(key)
	if !ok {
		l.m.pendingDropped.Add(float64(units))
		return
	}
	e := &s.slab[i]
	switch e.start {
	case start:
		e.infl -= min(e.infl, uint32(units+request))
		e.pend = sat32(uint64(e.pend) + units)
	case start + w: // rolled meanwhile: the units are the previous window's
		e.prevInfl -= min(e.prevInfl, uint32(units+request))
		e.prevPend = sat32(uint64(e.prevPend) + units)
	default:
		l.m.pendingDropped.Add(float64(units))
		return
	}
	if units > 0 {
		s.enqueue(i)
	}
}

// landed folds the reply to units sent with a near-limit decision into
// key's view when the view rolled past their window (start, of w ns)
// meanwhile: they are the previous window's now. s.mu must be held.
func (s *shard) landed(key uint64, start, w int64, units, value uint64) {
	if e := s.lookup(key); e != nil && e.start == start+w {
		e.prevInfl -= min(e.prevInfl, uint32(units))
		e.prev = max(e.prev, sat32(value))
	}
}
