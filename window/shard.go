package window

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// entry is the local view of one key under one rule: 64 bytes.
//
// prev and curr are the global counts the store last reported for the
// previous and the current window; the …Infl fields are increments sent and
// not yet acknowledged, the …Pend fields increments not yet sent. The
// estimate uses their sums, so this edge's own admissions weigh at once and
// other edges' within a flush.
type entry struct {
	key   uint64
	start int64 // current window's start, Unix ns
	win   int64 // the rule's window, ns
	// pfirst is first as it was in the previous window (spans).
	pfirst uint16
	// own is the units this edge counted in the current window
	// (saturating): at the window's end, a sample of its share.
	own uint16

	prev, prevInfl, prevPend uint32
	curr, infl, pend         uint32

	flags uint8
	// share is this edge's share of the key's increments, in 255ths, as
	// the store's replies show it (an average over the recent ones); 0:
	// not known yet.
	share uint8
	first uint16 // 1 + when this edge first counted units this window, in 2^firstShift ns; 0: not yet
	reply uint16 // 1 + when the store last told this edge the current window's count, likewise; 0: not yet
	// orate is the other edges' recent rate on the key, in units per
	// window, from the last replies (saturating).
	orate uint16
	hist  uint32 // its histograms' record in the shard's slab + 1; 0: none (hist.go)
}

// off is t's offset after e's window start, in 2^firstShift(win) ns:
// under 2^15 within the window.
func (e *entry) off(t int64) uint32 { return uint32(max(t-e.start, 0) >> firstShift(e.win)) }

// spans are the parts of key e's previous and current windows, in ns up
// to their ends, over which their units are spread when no shape places
// them: from the first unit this edge counted or saw there, else all of
// it (or, for a previous window this edge saw nothing of, the part the
// key's rate here places its units in: placePrev). A client that starts
// late in a window has its units there, not
// spread over the window: spread, they would weigh less and less in the
// next window while in fact all still count, and the client would be
// admitted past its limit (by up to the count it had then; above a
// sixteenth of the limit a shape records it). The other edges' units are
// taken to come no earlier than this edge's first, as a shape's base is:
// at a client's onset they come within a flush or two of each other, and
// a client that reached the others long before this edge is one whose
// count this edge overrates for a window (it errs toward refusing).
// Measured in the simulator (two edges, the near-limit trace started 0.3 s
// before a window boundary): 0.0995 % wrong spread over the whole window,
// 0.0245 % with this, clients dealt round-robin 0.245 % and 0.167 %. s.mu
// must be held.
func (e *entry) spans() algo.Spans {
	sp := algo.Spans{Prev: e.win, Next: e.win}
	if e.pfirst > 1 {
		sp.Prev -= int64(e.pfirst-1) << firstShift(e.win)
	}
	if e.first > 1 {
		sp.Next -= int64(e.first-1) << firstShift(e.win)
	}
	return sp
}

// placeMin is the units of its current window from which a key's rate
// there places its previous window's (placePrev).
const placeMin = 8

// placePrev places the units of key e's previous window, of which this
// edge counted and saw none while it ran (pfirst 0: the key was new here,
// or idle here while the others counted it), once that window is known
// (read), when they cannot have been spread by this edge's first: at the
// key's rate in its current window (its view's units by t), up to the
// window's end. A client present all along at one rate has its units
// spread over the whole window, as before; one that began late in it (its
// onset: a few units, all in the trailing window until late in this one)
// has them over the time that rate takes to send them. Spread over the whole
// window, such units weighed as leaving while they all still counted, and
// the client was admitted past its limit by up to their number. The span
// is set once (pfirst): release times made on it hold. s.mu must be held.
//
// The rate is taken once the current window holds placeMin units, and as
// many as the previous one: from fewer it is noise, and a client that had
// more there than here (one that moved here, or slowed) keeps the whole
// window. (Measured in the simulator, the near-limit trace started 0.3 s
// before a boundary, round-robin: wrongly allowed 37 without the placement,
// 32 with the rate taken from the current window's first unit on, 26 with
// both conditions.)
//
// It runs when a reply or a read lands, off the request path: the
// placement lags the decision that reached placeMin by a flush at most.
func (e *entry) placePrev(t int64) {
	if e.pfirst != 0 || e.flags&flagPrevKnown == 0 {
		return
	}
	prev, curr := e.view()
	el := t - e.start
	if prev == 0 || curr < max(placeMin, prev) || el <= 0 {
		return
	}
	span := min(float64(prev)*float64(el)/float64(curr), float64(e.win))
	sh := firstShift(e.win)
	e.pfirst = uint16(1 + (uint64(e.win-int64(span)) >> sh))
}

