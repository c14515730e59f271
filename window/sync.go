package window

import (
	"math"
	"time"
)

// What an edge guesses of the others, and when a key's units go to the
// store.
//
// An edge learns the other edges' units on a key from the replies to its
// own operations, so at each decision it misses what they admitted since
// its last reply: with a client's requests dealt over every edge, that is
// most of the error. From the replies it keeps the others' recent rate on
// the key (othersUnseen) and, with Config.GuessPeers, counts at each
// decision that rate over the time since the last reply, rounded up and
// one unit at least while they are active. A refusal that only this guess made stands until the next
// flush's read of the key can have answered, and asks for that read.
//
// Unless Config.AsyncNearLimit is set, a decision does not guess: when
// the local view admits the request but leaves less room than the others
// could have filled unseen (nearReach: twice their likely unseen units, and a
// sixteenth of the limit for a burst their rate cannot tell), the
// request is decided as a sync rule's is, by one increment on the
// request path that carries this edge's unsent units too, on the count
// the store returns. Only keys whose replies show other edges' units pay
// it, and only within that reach of their limits: a client dealt over
// every edge at its limit, not one far below it or held by one edge.
// Should the round trip fail, the view decides, by the rule's failure
// policy.
//
// When a key's units go to the store. Every flush sends the units of the
// keys that could matter now, and a key far from its limit keeps its
// units for a while: one increment carries many requests, and most keys
// are far from their limits most of the time.
//
// Only a key held by this edge keeps its units: its share of the last
// window it ended was whole (all its units there this edge's, as the
// replies showed them), or in its first window here the store's count
// has held only this edge's units, four or more, for a sixteenth of the
// window since the first (guessShare), and its replies since show no other
// edge's. A key
// dealt over several edges sends its units at the next flush: the others
// decide on the store's count, and units kept here would be missing from
// it (measured: round-robin, the near-limit workload 0.145 % wrong
// without deferral, 0.268 % with every key's units waiting up to 625 ms).
// A held key's units could matter when what the PoP has not yet seen of
// it could fill the room left: this edge's unsent units, twice over for
// the round trip, against the units still admissible after the decision
// (a client that starts being dealt over other edges shows in the next
// reply). Such a key, a refused one, and one this edge has no reply for
// yet go at the next flush; the others wait at most Config.MaxDefer, at
// most a sixteenth of the rule's window, and never past the window's end:
// the other edges read an ended window once, when its grace is over, and
// a unit that lands after that read would be missed by them for the
// whole of the next window.

// A split store. While a part of the store is out (Store.Whole false: a
// memcached shard ejected) its keys are counted afresh on another part,
// where an edge that still reaches the lost part does not look, and that
// edge counts them alone in turn: each edge would admit a client up to the
// whole limit. So while the store is split, and for splitLinger after (a
// hung shard's retries put it back for a moment and eject it again), an
// edge holds a key to its share of the limit once its replies show that
// no other edge's units reach the key's count any more (the others' rate
// has fallen to zero), the share being the one the replies showed before
// the split (it stands until two of the key's windows have passed whole).
// A key whose count still grows with other edges' units (every edge lost
// the same part and counts its keys in the same place) keeps its whole
// limit, and so do a key whose share is not known (new since the split,
// or counted by this edge alone before it) and one the store fails (its
// rule's failure policy answers). A client within its limit may be
// refused while its traffic is dealt over the edges otherwise than it was
// before the split, and, for the few replies that show its count alone, a
// client whose count still had the others'.

// splitLinger is how long after the store was last split its keys may
// still be held to their shares: longer than a shard's retry timer, so
// that the retries of a shard still out do not release the hold.
const splitLinger = 10 * time.Second

// splitSince reports whether a flush found the store split within d
// before t (at t, for d 0: the last flush). A key counted together
// again shows the others' units in its replies at once and is released.
func (l *Limiter) splitSince(t, d int64) bool {
	at := l.splitAt.Load()
	return at != 0 && (l.split.Load() || t-at < d)
}

// splitIn reports whether a flush found the store split at some time
// between from and to (Unix ns), as far as the last two splits tell.
func (l *Limiter) splitIn(from, to int64) bool {
	at := l.splitAt.Load()
	return at != 0 && (at >= from && l.splitFrom.Load() <= to || l.splitEnded.Load() >= from)
}

