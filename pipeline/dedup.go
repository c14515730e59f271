package pipeline

// frameID identifies a frame: its sequence number and its stream, the edge
// and the partition it was read from, with the top bit set so that no id is
// the zero value, which marks an empty slot.
type frameID struct {
	seq, stream uint64
}

func newFrameID(edge uint16, partition int, seq uint64) frameID {
	return frameID{seq: seq, stream: 1<<63 | uint64(edge)<<32 | uint64(uint32(partition))}
}

func (id frameID) hash() uint64 { return mix64(id.seq ^ mix64(id.stream)) }

// frameSet remembers the ids of the latest frames read, exactly (no
// fingerprint: two frames are the same only if edge, partition and sequence
// number are), and recognises one read again. It keeps two generations of
// an open-addressing set, each taking up to half of its size at a load of
// at most one half: when the current one is full, the older one is cleared
// and becomes current. So it remembers between n/2 and n of the latest
// frames, with no per-frame deletion, in 32 bytes per frame of n. It
// allocates only when built. The zero value, and one of size 0, remembers
// nothing. It is not safe for concurrent use.
type frameSet struct {
	gens  [2][]frameID
	cur   int // the generation that takes new ids
	n     int // ids in the current generation
	limit int // ids a generation takes
	mask  uint64
}

func newFrameSet(n int) frameSet {
	if n == 0 {
		return frameSet{}
	}
	limit := max(n/2, 1)
	slots := 1
	for slots < 2*limit {
		slots <<= 1
	}
	return frameSet{gens: [2][]frameID{make([]frameID, slots), make([]frameID, slots)}, limit: limit, mask: uint64(slots - 1)}
}

// seen reports whether the frame (edge, partition, seq) was remembered, and
// remembers it if not.
func (s *frameSet) seen(edge uint16, partition int, seq uint64) bool {
	if s.limit == 0 {
		return false
	}
	id := newFrameID(edge, partition, seq)
	h := id.hash()
	if s.has(s.gens[1-s.cur], id, h) {
		return true
	}
	g := s.gens[s.cur]
	i := h & s.mask
	for ; g[i] != (frameID{}); i = (i + 1) & s.mask {
		if g[i] == id {
			return true
		}
	}
	g[i] = id
	if s.n++; s.n == s.limit {
		s.cur = 1 - s.cur
		clear(s.gens[s.cur])
		s.n = 0
	}
	return false
}

func (s *frameSet) has(g []frameID, id frameID, h uint64) bool {
	for i := h & s.mask; g[i] != (frameID{}); i = (i + 1) & s.mask {
		if g[i] == id {
			return true
		}
	}
	return false
}