const (
	flagQueued    uint8 = 1 << iota // in its shard's flush queue
	flagRef                         // used since the eviction hand last passed
	flagPrevKnown                   // prev has been read from the store this window
	flagNeedCurr                    // curr has never been read: the key is new here
	flagFailed                      // the last store operation for the key failed
	flagNoHist                      // no histogram was free for it this window
	flagLazy                        // its unsent units wait in the shard's lazy heap
	flagRefresh                     // refused on the others' guessed units: read its count at the next flush
)

func (e *entry) view() (prev, curr uint64) {
	return uint64(e.prev) + uint64(e.prevInfl) + uint64(e.prevPend),
		uint64(e.curr) + uint64(e.infl) + uint64(e.pend)
}

// shard is one independently locked part of the key table. Its entries sit
// in a slab (no pointer per key for the garbage collector to chase), found
// through an open-addressed index from key hash to slab index (index.go).
type shard struct {
	// mu protects the fields below.
	mu     sync.Mutex
	idx    keyIndex
	slab   []entry
	free   []uint32
	queue  []uint32               // entries with increments to send or reads to make
	spare  []uint32               // the previous queue, reused
	hand   int                    // eviction hand (CLOCK)
	sweep  int                    // idle-sweep cursor
	swept  int64                  // when the idle sweep last ran (Unix ns)
	max    int                    // entries at most
	views  map[uint64]*bucketView // state views: buckets' and logs' keys (shared.go)
	vqueue []uint64               // views with units to send or reads to make
	vspare []uint64               // the previous vqueue, reused
	lazy   lazyHeap               // entries whose unsent units may wait, by when they must go (sync.go)
	hists  hists                  // hot keys' window shapes (hist.go)

	flusher *flusherPark // the limiter's: a queue that grows wakes it if parked

	n atomic.Int64 // live entries, read without mu
	_ [64]byte     // keep neighbouring shards' locks off this cache line
}

func (s *shard) init(max int, hp histParams, f *flusherPark) {
	s.flusher = f
	s.max = max
	s.hists.init(max, hp)
}

// lookup returns key's entry, or nil. s.mu must be held.
func (s *shard) lookup(key uint64) *entry {
	if i, ok := s.idx.get(key); ok {
		return &s.slab[i]
	}
	return nil
}

// get returns the slab index of key's entry, rolled to the window
// containing t, creating it if needed. fresh reports a view that starts
// over here: created, or reset after a window or more without requests.
// s.mu must be held.
func (s *shard) get(l *Limiter, key uint64, t int64, r *Policy) (i uint32, fresh bool) {
	if i, ok := s.idx.get(key); ok {
		e := &s.slab[i]
		if t >= e.start+e.win {
			fresh = s.roll(l, i, t, r)
		}
		e.flags |= flagRef
		return i, fresh
	}
	i = s.alloc(l)
	e := &s.slab[i]
	s.histFree(e)
	w := int64(r.Window)
	// A new entry starts unreferenced: only a second request marks it, so
	// a flood of one-request keys is evicted on the hand's first pass and
	// cannot push out the keys that come back (CLOCK's scan resistance).
	*e = entry{key: key, start: algo.WindowStart(t, w), win: w,
		flags: flagNeedCurr | e.flags&flagQueued}
	s.idx.put(key, i)
	s.n.Add(1)
	s.enqueue(i)
	return i, true
}