// foldsShare reports whether key e's window that ended at end is a sample
// of its share: not when the store was split within two windows before
// (its counts are split, or mix the split's with the whole store's: a
// split store's shares stand).
func (l *Limiter) foldsShare(e *entry, end int64) bool {
	return !l.splitIn(end-2*e.win, end)
}

// heldLimit is the limit key e is decided against at t: limit, or while
// the store is split (or was, within splitLinger) and e's replies show no
// other edge's units, e's share of it. s.mu must be held.
func (l *Limiter) heldLimit(e *entry, t int64, limit uint64) uint64 {
	if e.orate != 0 || e.share-1 >= 254 {
		return limit // (inlined: the common case costs a few compares)
	}
	return l.shareOf(e, t, limit)
}

// shareOf is heldLimit for a key its replies show counted alone.
func (l *Limiter) shareOf(e *entry, t int64, limit uint64) uint64 {
	if e.flags&flagFailed != 0 || !l.splitSince(t, int64(splitLinger)) {
		return limit
	}
	l.m.shareHeld.Inc()
	return max(1, uint64(math.Round(float64(limit)*float64(e.share)/255)))
}

// A key new here reads its previous window at its second decision. Most
// keys an edge meets for the first time it meets once in their window (a
// crawler's one request, a client passing through), and a key's first
// decision here is made on the local view, before any read, in any case.
// The flush that sends that first unit learns the current window's count
// from the increment's reply and leaves the previous window unread while
// the key has had one unit here, so a key seen once costs the store one
// operation, not two. A later unit has its key's units sent at the next
// flush (syncDue), which reads the previous window; until that reply,
// decisions are made without the previous window's weight. So a client
// that comes to this edge at its limit from another, after one request,
// is admitted past its limit for a flush interval and a round trip, not
// for a fresh limit. A request that comes before the first increment's
// reply waits for the store's counts, as the second request of a key new
// here always has (Config.NewKeyWait), and has the flush read both
// windows (flagRefresh); one that comes while that increment is on its
// way gets the current window's count from its reply, and the previous
// window's at the next flush.

// lazyAll is a time past every due time: take moves every waiting entry.
const lazyAll = math.MaxInt64

// syncDue returns when entry e's unsent units, after a decision that
// leaves room units admissible, must be sent: t for the next flush. s.mu
// must be held.
func (l *Limiter) syncDue(e *entry, t int64, r *Policy, allowed bool, room uint64) int64 {
	if l.cfg.MaxDefer <= 0 || !allowed || e.flags&(flagNeedCurr|flagFailed) != 0 || e.flags&flagPrevKnown == 0 {
		return t
	}
	if e.orate != 0 || e.share < 255 || 2*uint64(e.pend) >= room {
		// Dealt over several edges, or held here with unsent units the
		// round trip's margin could not hide from the room left.
		return t
	}
	return min(t+min(int64(l.cfg.MaxDefer), int64(r.Window)/16), e.start+e.win)
}

// noteShare folds the window that ends into e's share of the key's
// traffic: this edge counted e.own of its units, the PoP e's view of
// them (the store's last count and this edge's units since). A window
// of many units weighs more than one of a few, so that the share is near
// the part of the key's units that are this edge's; a window in which
// only the others counted units is a sample of none (shareLate refolds a
// sample, so every window with units must have been folded). s.mu must be
// held.
func (e *entry) noteShare() {
	total := uint64(e.curr) + uint64(e.infl) + uint64(e.pend)
	own := min(uint64(e.own), total)
	if total == 0 || e.win < int64(time.Millisecond) {
		return
	}
	if e.share == 0 {
		if own > 0 {
			e.share = uint8(min(255, max(1, own*255/total)))
		}
		return
	}
	// Rounded towards the sample: rounded to nearest, a step under half a
	// 255th was lost, so a window of fewer units than shareSteps could
	// not move the share, and a key this edge held alone stuck at 254,
	// never whole.
	s := float64(e.share)
	s += (float64(own)*255 - s*float64(total)) / (float64(total) + shareSteps)
	if own*255 > uint64(e.share)*total {
		s = math.Ceil(s)
	} else {
		s = math.Floor(s)
	}
	e.share = uint8(min(255, max(1, s)))
}

