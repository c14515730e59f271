package window

import (
	"context"
	"math"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// The state strategy: token buckets, leaky buckets and sliding logs
// across the PoP. Decide's skeleton (limiter.go) calls stateStep,
// stateSync and stateRecord; the flush sends the views' units
// (flushStates) and folds the replies in (applyView).
//
// Their state does not reduce to increment-only counters, so it lives in
// the store as one value per key that each operation reads, updates and
// writes back atomically (Store.DoState: compare-and-swap on memcached, a
// script on Redis).
//
// Sync mode does one StateOp per request: the units are taken in the store
// only if they fit, so the PoP admits at most Burst + rate·t in any
// interval of length t, whatever the number of edges.
//
// Async mode keeps, per key, a view of the shared bucket: the state the
// store last returned with this edge's own admissions since poured in. A
// request is decided from the view, with no network; the flusher pours the
// units this edge admitted into the shared bucket with one unconditional
// StateOp per dirty key, whose reply (the bucket after everyone's pours)
// becomes the new view. Between two replies an edge spends at most its share
// of the room the last reply showed: room / max(peers, 2), where peers
// estimates the edges spending the key (from how much more than its own
// units the shared bucket took between two replies, against the share each
// took); only an edge that no reply has ever shown another edge's units,
// for a while, takes the whole room. A request past the share waits for
// the next reply and is decided again on it, reply after reply, until a
// deadline long enough for the replies to tell whether other edges spend
// the key (at least NewKeyWait); still past its share then, it is
// refused. Other edges' admissions reach
// the view within one flush interval plus a round trip, so the PoP admits
// at most Burst + rate·t plus, per other edge, what it admits in that time:
// rate × (FlushInterval + store round trip) when the key is at its rate,
// its share when a burst starts. Since the unconditional pours go into the
// shared bucket whatever its level, an over-admission is paid back: the
// bucket refuses until it has drained, and the long-run rate is exact.
//
// Sliding logs run in sync mode only: an exact limit cannot be decided
// from a view.

// bucketView is one key's view of its shared state.
type bucketView struct {
	lb       algo.LeakyBucket      // the bucket, as of the last request
	shared   algo.LeakyBucketState // the store's state at the last reply
	view     algo.LeakyBucketState // shared, with this edge's units since poured in
	pend     int64                 // units admitted, not yet sent
	infl     int64                 // units sent, reply awaited
	at       int64                 // the latest admitted unit's instant (the pour's now), Unix ns
	last     int64                 // last request, Unix ns
	idle     int64                 // after this long unused the bucket is empty again (ns)
	unseen   int64                 // units the other edges may have taken that the last reply did not show
	share    int64                 // this edge's share of the room the last reply showed
	unseenAt int64                 // when the reserve for unseen units was last renewed
	knownAt  int64                 // when the first reply came
	replyAt  int64                 // when the last reply came
	alone    bool                  // no reply has shown another edge's units, for a while
	seq      uint32                // replies applied
	peers    int32                 // estimated edges spending this key, ≥ 1
	kind     store.StateKind
	flags    uint8
}

const (
	bvQueued uint8 = 1 << iota // in its shard's state queue
	bvKnown                    // a reply has been applied
	bvFailed                   // the last store operation for the key failed
	bvShared                   // a reply has shown another edge's units
)

// bucketOf returns the bucket rule r runs with for limit (a tier's limit
// scales the default burst too).
func bucketOf(r *Policy, limit uint64) algo.LeakyBucket {
	burst := int64(r.Burst)
	if burst == 0 || (limit != r.Limit && r.Burst == r.Limit) {
		burst = int64(limit)
	}
	if r.Action == policy.Delay {
		burst++ // Burst requests wait while one is served
	}
	return algo.LeakyBucket{Rate: int64(limit), Per: r.Window, Capacity: burst}
}

// queueDelay is how long a request of a Delay rule admitted into a bucket
// whose theoretical arrival time was tat at t waits: until the requests
// before it have been served.
func queueDelay(r *Policy, tat, t int64) time.Duration {
	if r.Action != policy.Delay || tat <= t {
		return 0
	}
	return time.Duration(tat - t)
}

func logOf(r *Policy, limit uint64) algo.SlidingLog {
	return algo.SlidingLog{Limit: int64(limit), Window: r.Window}
}

// stateKind returns the StateKind of a non-counter algorithm.
func stateKind(a policy.Algorithm) store.StateKind {
	if a == policy.SlidingLog {
		return store.StateLog
	}
	return store.StateGCRA
}

// viewGet returns key's bucket view, creating it (and evicting an arbitrary
// other when the shard holds its share of MaxKeys). s.mu must be held.
func (s *shard) viewGet(l *Limiter, key uint64, t int64, r *Policy, lb algo.LeakyBucket) (v *bucketView, fresh bool) {
	if v, ok := s.views[key]; ok {
		if t-v.last > v.idle && v.pend == 0 && v.infl == 0 {
			// Idle long enough to have drained: forget it, so that a
			// store that lost it (evicted, restarted) is not believed.
			*v = bucketView{peers: v.peers, flags: v.flags & bvQueued}
			v.kind, v.lb = stateKind(r.Algorithm), lb
			v.idle = v.idleFor(r)
			fresh = true
		}
		v.lb = lb
		v.last = max(v.last, t)
		return v, fresh
	}
	if s.views == nil {
		s.views = make(map[uint64]*bucketView)
	}
	if len(s.views) >= s.max {
		for k, old := range s.views {
			if old.pend > 0 {
				l.m.pendingDropped.Add(float64(old.pend))
			}
			delete(s.views, k)
			l.m.evictions.Inc()
			break
		}
	}
	v = &bucketView{lb: lb, kind: stateKind(r.Algorithm), last: t, peers: 1}
	v.idle = v.idleFor(r)
	s.views[key] = v
	return v, true
}

// idleFor is how long a view may go unused before its bucket has drained
// (or its log forgotten): a bucket drains Burst in Burst/Limit windows.
func (v *bucketView) idleFor(r *Policy) int64 {
	if v.kind == store.StateLog {
		return 2 * int64(r.Window)
	}
	return int64(2+v.lb.Capacity/max(v.lb.Rate, 1)) * int64(r.Window)
}

func (s *shard) enqueueView(key uint64, v *bucketView) {
	if v.flags&bvQueued != 0 {
		return
	}
	v.flags |= bvQueued
	s.vqueue = append(s.vqueue, key)
	s.flusher.wake()
}

// stateStep is one async look at key's bucket view: it writes the decision
// into d and counts it, or asks to wait for the store's next reply, for a
// key new here or a request past this edge's share of the room (again, on
// each reply that still leaves it past its share, until the deadline).
// s.mu must be held.
func (s *shard) stateStep(l *Limiter, w *waits, t int64, r *Policy, key, limit, cost uint64, d *Answer) step {
	lb := bucketOf(r, limit)
	n := int64(cost)
	v, fresh := s.viewGet(l, key, t, r, lb)
	try := v.view
	ok, remaining, releaseAt := lb.Allow(&try, t, n)
	if ok && n > 0 && !fresh && v.flags&bvFailed == 0 {
		mine := v.pend + v.infl
		known := v.flags&bvKnown != 0
		within := known && v.withinShare(t, mine, n)
		// A key other edges spend too, whose view no reply has
		// refreshed for two flush intervals (this edge refused it
		// meanwhile, so sent nothing): the room it shows may be
		// theirs already.
		stale := known && !v.alone && t-v.replyAt > 2*int64(l.cfg.FlushInterval)
		if !within || stale {
			if w.may {
				// Wait for the next reply and decide again. A key new
				// here has its first read at once; past its share, the
				// next flush is soon enough, and does not hammer the
				// store with reads while replies tell whether the edge
				// is alone.
				if v.pend == 0 && v.infl == 0 {
					s.enqueueView(key, v) // a read
				}
				// Long enough to learn from the replies whether other
				// edges spend the key: the first reply (a flush and a
				// round trip), unsure() after it with no other edge's
				// units, and the reply that shows it.
				rt := l.cfg.FlushInterval + time.Duration(l.stateRTT.Load())
				w.ask(true, !known, max(l.cfg.NewKeyWait, time.Duration(l.unsure())+2*rt+l.cfg.FlushInterval), v.seq)
				return stepWait
			}
			if known && !within && w.waited() {
				// Past its share, and no reply came in time to say the
				// room is still there: refuse rather than spend the
				// other edges' share.
				ok = false
				remaining, releaseAt = 0, t+int64(l.cfg.FlushInterval)
			}
		}
	}
	if fresh && v.flags&bvKnown == 0 {
		s.enqueueView(key, v) // read what the other edges took
	}
	var delay time.Duration
	if ok || r.Action == policy.Block {
		if ok {
			delay = queueDelay(r, v.view.TAT, t)
			v.view = try
		} else {
			lb.Pour(&v.view, t, n) // a block counts every attempt
			remaining, releaseAt = 0, lb.Release(v.view, t, n)
		}
		if n > 0 {
			v.pend += n
			v.at = max(v.at, t)
			s.enqueueView(key, v)
		}
	}
	stateDecision(d, t, r, limit, cost, ok, remaining, releaseAt)
	d.Delay = delay
	if v.flags&bvFailed != 0 {
		return stepFellBack
	}
	return stepDecided
}

// withinShare reports whether this edge, having taken mine units since the
// last reply, may take n more before the next: at most its share of the
// room the reply showed (at t, less what the other edges likely took
// unseen). An edge alone takes the whole room; one that shares the key
// waits, when the room is small, until there is a share for each edge, so
// two edges never take the same last unit.
func (v *bucketView) withinShare(t, mine, n int64) bool {
	room := v.lb.Remaining(v.shared, t) - v.unseen
	return (mine+n)*int64(v.peersFor()) <= room
}

// peersFor is the number of edges this one shares the key's room with:
// the estimate, and at least two unless this edge is alone on the key (no
// reply has shown another edge's units, unsure after the key became known
// here), since their latest units may not have landed yet.
func (v *bucketView) peersFor() int32 {
	if !v.alone {
		return max(v.peers, 2)
	}
	return v.peers
}

// unsure is how long after other edges last showed their units (or after a
// key became known here) an edge still reckons with units of theirs in
// flight: a unit admitted elsewhere is sent within a flush interval and
// lands, or fails, within a store timeout; or, if the flushes here have
// lately taken longer than that, three of them.
func (l *Limiter) unsure() int64 {
	f := int64(l.cfg.FlushInterval)
	return max(l.grace, 2*f+3*l.stateRTT.Load())
}

// noteRTT folds one flush batch's duration into stateRTT: a decaying
// maximum, which takes a slow flush at once and forgets it by an eighth
// per flush.
func (l *Limiter) noteRTT(d time.Duration) {
	old := l.stateRTT.Load()
	l.stateRTT.Store(max(int64(d), old-old/8))
}

// stateDecision writes into d the decision on a state's answer: ok,
// the room left and the release time.
func stateDecision(d *Answer, t int64, r *Policy, limit, cost uint64, ok bool, remaining, releaseAt int64) {
	*d = Answer{Limit: limit}
	d.Allowed = ok
	d.Remaining = uint64(max(remaining, 0))
	// The estimate is the level the request was decided on, before its
	// own units.
	d.Estimate = float64(int64(limit) - max(remaining, 0))
	if ok {
		d.Estimate -= float64(cost)
	}
	w := int64(r.Window)
	d.ResetAt = algo.WindowStart(t, w) + w
	if !ok {
		d.ReleaseAt = releaseAt
		if releaseAt == math.MaxInt64 {
			d.ReleaseAt = 0 // never: cost above the bucket
		}
		if r.Action == policy.Block {
			d.ReleaseAt = t + int64(r.Timeout)
		}
	}
}

// syncStripes is the number of locks that make the sync decisions of one
// key on one edge take turns: the store then sees at most one
// read-modify-write per key from each edge, so a burst to one key
// contends between edges, not between its own requests.
const syncStripes = 1024

// stateSync takes the units in the store on the request path, only if
// they fit. failed reports that the store failed; d is then the admission
// a fail-open rule makes.
func (l *Limiter) stateSync(ctx context.Context, t int64, r *Policy, key, limit, cost uint64) (d Answer, failed bool) {
	mu := &l.syncMu[key%syncStripes]
	mu.Lock()
	defer mu.Unlock()
	opsp := l.sops.Get().(*[]store.StateOp)
	defer func() { clear(*opsp); l.sops.Put(opsp) }()
	ops := append((*opsp)[:0], store.StateOp{
		Kind: stateKind(r.Algorithm), Key: key, Bucket: bucketOf(r, limit), Log: logOf(r, limit),
		Now: t, N: int64(cost), Conditional: true,
	})
	*opsp = ops
	cctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	l.store.DoState(cctx, ops)
	cancel()
	l.m.storeOps.Inc()
	op := &ops[0]
	if op.Err != nil {
		stateDecision(&d, t, r, limit, cost, true, 0, t)
		return d, true
	}
	if !op.Allowed && r.Action == policy.Block && cost > 0 {
		// A block counts every attempt: pour the refused one too.
		ops[0].Conditional = false
		cctx, cancel := context.WithTimeout(context.Background(), l.cfg.StoreTimeout)
		l.store.DoState(cctx, ops[:1])
		cancel()
		l.m.storeOps.Inc()
		if ops[0].Err != nil {
			l.m.storeErrors.Inc()
		}
		ops[0].Allowed = false
	}
	stateDecision(&d, t, r, limit, cost, op.Allowed, op.Remaining, op.ReleaseAt)
	if op.Allowed && op.Kind == store.StateGCRA {
		d.Mark = op.TAT
	}
	if op.Allowed && r.Action == policy.Delay {
		lb := op.Bucket
		d.Delay = queueDelay(r, op.TAT-int64(cost)*int64(lb.Per)/lb.Rate, t)
	}
	return d, false
}

// stateRecord counts cost units a blocked key sent (answered from the
// block cache): they go out with the next flush, unconditionally. s.mu
// must be held.
func (s *shard) stateRecord(l *Limiter, t int64, r *Policy, key, cost uint64) {
	lb := bucketOf(r, r.Limit)
	v, _ := s.viewGet(l, key, t, r, lb)
	if v.kind == store.StateGCRA {
		lb.Pour(&v.view, t, int64(cost))
	}
	v.pend += int64(cost)
	v.at = max(v.at, t)
	s.enqueueView(key, v)
}

// flushStates sends every queued view's units (and the reads of keys new
// here) as one StateOp per key, in batches of at most MaxFlushOps, and
// folds the replies into the views.
func (l *Limiter) flushStates(ctx context.Context, t int64, st *FlushStats) {
	opsp := l.sops.Get().(*[]store.StateOp)
	ops := (*opsp)[:0]
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		q := s.vqueue
		s.vqueue, s.vspare = s.vspare[:0], nil
		s.mu.Unlock()
		for k := 0; k < len(q); {
			s.mu.Lock()
			for ; k < len(q) && len(ops) < l.cfg.MaxFlushOps; k++ {
				v := s.views[q[k]]
				if v == nil || v.flags&bvQueued == 0 {
					continue
				}
				v.flags &^= bvQueued
				op := store.StateOp{Kind: v.kind, Key: q[k], Bucket: v.lb, Log: algo.SlidingLog{Limit: v.lb.Rate, Window: v.lb.Per}, Now: t}
				if v.pend > 0 {
					op.N, op.Now = v.pend, v.at
					v.infl += v.pend
					v.pend = 0
					st.Keys++
				} else {
					l.m.storeReads.Inc()
				}
				ops = append(ops, op)
			}
			if k == len(q) {
				s.vspare = q[:0] // idle views are swept by collect
			}
			s.mu.Unlock()
			if len(ops) >= l.cfg.MaxFlushOps {
				ops = l.sendStates(ctx, t, ops, st)
			}
		}
	}
	if len(ops) > 0 {
		ops = l.sendStates(ctx, t, ops, st)
	}
	*opsp = ops
	l.sops.Put(opsp)
}