// roll moves entry i, of rule r, to the window containing t and reports
// whether the view was reset (idle for a whole window or more). The
// window that ends is read from the store once its grace is over (the
// other edges' last units), unless the key's units were this edge's alone
// (alone) and its rule is async. s.mu must be held.
func (s *shard) roll(l *Limiter, i uint32, t int64, r *Policy) (reset bool) {
	e := &s.slab[i]
	start := algo.WindowStart(t, e.win)
	s.histRoll(e, start, uint64(e.curr)+uint64(e.infl)+uint64(e.pend))
	known := r.Mode != policy.Sync && e.alone(start)
	if start == e.start+e.win {
		// The current window becomes the previous one; anything still
		// unsent for the window before it is lost.
		if e.prevPend > 0 {
			l.m.pendingDropped.Add(float64(e.prevPend))
		}
		if l.foldsShare(e, start) {
			e.noteShare()
		}
		e.pfirst = e.first
		e.prev, e.prevInfl, e.prevPend = e.curr, e.infl, e.pend
	} else {
		// Idle for a whole window or more.
		if lost := uint64(e.prevPend) + uint64(e.pend); lost > 0 {
			l.m.pendingDropped.Add(float64(lost))
		}
		e.prev, e.prevInfl, e.prevPend, e.pfirst = 0, 0, 0, 0
		e.flags |= flagNeedCurr
		if !l.splitSince(t, 2*e.win) {
			// What the replies said of the key's traffic is stale: a
			// client back after a while may be dealt otherwise.
			e.share, e.orate = 0, 0
		}
		reset = true
	}
	e.curr, e.infl, e.pend = 0, 0, 0
	e.first, e.reply, e.own = 0, 0, 0
	e.start = start
	e.flags &^= flagPrevKnown | flagNoHist
	if known && !reset && e.prevPend+e.prevInfl == 0 {
		// Its view of the window that ended is the store's count: nothing
		// to read (nor, with no units unsent, to send).
		e.flags |= flagPrevKnown
		return reset
	}
	s.enqueue(i)
	return reset
}

// joined is told, by the first reply to show entry i its key's current
// window, the store's count of it (seen), and what the previous window
// held if that has been read (prev, known). Units there that this edge did
// not count came before the entry knew the key: it was evicted and made
// again, the edge restarted, or the client moved here. When they came is
// not known, so they are spread from the window's start (fromStart), not
// from this edge's first unit (spans): spread from there, a client seen
// whole would weigh the window's units in the next one as if they had all
// come late, and be refused part of its limit there (a client at twice
// its limit, its view evicted every 3.7 s: 268 of 300 admitted). The
// exception is a client's onset, when the edges' first units come within
// a flush or two of each other, as spans assumes: the others' units no
// more than a few edges dealt the client as many as this one (four times
// its own, and two), and the previous window, if read, empty. s.mu must
// be held.
func (s *shard) joined(i uint32, seen, prev uint64, known bool) {
	e := &s.slab[i]
	own := uint64(e.own)
	if seen > own && e.first > 1 && (seen > 5*own+2 || known && prev > 0) {
		s.fromStart(e)
	}
}

// fromStart has key e's units of its current window, as far as this edge
// has not placed them, spread from the window's start: its span, and the
// base of a shape begun this window. s.mu must be held.
func (s *shard) fromStart(e *entry) {
	e.first = 1
	if e.hist == 0 {
		return
	}
	if rec, c := s.histCur(e); rec.h[c].start == e.start {
		rec.h[c].from = e.start
	}
}

// heldHere reports whether key e's replies say this edge holds it: no
// other edge's units in them of late, and its share of the key whole
// within rounding. s.mu must be held.
func (e *entry) heldHere() bool { return e.orate == 0 && e.share >= 250 }

// alone reports whether key e's units of its window, which ends at end,
// were all this edge's as far as its replies tell: its share of them
// (over the windows that ended before) is whole, within rounding, the
// replies show no other edge's, and the last one came in the window's
// second half. Such a key is held by this edge (a balancer that hashes
// the client's address) and was until late in the window: the others
// cannot have added to it after the last reply, unless the client moved
// to them in the window's last half and comes back here. s.mu must be
// held.
func (e *entry) alone(end int64) bool {
	return e.heldHere() && e.reply != 0 && e.replied() >= end-e.win/2
}

