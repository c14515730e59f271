package judge

import (
	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/event"
)

// dedup remembers the fingerprints of the latest events (Config.Dedup) and
// recognises an exact copy of one of them. It keeps two generations of an
// open-addressing set, each taking up to half of Config.Dedup fingerprints
// at a load of at most one half: when the current one is full, the older
// one is cleared and becomes current. So it remembers between n/2 and n of
// the latest events, with no per-event deletion, in 4n words. The zero
// value, and one of size 0, remembers nothing.
type dedup struct {
	gens  [2][]uint64 // slots; 0 is empty
	cur   int         // the generation that takes new fingerprints
	n     int         // fingerprints in the current generation
	limit int         // fingerprints a generation takes
	mask  uint64
	buf   [event.MaxLen]byte
	count int64 // copies recognised
}

func newDedup(n int) dedup {
	if n == 0 {
		return dedup{}
	}
	limit := max(n/2, 1)
	slots := 1
	for slots < 2*limit {
		slots <<= 1
	}
	return dedup{gens: [2][]uint64{make([]uint64, slots), make([]uint64, slots)}, limit: limit, mask: uint64(slots - 1)}
}

// seen reports whether e is a copy of a remembered event, and remembers it
// if not. A fingerprint is the 64-bit hash of the event's canonical
// encoding, every field included.
func (d *dedup) seen(e *event.Event) bool {
	if d.limit == 0 {
		return false
	}
	b, err := event.Append(d.buf[:0], e)
	if err != nil {
		return false // the judge counts it as it would any other
	}
	fp := max(xxhash.Sum64(b), 1)
	if d.has(d.gens[1-d.cur], fp) {
		d.count++
		return true
	}
	g := d.gens[d.cur]
	i := fp & d.mask
	for ; g[i] != 0; i = (i + 1) & d.mask {
		if g[i] == fp {
			d.count++
			return true
		}
	}
	g[i] = fp
	if d.n++; d.n == d.limit {
		d.cur = 1 - d.cur
		clear(d.gens[d.cur])
		d.n = 0
	}
	return false
}

func (d *dedup) has(g []uint64, fp uint64) bool {
	for i := fp & d.mask; g[i] != 0; i = (i + 1) & d.mask {
		if g[i] == fp {
			return true
		}
	}
	return false
}
