package window

// keyIndex maps a key hash to its entry's slab index: an open-addressed
// table with linear probing, in place of a Go map. A lookup on the request
// path reads one 16-byte slot where it lands (rarely two), where a map went
// through its header, its table and a group's control word before the slot;
// with the table cold between requests, each of those is a cache miss.
//
// Positions come from the high bits of the key times 2^64/φ (Fibonacci
// hashing), not the low bits, which pick the key's shard. The table holds at
// most 3/4 of its slots, doubles when it would hold more, and never shrinks
// (as a Go map). Deleting shifts the following slots of the run back, so no
// tombstones build up.
type keyIndex struct {
	slots []indexSlot
	n     int  // keys held
	shift uint // 64 - log2(len(slots))
}

type indexSlot struct {
	key uint64
	ref uint32 // slab index + 1; 0: empty
}

const indexMinSlots = 16

func (x *keyIndex) pos(key uint64) uint64 { return (key * 0x9e3779b97f4a7c15) >> x.shift }

// get returns key's slab index.
func (x *keyIndex) get(key uint64) (uint32, bool) {
	if x.n == 0 {
		return 0, false
	}
	mask := uint64(len(x.slots) - 1)
	for p := x.pos(key); ; p = (p + 1) & mask {
		s := &x.slots[p]
		if s.ref == 0 {
			return 0, false
		}
		if s.key == key {
			return s.ref - 1, true
		}
	}
}

// put maps key to slab index i, replacing any earlier index.
func (x *keyIndex) put(key uint64, i uint32) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	mask := uint64(len(x.slots) - 1)
	for p := x.pos(key); ; p = (p + 1) & mask {
		s := &x.slots[p]
		if s.ref == 0 {
			*s = indexSlot{key: key, ref: i + 1}
			x.n++
			return
		}
		if s.key == key {
			s.ref = i + 1
			return
		}
	}
}

// del removes key, if held.
func (x *keyIndex) del(key uint64) {
	if x.n == 0 {
		return
	}
	mask := uint64(len(x.slots) - 1)
	p := x.pos(key)
	for ; ; p = (p + 1) & mask {
		s := &x.slots[p]
		if s.ref == 0 {
			return
		}
		if s.key == key {
			break
		}
	}
	// Backward shift: move each later slot of the run whose home is not in
	// (p, q] into the hole, until the run ends.
	for q := (p + 1) & mask; ; q = (q + 1) & mask {
		s := &x.slots[q]
		if s.ref == 0 {
			break
		}
		h := x.pos(s.key)
		if (q-h)&mask >= (q-p)&mask { // its home is at or before the hole
			x.slots[p] = *s
			p = q
		}
	}
	x.slots[p] = indexSlot{}
	x.n--
}

func (x *keyIndex) grow() {
	old := x.slots
	size := max(indexMinSlots, 2*len(old))
	x.slots = make([]indexSlot, size)
	x.shift = 64
	for s := size; s > 1; s >>= 1 {
		x.shift--
	}
	x.n = 0
	for _, s := range old {
		if s.ref != 0 {
			x.put(s.key, s.ref-1)
		}
	}
}