// shareLate corrects key e's share for n units of its previous window
// that reached this edge's view after the window ended, the view being
// before: other edges' units (this edge's own were in the view), which
// the window's sample (noteShare, at the roll, over the view it had then)
// missed. Each edge's view misses the others' last units of a window, so
// without this every edge's share came out high: in the partition test
// (faults/) two edges' shares of a client dealt evenly over them summed
// to up to 1.3, and the split store held clients to up to 1.17 times
// their limits. The sample is refolded as if it had counted them; late
// parts of one window refold it in turn to the same result. s.mu must be
// held.
func (l *Limiter) shareLate(e *entry, before, n uint64) {
	if e.share == 0 || n == 0 || e.win < int64(time.Millisecond) || !l.foldsShare(e, e.start) {
		return
	}
	s := float64(e.share) * float64(before+shareSteps) / float64(before+n+shareSteps)
	e.share = uint8(max(1, s+0.5))
}

// guessShare guesses e's share from a reply at t, until a window's end
// says better (noteShare): this edge's increment of own units took the
// counter from e.curr to value. A first guess is short of whole, since
// one reply may come before the other edges' first units; it is made
// whole once the count has been this edge's units alone, four or more,
// the first of them a sixteenth of the window ago (long enough for the
// other edges' units, had the client been dealt over them, to show), so
// that a key held here keeps its units (syncDue) from its first window,
// not its second. s.mu must be held.
func (e *entry) guessShare(t int64, own, value uint64) {
	switch {
	case e.share == 0:
		if own == 0 || value < uint64(e.curr) || e.win < int64(time.Millisecond) {
			return
		}
		total := max(value-uint64(e.curr), own)
		e.share = uint8(min(254, max(1, own*255/total)))
	case e.share == 254 && e.orate == 0 && e.own >= 4 && e.first != 0:
		sent := uint64(e.own) - min(uint64(e.own), uint64(e.infl)+uint64(e.pend))
		if value <= sent && t-e.instant(e.first) >= e.win/16 {
			e.share = 255
		}
	}
}

// shareSteps is about the number of units under which a window's sample
// of the share weighs less than the share it updates. A window of a light
// client's ten units, whose sample is about 16 % off when the client is
// dealt at random, weighs 10/26, so its share carries about a third of
// that error (TestSharesOfALightClientAreSteady): a split store holds the
// client to its dealing, not its last window's luck.
const shareSteps = 16

// nearReach is how close to key e's limit, in units of room left after a
// decision at t, the decision takes a round trip (unless
// Config.AsyncNearLimit): 0 while e's recent replies show no other edge's
// units (their rate is 0 and the share known: a key held by this edge, or
// one the others left, or one a split store counts here alone, which the
// hold to the share answers), else twice what the others likely admitted
// unseen (the margin syncDue takes for the round trip), and a sixteenth
// of the limit for what a rate cannot tell (a burst). What they admitted
// unseen is the larger of their recent rate over the time since the last
// reply and, at this edge's share, as many unsent units as this edge has
// (as many as this edge's while the share is not known: a key new here,
// at its onset). A rate past what orate holds (2^16 - 1 units a window)
// tells nothing: every decision that admits takes the round trip. None
// does in a window under a millisecond. s.mu must be held.
func (e *entry) nearReach(t int64, limit uint64) uint64 {
	switch {
	case e.orate == 0 && e.share != 0, e.win < int64(time.Millisecond):
		// (A window under a millisecond shares its counter's name, in
		// milliseconds, with its neighbours: the store's count is not
		// its own.)
		return 0
	case e.orate == math.MaxUint16:
		return limit
	}
	mine := uint64(e.pend) + uint64(e.infl)
	theirs := mine
	if e.share != 0 {
		theirs = mine * uint64(255-e.share) / uint64(e.share)
	}
	return 2*max(e.othersUnseen(t), theirs) + (limit+15)/16
}

// othersUnseen estimates the units the other edges admitted, at t, since
// the store last told this edge the key's count: their recent rate (from
// the replies) over the time since, at most an eighth of a window. 0 while
// the replies show no other edge's units.
func (e *entry) othersUnseen(t int64) uint64 {
	if e.orate == 0 {
		return 0
	}
	// Rounded up, and one unit at least while the others are active (the
	// last of theirs may be on its way): near the limit, missing a unit
	// they did admit costs an over-admission, and guessing one they did
	// not costs a refusal that the next reply ends.
	since := min(max(t-e.replied(), 0), e.win/8)
	return max(1, uint64(math.Ceil(float64(e.orate)*float64(since)/float64(e.win))))
}