// count adds cost units at t to entry i's unsent increments; sendBy
// says when they go. s.mu must be held.
func (s *shard) count(i uint32, t int64, cost uint64) {
	e := &s.slab[i]
	e.pend = sat32(uint64(e.pend) + cost)
	e.own = uint16(min(uint64(e.own)+cost, 1<<16-1))
	if e.first == 0 && cost > 0 {
		e.setFirst(t)
	}
}

// sendBy has entry i's unsent units sent at the next flush when due is
// not after t, else by due at the latest (see syncDue). s.mu must be
// held.
func (s *shard) sendBy(i uint32, t, due int64) {
	if due <= t {
		s.enqueue(i)
	} else {
		s.wait(i, due)
	}
}

func (s *shard) enqueue(i uint32) {
	e := &s.slab[i]
	if e.flags&flagQueued != 0 {
		return
	}
	e.flags |= flagQueued
	s.queue = append(s.queue, i)
	s.flusher.wake()
}

// evictScan bounds how many entries one allocation looks at for a victim.
const evictScan = 64

// alloc returns a free slab index, evicting the least recently used entry
// (CLOCK) when the shard is full. A victim with unsent increments is taken
// only when no idle one is found within evictScan entries; its increments are
// counted as dropped. The returned slot keeps its flagQueued bit, so a slot
// still listed in the queue stays listed once. s.mu must be held.
func (s *shard) alloc(l *Limiter) uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i
	}
	if len(s.slab) < s.max {
		if len(s.slab) == cap(s.slab) {
			grown := make([]entry, len(s.slab), min(s.max, 2*len(s.slab)+16))
			copy(grown, s.slab)
			s.slab = grown
		}
		s.slab = append(s.slab, entry{})
		return uint32(len(s.slab) - 1)
	}
	// CLOCK: the hand passes referenced entries, clearing their bit, and
	// stops at the first unreferenced one with nothing unsent. An
	// unreferenced entry with unsent increments is taken only when the scan
	// finds nothing better, and the hand moves only to the victim, so a
	// burst of new (queued) keys cannot make it race round the table
	// clearing the bits of the keys that keep coming back.
	n := len(s.slab)
	victim, fallback := -1, -1
	for k := 1; k <= evictScan; k++ {
		i := (s.hand + k) % n
		f := s.slab[i].flags
		switch {
		case f&flagRef != 0:
		case f&(flagQueued|flagLazy) != 0:
			if fallback < 0 {
				fallback = i
			}
		default:
			victim = i
		}
		if victim >= 0 {
			break
		}
	}
	if victim < 0 {
		victim = fallback
	}
	if victim < 0 {
		victim = (s.hand + evictScan) % n // all referenced: take the last seen
	}
	for i := (s.hand + 1) % n; i != victim; i = (i + 1) % n {
		s.slab[i].flags &^= flagRef
	}
	s.hand = victim
	e := &s.slab[victim]
	if lost := uint64(e.prevPend) + uint64(e.pend); lost > 0 {
		l.m.pendingDropped.Add(float64(lost))
	}
	s.idx.del(e.key)
	s.histFree(e)
	s.n.Add(-1)
	l.m.evictions.Inc()
	return uint32(victim)
}

// sweepPerFlush bounds the entries one sweep checks for idleness per shard
// (in each of its tables: the counters' slab and the state views).
const sweepPerFlush = 256

// sweepEvery is how often a shard's idle sweep runs at most, whatever the
// flush interval, so that a flush's cost does not grow with the keys
// known. An entry idle for two of its windows (a second at least) is
// freed within sweepEvery × entries/sweepPerFlush more, the bound on the
// table (MaxKeys, least recently used out first) holding meanwhile.
const sweepEvery = int64(100 * time.Millisecond)

// sweepDue reports whether the shard's idle sweep runs at t, and if so
// notes that it ran. s.mu must be held.
func (s *shard) sweepDue(t int64) bool {
	if t-s.swept < sweepEvery && t >= s.swept {
		return false
	}
	s.swept = t
	return true
}

