package judge

import (
	"github.com/cespare/xxhash/v2"

	"github.com/poplimit/poplimit/pipeline"
)

// dedup remembers the fingerprints of the latest events (Config.Dedup) and
// recognises an exact copy of one of them. The zero value, and one of size
// 0, remembers nothing.
type dedup struct {
	ring  []uint64 // fingerprints, oldest at pos once full
	pos   int
	full  bool
	set   map[uint64]struct{}
	buf   [pipeline.MaxEventLen]byte
	count int64 // copies recognised
}

func newDedup(n int) dedup {
	if n == 0 {
		return dedup{}
	}
	return dedup{ring: make([]uint64, n), set: make(map[uint64]struct{}, n)}
}

// seen reports whether e is a copy of a remembered event, and remembers it
// if not. A fingerprint is the 64-bit hash of the event's canonical
// encoding, every field included.
func (d *dedup) seen(e *pipeline.Event) bool {
	if len(d.ring) == 0 {
		return false
	}
	b, err := pipeline.AppendEvent(d.buf[:0], e)
	if err != nil {
		return false // the judge counts it as it would any other
	}
	fp := xxhash.Sum64(b)
	if _, ok := d.set[fp]; ok {
		d.count++
		return true
	}
	if d.full {
		delete(d.set, d.ring[d.pos])
	}
	d.ring[d.pos] = fp
	d.set[fp] = struct{}{}
	if d.pos++; d.pos == len(d.ring) {
		d.pos, d.full = 0, true
	}
	return false
}
