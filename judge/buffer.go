package judge

import "github.com/poplimit/poplimit/pipeline"

// Flag bits of pending.flags.
const (
	fLimited = 1 << iota
	fSync
	fBlock
	fCache
	fShadow
	fFallback
)

// pending is an event waiting for the watermark: what judging needs, with
// the rule interned (an Event's Rule aliases the consumer's buffer). 64
// bytes.
type pending struct {
	t        int64  // event time floored to the resolution, Unix ns
	seq      uint64 // arrival order, breaks ties of t
	arrived  int64  // arrival time, Unix ns, as given to Add
	hash     uint64 // key hash
	rule     uint32 // index into Judge.ruleNames
	cost     uint32
	limit    uint32
	windowMs uint32
	burst    uint32 // 0: Limit
	estimate float32
	edge     uint16
	flags    uint8
	alg      uint8 // pipeline.Algorithm
}

func flagsOf(e *pipeline.Event) uint8 {
	var f uint8
	if e.Decision == pipeline.Limited {
		f |= fLimited
	}
	if e.Mode == pipeline.ModeSync {
		f |= fSync
	}
	if e.Action == pipeline.ActionBlock {
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
	return f
}

// buffer is a binary min-heap of pending events by (t, seq). It is written
// out rather than built on container/heap, whose interface boxes every
// pushed value (an allocation per event).
type buffer struct{ h []pending }

func (b *buffer) len() int { return len(b.h) }

// min returns the earliest event; the buffer must not be empty.
func (b *buffer) min() *pending { return &b.h[0] }

func before(a, b *pending) bool { return a.t < b.t || a.t == b.t && a.seq < b.seq }

func (b *buffer) push(p pending) {
	b.h = append(b.h, p)
	h := b.h
	i := len(h) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !before(&h[i], &h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

// pop removes and returns the earliest event; the buffer must not be empty.
func (b *buffer) pop() pending {
	h := b.h
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && before(&h[r], &h[l]) {
			m = r
		}
		if !before(&h[m], &h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	b.h = h
	return top
}
