package pipeline

import (
	"sync/atomic"

	"github.com/poplimit/poplimit/event"
)

// eventRing is the queue between Emit and the writer goroutine: a bounded
// multi-producer, single-consumer ring of events after Dmitry Vyukov's
// bounded MPMC queue (1024cores.net). Each cell carries a sequence number
// that says whose turn it is: a producer claims a position by a
// compare-and-swap of tail, copies its event in and publishes the cell; the
// consumer takes cells in order once published and frees them for the next
// lap. A push costs one compare-and-swap and no lock, and neither side ever
// waits for the other. The capacity is a power of two, at least 2. push is safe for
// concurrent use; pop is for one goroutine at a time; len for any.
type eventRing struct {
	mask  uint64
	cells []ringCell
	_     [64]byte // tail, written by every producer, on a cache line of its own
	tail  atomic.Uint64
	_     [56]byte
	head  atomic.Uint64 // written by the consumer only
	_     [56]byte
}

type ringCell struct {
	// seq is pos when the cell at pos is free to fill, pos+1 once filled,
	// and pos+capacity once taken (free for the next lap).
	seq atomic.Uint64
	e   event.Event
}

// newEventRing returns a ring of at least n cells, rounded up to a power of
// two, and at least 2: with one cell, a filled cell (pos+1) would look free
// for the next lap (pos+capacity).
func newEventRing(n int) *eventRing {
	size := 2
	for size < n {
		size <<= 1
	}
	r := &eventRing{mask: uint64(size - 1), cells: make([]ringCell, size)}
	for i := range r.cells {
		r.cells[i].seq.Store(uint64(i))
	}
	return r
}

// push copies e into the ring and returns its position, or reports false
// if the ring is full.
func (r *eventRing) push(e *event.Event) (uint64, bool) {
	pos := r.tail.Load()
	for {
		c := &r.cells[pos&r.mask]
		switch d := int64(c.seq.Load() - pos); {
		case d == 0:
			if r.tail.CompareAndSwap(pos, pos+1) {
				c.e = *e
				c.seq.Store(pos + 1)
				return pos, true
			}
		case d < 0:
			return 0, false // the cell still holds the event of the lap before
		}
		pos = r.tail.Load() // another producer took pos
	}
}

// pop moves the oldest event into e, or reports false if there is none
// published yet.
func (r *eventRing) pop(e *event.Event) bool {
	pos := r.head.Load()
	c := &r.cells[pos&r.mask]
	if c.seq.Load() != pos+1 {
		return false
	}
	*e = c.e
	c.seq.Store(pos + r.mask + 1)
	r.head.Store(pos + 1)
	return true
}

// len returns the events in the ring, those being copied in included.
func (r *eventRing) len() int {
	head := r.head.Load()
	return int(r.tail.Load() - head)
}