func (l *Limiter) sendStates(ctx context.Context, t int64, ops []store.StateOp, st *FlushStats) []store.StateOp {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	begin := time.Now()
	l.store.DoState(cctx, ops)
	took := time.Since(begin)
	l.noteRTT(took)
	l.m.flushSeconds.Observe(took.Seconds())
	cancel()
	failed := 0
	for i := range ops {
		op := &ops[i]
		if op.Err != nil {
			failed++
		}
		s := l.shardOf(op.Key)
		s.mu.Lock()
		s.applyView(l, t, op)
		s.mu.Unlock()
	}
	l.wake()
	st.Ops += len(ops)
	st.Failed += failed
	l.m.flushOps.Observe(float64(len(ops)))
	l.m.storeOps.Add(float64(len(ops)))
	l.m.storeErrors.Add(float64(failed))
	clear(ops)
	return ops[:0]
}

// applyView folds one reply into key's view. s.mu must be held.
func (s *shard) applyView(l *Limiter, t int64, op *store.StateOp) {
	v := s.views[op.Key]
	if v == nil {
		if op.Err != nil && op.N > 0 {
			l.m.pendingDropped.Add(float64(op.N))
		}
		return
	}
	sent := max(op.N, 0)
	v.infl -= min(v.infl, sent)
	v.seq++
	if op.Err != nil {
		v.flags |= bvFailed
		v.pend += sent // again with the next flush
		s.enqueueView(op.Key, v)
		return
	}
	v.flags &^= bvFailed
	v.replyAt = t
	if v.kind != store.StateGCRA {
		v.flags |= bvKnown
		return
	}
	reply := algo.LeakyBucketState{TAT: op.TAT, Frac: op.Frac}
	// What the shared bucket took beyond this edge's units: the other
	// edges' pours since the last reply (for the first, all the bucket
	// held beyond this edge's units). With no other pour the store did the
	// same arithmetic as expect, so any difference is another edge's.
	expect := v.shared // zero for a view with no reply yet
	if sent > 0 {
		v.lb.Pour(&expect, op.Now, sent)
	}
	others := int64(0)
	if diff := v.lb.Level(reply, t) - v.lb.Level(expect, t); diff > 0 {
		per := int64(v.lb.Per)
		others = (diff + per - 1) / per
		p := int32(2)
		if v.flags&bvKnown != 0 && sent > 0 {
			// Each other edge took at most about its share since its
			// own last reply, as this edge did.
			each := max(sent, v.share)
			p = int32(min(1+(others+each-1)/each, 64))
		}
		v.peers = max(p, v.peers)
		v.flags |= bvShared
	}
	if v.flags&bvKnown != 0 {
		// Alone, as far as replies can tell: none has shown another
		// edge's units since this edge has had the key's view. Once one
		// has, the key stays shared until the view is forgotten: an
		// edge whose flusher runs late may still spend its share of an
		// old reply after its units have stopped showing.
		v.alone = v.flags&bvShared == 0 && t-v.knownAt >= l.unsure()
		if v.alone {
			v.peers = 1
		}
		// Each other edge may have taken up to its share of the room
		// the last reply showed, not all of it flushed yet: keep that
		// much of the room for them until a reply shows it, for at most
		// a few flush intervals (by then it has landed, unless its
		// flusher runs late), so the reserve does not accumulate.
		pe := v.peersFor()
		reserve := int64(0)
		if pe > 1 {
			reserve = int64(pe-1) * v.share
			if t-v.unseenAt < l.unsure() {
				reserve = max(reserve, v.unseen)
			} else {
				v.unseenAt = t
			}
		}
		v.unseen = max(0, reserve-others)
	} else {
		v.unseen = 0
	}
	if v.flags&bvKnown == 0 {
		v.knownAt, v.alone = t, false
	}
	v.share = max(0, v.lb.Remaining(reply, t)-v.unseen) / int64(v.peersFor())
	v.shared = reply
	v.view = reply
	if v.pend > 0 {
		v.lb.Pour(&v.view, v.at, v.pend) // admitted since this op was sent
	}
	if v.infl > 0 {
		v.lb.Pour(&v.view, v.at, v.infl) // sent after this op, reply to come
	}
	v.flags |= bvKnown
}

// sweepViews frees at most budget views idle long enough to have drained,
// with nothing unsent. s.mu must be held.
func (s *shard) sweepViews(t int64, budget int) {
	for k, v := range s.views {
		if budget == 0 {
			return
		}
		budget--
		if t-v.last > v.idle && v.pend == 0 && v.infl == 0 && v.flags&bvQueued == 0 {
			delete(s.views, k)
		}
	}
}