// take swaps out the shard's flush queue, with the waiting entries due by
// t (every one when t is lazyAll) moved into it: the entries to visit in
// this flush. Entries queued meanwhile go into a fresh queue, for the next
// flush. It locks s.mu.
func (s *shard) take(t int64) []uint32 {
	s.mu.Lock()
	s.dueLazy(t)
	q := s.queue
	s.queue, s.spare = s.spare[:0], nil
	s.mu.Unlock()
	return q
}

// collect appends to ops the increments and reads due for the entries
// q[k:], marking the increments in flight, until ops holds budget ops or
// more; it returns the index of the first entry not visited. When it reaches
// the end of q it gives q back for reuse and frees a bounded number of idle
// entries. Entries not yet visited keep their queued flag, so the request
// path does not queue them twice. It locks s.mu.
func (s *shard) collect(l *Limiter, t int64, q []uint32, k int, ops []store.Op, budget int, st *FlushStats) (int, []store.Op) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ; k < len(q) && len(ops) < budget; k++ {
		i := q[k]
		e := &s.slab[i]
		if e.flags&flagQueued == 0 {
			continue
		}
		e.flags &^= flagQueued
		if j, ok := s.idx.get(e.key); !ok || j != i {
			continue // a freed slot
		}
		sent := false
		ttl := 2 * e.win
		// A key new here with one unit, no decision waiting on it, leaves
		// its previous window unread (sync.go): most such keys are seen
		// once. The read goes before the current window's ops, so that a
		// key new here knows, when their replies land, whether it had
		// units before this window (joined).
		once := e.flags&(flagNeedCurr|flagRefresh) == flagNeedCurr && e.own <= 1 && e.prev|e.prevInfl|e.prevPend == 0
		readPrev := e.flags&flagPrevKnown == 0 && !once && t >= e.start+l.grace
		if readPrev {
			ops = append(ops, store.Op{Key: e.key, Start: (e.start - e.win) / 1e6})
			l.m.storeReads.Inc()
		}
		if e.prevPend > 0 {
			ops = append(ops, store.Op{Key: e.key, Start: (e.start - e.win) / 1e6, Delta: int64(e.prevPend), TTL: durationOf(ttl)})
			e.prevInfl = sat32(uint64(e.prevInfl) + uint64(e.prevPend))
			e.prevPend = 0
			sent = true
		}
		incrCurr := e.pend > 0
		if incrCurr {
			// Nothing counted yet this window as far as this edge knows:
			// the counter is probably not in the store.
			fresh := e.curr == 0 && e.infl == 0
			ops = append(ops, store.Op{Key: e.key, Start: e.start / 1e6, Delta: int64(e.pend), TTL: durationOf(ttl), New: fresh})
			e.infl = sat32(uint64(e.infl) + uint64(e.pend))
			e.pend = 0
			sent = true
		}
		if sent {
			st.Keys++
		}
		if e.flags&(flagNeedCurr|flagRefresh) != 0 && !incrCurr {
			// A key new here, or refused on what this edge guessed of the
			// others, with nothing to send: read its current window now,
			// so that its next decision counts what the other edges
			// admitted (an increment's reply does as much).
			ops = append(ops, store.Op{Key: e.key, Start: e.start / 1e6})
			l.m.storeReads.Inc()
		}
		e.flags &^= flagRefresh
		if e.flags&flagPrevKnown == 0 && !once && !readPrev {
			s.enqueue(i) // within the grace: other edges' last flushes may still land
		}
	}
	if k < len(q) {
		return k, ops
	}
	s.spare = q[:0]
	if !s.sweepDue(t) {
		return k, ops
	}
	s.sweepViews(t, sweepPerFlush)
	// Free entries idle for two of their windows with nothing in flight
	// (an entry's last use was within its current window, so two windows
	// past its end: between two and three windows idle).
	for n := 0; n < sweepPerFlush && len(s.slab) > 0; n++ {
		if s.sweep++; s.sweep >= len(s.slab) {
			s.sweep = 0
		}
		e := &s.slab[s.sweep]
		if t-(e.start+e.win) <= 2*e.win || e.flags&(flagQueued|flagLazy) != 0 || e.infl != 0 || e.prevInfl != 0 {
			continue
		}
		if i, ok := s.idx.get(e.key); !ok || i != uint32(s.sweep) {
			continue
		}
		s.idx.del(e.key)
		s.histFree(e)
		s.n.Add(-1)
		e.key = 0
		s.free = append(s.free, uint32(s.sweep))
	}
	return k, ops
}