// replied is when the store last told this edge the key's current count
// (the window's start when it has not this window), Unix ns.
func (e *entry) replied() int64 {
	if e.reply == 0 {
		return e.start
	}
	return e.instant(e.reply)
}

// instant is the time a 1-based offset of e's window (first, reply)
// stands for, Unix ns.
func (e *entry) instant(off uint16) int64 {
	return e.start + int64(off-1)<<firstShift(e.win)
}

// noteRate folds a reply at t into the other edges' recent rate: the
// counter went from e.curr to value since the last reply, own units of it
// this edge's. s.mu must be held.
func (e *entry) noteRate(t int64, own, value uint64) {
	dt := t - e.replied()
	if dt <= 0 || value < uint64(e.curr)+own || e.win < int64(time.Millisecond) {
		// (A window under a millisecond shares its counter's name, in
		// milliseconds, with its neighbours: its replies say nothing of
		// rates.)
		return
	}
	others := float64(value - uint64(e.curr) - own)
	if others == 0 {
		// Halved down, so that a rate the replies stop showing comes
		// to zero (a split store's test, heldLimit).
		e.orate /= 2
		return
	}
	sample := min(others*float64(e.win)/float64(dt), math.MaxUint16)
	e.orate = uint16((float64(e.orate) + sample + 1) / 2)
}

// noteRate is entry i's noteRate, and reads its previous window again
// when the reply is the first to show other edges' units on a key this
// edge held alone. Such a key's previous window was taken to be known
// when it ended (alone): the store's count then was this edge's view.
// At a client's onset that can be wrong: a client dealt over the edges
// that begins late in a window has a few units there, and an edge can end
// the window before any reply shows it the others' (two edges, the
// near-limit trace started 0.3 s before a boundary: an edge held 2 of a
// client's 6 units as the whole window, and admitted it past its limit in
// the next). A read costs one operation per key that changes from held to
// dealt. s.mu must be held.
func (s *shard) noteRate(i uint32, t int64, own, value uint64) {
	e := &s.slab[i]
	held := e.heldHere()
	e.noteRate(t, own, value)
	if held && e.orate != 0 && e.flags&flagPrevKnown != 0 && e.prev != 0 {
		e.flags &^= flagPrevKnown
		s.enqueue(i)
	}
}

// lazyEntry is an entry whose unsent units wait until due.
type lazyEntry struct {
	due int64
	key uint64
	i   uint32
}

// lazyHeap is a min-heap of waiting entries by due time.
type lazyHeap []lazyEntry

// wait lets entry i's unsent units wait until due, unless they are
// queued for the next flush or already waiting. s.mu must be held.
func (s *shard) wait(i uint32, due int64) {
	e := &s.slab[i]
	if e.flags&(flagQueued|flagLazy) != 0 {
		return
	}
	e.flags |= flagLazy
	h := append(s.lazy, lazyEntry{due: due, key: e.key, i: i})
	for c := len(h) - 1; c > 0; {
		p := (c - 1) / 2
		if h[p].due <= h[c].due {
			break
		}
		h[p], h[c] = h[c], h[p]
		c = p
	}
	s.lazy = h
	s.flusher.wake()
}

// dueLazy queues for this flush every waiting entry due by t. s.mu must
// be held.
func (s *shard) dueLazy(t int64) {
	h := s.lazy
	for len(h) > 0 && h[0].due <= t {
		top := h[0]
		n := len(h) - 1
		h[0] = h[n]
		h = h[:n]
		for p := 0; ; {
			c := 2*p + 1
			if c >= n {
				break
			}
			if c+1 < n && h[c+1].due < h[c].due {
				c++
			}
			if h[p].due <= h[c].due {
				break
			}
			h[p], h[c] = h[c], h[p]
			p = c
		}
		if int(top.i) < len(s.slab) {
			if e := &s.slab[top.i]; e.key == top.key && e.flags&flagLazy != 0 {
				e.flags &^= flagLazy
				if e.pend > 0 || e.prevPend > 0 {
					s.enqueue(top.i)
				}
			}
		}
	}
	s.lazy = h
}
