package pipeline

import (
	"github.com/poplimit/poplimit/event"
	"github.com/segmentio/kafka-go"
)

// frame is one sealed frame: a Kafka message's value, and what the producer
// needs to place it and to count its outcome.
type frame struct {
	value     []byte // the encoded frame, never modified once sealed
	events    int    // events in it
	partition int    // where its events' keys hash
	time      int64  // when the producer opened it, Unix ns (0: kafka-go stamps the write time)

	// Set by send, for one write: a frame sent again (from the retry
	// buffer) is a new frame value of a new write.
	call      *writeCall
	settled   bool // its outcome is counted; guarded by call.mu
	abandoned bool // counted by abandon; guarded by call.mu
}

// openFrame is a frame being filled, of one partition and one edge: its
// events, encoded after room for the header.
type openFrame struct {
	buf  []byte
	n    int    // events in buf
	edge uint16 // the edge of its events
	time int64  // when the producer opened it: framer.now at its first event
}

// maxOpenPerPartition bounds the open frames of one partition, one per edge
// (a producer normally serves one edge): past it, a new edge's events take
// the place of the first frame, which is sealed.
const maxOpenPerPartition = 8

// framer is the writer goroutine's framing state: the open frames of each
// partition, one per edge, and the sealed frames waiting to be written.
// Only that goroutine uses it.
type framer struct {
	maxEvents, maxBytes int
	base                uint64 // the first sequence number of every partition

	// key signs every sealed frame (nil: frames are not signed); its MAC
	// takes the last FrameMACLen of maxBytes, so events fill up to room.
	key    *FrameKey
	format byte // the frames' first byte: frameByte, or signedFrameByte with key
	room   int  // the most bytes of a frame before its MAC

	// now is the producer's clock, Unix ns, set by each round of framing:
	// a frame's time (its message timestamp, and its age for RetryFor) is
	// when it was opened, never an event's Time, so that one event stamped
	// far from now (a skewed or forged clock, which the judge counts
	// invalid) cannot have its frame, and the valid events in it, deleted
	// by the broker's retention, refused by a broker bounding timestamps
	// (log.message.timestamp.before.max.ms, after.max.ms), or dropped from
	// the retry buffer as too old. 0: kafka-go stamps the write time.
	now int64

	parts int           // the partition count events are placed by (0: unknown yet)
	open  [][]openFrame // by partition, one per edge; may be longer than parts
	// seq is the next sequence number, by partition, for the frames of
	// every edge: the one edge a producer normally serves numbers its
	// (edge, partition) stream without a gap, and several edges' streams
	// never share a number.
	seq []uint64

	sealed     []frame // sealed, not yet handed to a write
	openEvents int     // events in the open frames

	// free holds buffers of FrameBytes capacity that carried frames whose
	// outcome is known, for frames to come: a frame is sealed in its own
	// buffer and the partition takes a free one, which saves a copy, an
	// allocation and its garbage per frame. Any goroutine may recycle
	// into it.
	free chan []byte

	m *producerMetrics
}

// freeBuffers is how many frame buffers wait to be used again, at most.
const freeBuffers = 128

// newFramer returns the framing state of cfg, valid; key is cfg.Key's
// (nil without one).
func newFramer(cfg ProducerConfig, base uint64, key *FrameKey, m *producerMetrics) framer {
	f := framer{maxEvents: cfg.FrameEvents, maxBytes: cfg.FrameBytes, base: base, m: m,
		free: make(chan []byte, freeBuffers), key: key, format: frameByte, room: cfg.FrameBytes}
	if key != nil {
		f.format, f.room = signedFrameByte, cfg.FrameBytes-FrameMACLen
	}
	return f
}

// buffer returns an empty frame buffer of FrameBytes capacity, recycled if
// one is free.
func (f *framer) buffer() []byte {
	select {
	case b := <-f.free:
		return b[:FrameHeaderLen]
	default:
		return make([]byte, FrameHeaderLen, f.maxBytes)
	}
}

// recycle offers the value of a frame that nothing refers to any more (its
// write completed and it is not kept to be sent again) for frames to come.
func (f *framer) recycle(value []byte) {
	if cap(value) < f.maxBytes {
		return
	}
	select {
	case f.free <- value:
	default:
	}
}

// setPartitions places events by n partitions from now on. When the count
// shrinks (a topic deleted and created again), the frames of the partitions
// that are gone are sealed; the writer's balancer folds them onto the
// partitions that exist.
func (f *framer) setPartitions(n int) {
	for len(f.open) < n {
		f.open = append(f.open, nil)
		f.seq = append(f.seq, f.base)
	}
	for p := n; p < f.parts; p++ {
		f.sealPartition(p)
	}
	f.parts = n
}