// apply folds the replies to this shard's ops into the local view and
// returns how many failed. It locks s.mu.
func (s *shard) apply(l *Limiter, t int64, ops []store.Op) (failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range ops {
		op := &ops[k]
		if op.Err != nil {
			failed++
		}
		i, ok := s.idx.get(op.Key)
		if !ok {
			if op.Err != nil && op.Delta > 0 {
				l.m.pendingDropped.Add(float64(op.Delta))
			}
			continue
		}
		e := &s.slab[i]
		isCurr := op.Start == e.start/1e6
		isPrev := op.Start == (e.start-e.win)/1e6
		if op.Err != nil {
			e.flags |= flagFailed
		} else {
			e.flags &^= flagFailed
		}
		before := uint64(e.curr) + uint64(e.infl) + uint64(e.pend)
		prevBefore, _ := e.view()
		switch {
		case op.Delta > 0 && isCurr:
			d := uint32(op.Delta)
			e.infl -= min(e.infl, d)
			if op.Err != nil {
				e.pend = sat32(uint64(e.pend) + uint64(d))
				s.enqueue(i)
			} else {
				// The reply is the global count: what the other edges
				// admitted is known here from now on, and, unless it is
				// the first count this edge sees of the key, how much of
				// the key's traffic is this edge's.
				if e.flags&flagNeedCurr == 0 {
					if !l.splitSince(t, 0) {
						e.guessShare(t, uint64(d), op.Value)
					}
					s.noteRate(i, t, uint64(d), op.Value)
				} else {
					s.joined(i, op.Value, uint64(e.prev), e.flags&flagPrevKnown != 0)
				}
				e.curr = max(e.curr, sat32(op.Value))
				e.flags &^= flagNeedCurr
			}
		case op.Delta > 0 && isPrev:
			d := uint32(op.Delta)
			e.prevInfl -= min(e.prevInfl, d)
			if op.Err != nil {
				e.prevPend = sat32(uint64(e.prevPend) + uint64(d))
				s.enqueue(i)
			} else {
				e.prev = max(e.prev, sat32(op.Value))
			}
		case op.Delta > 0:
			if op.Err != nil {
				l.m.pendingDropped.Add(float64(op.Delta))
			}
		case op.Err != nil && (isCurr || isPrev):
			s.enqueue(i) // read again next flush
		case isPrev:
			e.prev = max(e.prev, sat32(op.Value))
			e.flags |= flagPrevKnown
		case isCurr:
			if e.flags&flagNeedCurr == 0 {
				s.noteRate(i, t, 0, op.Value)
			} else {
				s.joined(i, op.Value, uint64(e.prev), e.flags&flagPrevKnown != 0)
			}
			e.curr = max(e.curr, sat32(op.Value))
			e.flags &^= flagNeedCurr
		}
		if op.Err == nil && isCurr {
			e.reply = uint16(min(e.off(t), 1<<15-1)) + 1
		}
		if op.Err == nil {
			e.placePrev(t)
		}
		if p, _ := e.view(); isPrev && p > prevBefore {
			s.histLate(e, p-prevBefore)
			l.shareLate(e, prevBefore, p-prevBefore)
		}
		if after := uint64(e.curr) + uint64(e.infl) + uint64(e.pend); isCurr && after > before && e.hist != 0 {
			// What the other edges admitted, seen now: the shape
			// places it at this flush, within one interval of when
			// it was admitted.
			s.histNote(l, i, t, after-before, 0, 0, 0)
		}
	}
	return failed
}
