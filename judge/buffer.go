package judge

import (
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// Flag bits of pending.flags.
const (
	fLimited = 1 << iota
	fSync
	fBlock
	fCache
	fShadow
	fFallback
	fGlobal   // the rule's scope is global: its key is judged across PoPs
	fCounting // the rule counts by response: t is shifted by Config.SettleLateness, counted holds its units
)

// pending is an event waiting for the watermark: what judging needs, with
// the rule and PoP interned (an Event's Rule and Pop alias the consumer's
// buffer). 72 bytes; with its heap key and free-list slot, BytesPerBuffered.
type pending struct {
	// t is the event time floored to the resolution, Unix ns; for a
	// counting rule's event (fCounting) it is that plus the judge's settle
	// lateness: the time it is released, kept in order and expired by.
	t        int64
	seq      uint64 // arrival order, breaks ties of t; bit 63 set on a counting rule's refusal (after its admissions)
	arrived  int64  // arrival time, Unix ns, as given to Add
	hash     uint64 // key hash
	rule     uint32 // index into Judge.ruleNames
	cost     uint32
	limit    uint32
	windowMs uint32
	burst    uint32 // 0: Limit
	counted  uint32 // fCounting: the units its response counted
	estimate float32
	edge     uint16
	flags    uint8
	alg      uint8  // policy.Algorithm
	pop      uint16 // index into Judge.popNames
}

func flagsOf(e *event.Event) uint8 {
	var f uint8
	if e.Decision == event.Limited {
		f |= fLimited
	}
	if e.Global {
		f |= fGlobal
	}
	if e.Mode == policy.Sync {
		f |= fSync
	}
	if e.Action == policy.Block {
		f |= fBlock
	}
	if e.FromBlockCache {
		f |= fCache
	}
	if e.Shadow {
		f |= fShadow
	}
	if e.Fallback {
		f |= fFallback
	}
	if e.Counting {
		f |= fCounting
	}
	return f
}

// buffer is a min-heap of pending events by (t, seq). The heap holds
// 24-byte keys and a 4-ary layout, the events themselves staying put in a
// slab: a pop's sift-down then touches half the levels of a binary heap and
// a third of the bytes per level, which with hundreds of thousands of
// events buffered (2 s of lateness at 200,000 a second) is what it costs,
// in cache misses. It is written out rather than built on container/heap,
// whose interface boxes every pushed value (an allocation per event).
type buffer struct {
	h    []hkey
	slab []pending
	free []uint32 // slab slots not in use
	most int      // events at most (Config.MaxBuffered + 1, the one pushed before the oldest is judged early)
}

// hkey is a heap entry: the order of its event, and where it is.
type hkey struct {
	t   int64
	seq uint64
	at  uint32 // index in slab
}

func (b *buffer) len() int { return len(b.h) }

// min returns the earliest event; the buffer must not be empty.
func (b *buffer) min() *pending { return &b.slab[b.h[0].at] }

func before(a, b *hkey) bool { return a.t < b.t || a.t == b.t && a.seq < b.seq }

func (b *buffer) push(p pending) {
	var at uint32
	if n := len(b.free); n > 0 {
		at = b.free[n-1]
		b.free = b.free[:n-1]
		b.slab[at] = p
	} else {
		at = uint32(len(b.slab))
		b.slab = appendCapped(b.slab, p, b.most)
	}
	b.h = appendCapped(b.h, hkey{t: p.t, seq: p.seq, at: at}, b.most)
	h := b.h
	i := len(h) - 1
	k := h[i]
	for i > 0 {
		parent := (i - 1) / 4
		if !before(&k, &h[parent]) {
			break
		}
		h[i] = h[parent]
		i = parent
	}
	h[i] = k
}

// pop removes and returns the earliest event; the buffer must not be empty.
func (b *buffer) pop() pending {
	h := b.h
	top := b.slab[h[0].at]
	b.free = appendCapped(b.free, h[0].at, b.most)
	n := len(h) - 1
	k := h[n]
	h = h[:n]
	b.h = h
	if n == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < n; j++ {
			if before(&h[j], &h[m]) {
				m = j
			}
		}
		if !before(&h[m], &k) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = k
	return top
}