// add appends e, valid and n bytes long, to the open frame of its partition
// and edge, sealing that frame first if e does not fit, and after if it is
// full.
func (f *framer) add(e *event.Event, n int) {
	p := partitionOf(e.KeyHash, f.parts)
	o := f.frameOf(p, e.Edge)
	if o.n > 0 && len(o.buf)+uvarintLen(uint64(n))+n > f.room {
		f.seal(p, o)
	}
	if o.n == 0 {
		o.edge, o.time = e.Edge, f.now
	}
	o.buf = appendFramedEvent(o.buf, e, n)
	o.n++
	f.openEvents++
	if o.n >= f.maxEvents {
		f.seal(p, o)
	}
}

// frameOf returns partition p's open frame for edge: its own, or an empty
// one, or a new one, or, at maxOpenPerPartition, the first, sealed.
func (f *framer) frameOf(p int, edge uint16) *openFrame {
	os := f.open[p]
	if len(os) > 0 && os[0].edge == edge { // the usual case: one edge
		return &os[0]
	}
	empty := -1
	for i := range os {
		if os[i].edge == edge {
			return &os[i]
		}
		if empty < 0 && os[i].n == 0 {
			empty = i
		}
	}
	switch {
	case empty >= 0:
	case len(os) < maxOpenPerPartition:
		f.open[p] = append(os, openFrame{buf: f.buffer()})
		empty = len(os)
	default:
		f.seal(p, &os[0])
		empty = 0
	}
	o := &f.open[p][empty]
	o.edge = edge
	return o
}

// seal closes o, an open frame of partition p that holds events: it numbers
// it, writes its header, signs it for p when the producer has a key, and
// moves it to sealed in its buffer, which o replaces. (The retry buffer
// copies what it keeps of a buffer little of which is used.)
func (f *framer) seal(p int, o *openFrame) {
	appendFrameHeader(o.buf[:0], f.format, o.edge, f.seq[p], o.n)
	value := o.buf
	if f.key != nil {
		value = f.key.Sign(value, p) // within the buffer's capacity: room left FrameMACLen
	}
	o.buf = f.buffer()
	f.sealed = append(f.sealed, frame{value: value, events: o.n, partition: p, time: o.time})
	f.seq[p]++
	f.openEvents -= o.n
	f.m.frameEvents.Observe(float64(o.n))
	o.n = 0
}

// sealPartition seals partition p's open frames.
func (f *framer) sealPartition(p int) {
	for i := range f.open[p] {
		if o := &f.open[p][i]; o.n > 0 {
			f.seal(p, o)
		}
	}
}

// sealAll seals every open frame.
func (f *framer) sealAll() {
	for p := range f.open {
		f.sealPartition(p)
	}
}

// discard drops every open and sealed frame and returns their events.
func (f *framer) discard() int {
	n := f.openEvents
	for _, s := range f.sealed {
		n += s.events
	}
	for p := range f.open {
		for i := range f.open[p] {
			f.open[p][i].n, f.open[p][i].buf = 0, f.open[p][i].buf[:FrameHeaderLen]
		}
	}
	clear(f.sealed)
	f.sealed, f.openEvents = f.sealed[:0], 0
	return n
}

// partitionOf returns the partition of n that kafka-go's Hash balancer
// picks for the 8-byte big-endian key keyHash, as Sarama's hash partitioner
// and the Java client's legacy one do: the 32-bit FNV-1a hash of the key,
// as a signed integer, modulo n, made positive. Frames are placed by it so
// that a key's events stay where one message per event put them.
func partitionOf(keyHash uint64, n int) int {
	h := uint32(2166136261)
	for s := 56; s >= 0; s -= 8 {
		h ^= uint32(byte(keyHash >> s))
		h *= 16777619
	}
	p := int32(h) % int32(n)
	if p < 0 {
		p = -p
	}
	return int(p)
}

// framePartition is the writer's balancer: it sends a frame to the partition
// its events' keys hash to, folded onto the partitions that exist if there
// are fewer now.
type framePartition struct{}

func (framePartition) Balance(msg kafka.Message, partitions ...int) int {
	f, ok := msg.WriterData.(*frame)
	if !ok || len(partitions) == 0 {
		return 0
	}
	return partitions[f.partition%len(partitions)]
}
