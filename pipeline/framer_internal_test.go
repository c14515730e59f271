package pipeline

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/segmentio/kafka-go"
)

// TestPartitionOf checks that frames are placed exactly as kafka-go's Hash
// balancer placed one message per event, keyed by the 8-byte key hash.
func TestPartitionOf(t *testing.T) {
	var h kafka.Hash
	for _, n := range []int{1, 2, 3, 4, 7, 16, 100, 1000} {
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		for k := range uint64(20_000) {
			key := k * 0x9e3779b97f4a7c15
			want := h.Balance(kafka.Message{Key: binary.BigEndian.AppendUint64(nil, key)}, parts...)
			if got := partitionOf(key, n); got != want {
				t.Fatalf("partitionOf(%#x, %d): got %d, want kafka.Hash's %d", key, n, got, want)
			}
		}
	}
}

func TestFramePartitionBalancer(t *testing.T) {
	tests := []struct {
		partition, partitions, want int
	}{
		{0, 4, 0}, {3, 4, 3}, {5, 4, 1}, {2, 1, 0},
	}
	for _, tt := range tests {
		parts := make([]int, tt.partitions)
		for i := range parts {
			parts[i] = i
		}
		m := kafka.Message{WriterData: &frame{partition: tt.partition}}
		if got := (framePartition{}).Balance(m, parts...); got != tt.want {
			t.Errorf("frame of partition %d among %d: got %d, want %d", tt.partition, tt.partitions, got, tt.want)
		}
	}
}

func testFramer(t testing.TB, maxEvents, maxBytes, parts int, base uint64) *framer {
	t.Helper()
	cfg := DefaultProducerConfig()
	cfg.FrameEvents, cfg.FrameBytes = maxEvents, maxBytes
	m := newProducerMetrics(&Producer{})
	f := newFramer(cfg, base, nil, &m)
	f.setPartitions(parts)
	return &f
}

// keyOn returns the n-th key hash (from 1) that lands on partition p of parts.
func keyOn(p, parts, n int) uint64 {
	for k := uint64(1); ; k++ {
		if partitionOf(k, parts) == p {
			if n--; n == 0 {
				return k
			}
		}
	}
}

func decodeFrameT(t *testing.T, f frame) (FrameHeader, []event.Event) {
	t.Helper()
	var h FrameHeader
	evs, err := DecodeFrame(f.value, &h, nil)
	if err != nil {
		t.Fatalf("DecodeFrame of a sealed frame: %v", err)
	}
	if h.Count != f.events {
		t.Errorf("frame header count: got %d, want the frame's %d events", h.Count, f.events)
	}
	return h, evs
}

func TestFramerSealsByCountAndNumbers(t *testing.T) {
	var base uint64 = 1<<64 - 2 // the sequence wraps around, as uint64s do
	f := testFramer(t, 3, 16<<10, 2, base)
	frameTime := map[int]int64{0: 1000, 1: 2000} // the producer's clock when each partition's frames opened
	f.now = frameTime[0]
	for i := range 7 { // 7 events of partition 0, 2 of partition 1
		e := event.Event{KeyHash: keyOn(0, 2, i+1), Time: int64(i + 1), Rule: []byte("r")}
		f.add(&e, event.EncodedLen(&e))
	}
	f.now = frameTime[1]
	for i := range 2 {
		e := event.Event{KeyHash: keyOn(1, 2, i+1), Time: int64(100 + i), Rule: []byte("r")}
		f.add(&e, event.EncodedLen(&e))
	}
	if got, want := len(f.sealed), 2; got != want {
		t.Fatalf("sealed frames: got %d, want %d (partition 0's two full ones)", got, want)
	}
	if got, want := f.openEvents, 1+2; got != want {
		t.Errorf("open events: got %d, want %d", got, want)
	}
	f.sealAll()
	if got, want := len(f.sealed), 4; got != want {
		t.Fatalf("sealed frames after sealAll: got %d, want %d", got, want)
	}
	wantSeq := []uint64{base, base + 1, base + 2, base} // partition 0 three times, then partition 1
	wantPart := []int{0, 0, 0, 1}
	wantEvents := []int{3, 3, 1, 2}
	nextTime := map[int]int64{0: 1, 1: 100}
	for i, s := range f.sealed {
		h, evs := decodeFrameT(t, s)
		if h.Seq != wantSeq[i] || s.partition != wantPart[i] || s.events != wantEvents[i] {
			t.Errorf("frame %d: got seq %d, partition %d, %d events; want %d, %d, %d",
				i, h.Seq, s.partition, s.events, wantSeq[i], wantPart[i], wantEvents[i])
		}
		if s.time != frameTime[s.partition] {
			t.Errorf("frame %d: got time %d, want the producer's clock when it opened, %d (not its events' times)", i, s.time, frameTime[s.partition])
		}
		for _, e := range evs {
			if e.Time != nextTime[s.partition] {
				t.Errorf("frame %d: got event time %d, want %d (in order)", i, e.Time, nextTime[s.partition])
			}
			nextTime[s.partition]++
		}
	}
	if f.openEvents != 0 {
		t.Errorf("open events after sealAll: got %d, want 0", f.openEvents)
	}
}

func TestFramerSealsByBytes(t *testing.T) {
	e := event.Event{KeyHash: 1, Rule: make([]byte, 100)}
	n := event.EncodedLen(&e)
	maxBytes := FrameHeaderLen + 3*(uvarintLen(uint64(n))+n) // room for exactly 3
	f := testFramer(t, 1000, maxBytes, 1, 0)
	for range 7 {
		f.add(&e, n)
	}
	if got := len(f.sealed); got != 2 {
		t.Fatalf("sealed frames: got %d, want 2 (of 3 events each)", got)
	}
	for i, s := range f.sealed {
		if s.events != 3 || len(s.value) > maxBytes {
			t.Errorf("frame %d: got %d events in %d bytes, want 3 in at most %d", i, s.events, len(s.value), maxBytes)
		}
	}
	other := e
	other.Edge = 9
	f.add(&other, n) // another edge: a frame of its own, the open one stays
	if got := len(f.sealed); got != 2 || f.openEvents != 2 {
		t.Fatalf("after an event of another edge: got %d sealed and %d open events, want 2 and 2", got, f.openEvents)
	}
	f.sealAll()
	byEdge := map[uint16]int{}
	for _, s := range f.sealed[2:] {
		h, _ := decodeFrameT(t, s)
		byEdge[h.Edge] += h.Count
	}
	if byEdge[0] != 1 || byEdge[9] != 1 || len(byEdge) != 2 {
		t.Errorf("frames sealed last: got events by edge %v, want one of edge 0 and one of edge 9", byEdge)
	}
}

// TestFramerInterleavedEdges: a producer that emits for several edges at
// once still fills its frames, one per edge, each numbered apart; past
// maxOpenPerPartition edges, the first open frame makes room.
func TestFramerInterleavedEdges(t *testing.T) {
	f := testFramer(t, 10, 16<<10, 1, 100)
	for i := range 400 {
		e := event.Event{KeyHash: 1, Edge: uint16(i % 4), Time: int64(i)}
		f.add(&e, event.EncodedLen(&e))
	}
	if got := len(f.sealed); got != 40 {
		t.Fatalf("sealed frames of 4 interleaved edges: got %d, want 40 full ones", got)
	}
	seen := map[uint64]bool{}
	for _, s := range f.sealed {
		h, evs := decodeFrameT(t, s)
		if h.Count != 10 || seen[h.Seq] {
			t.Errorf("frame %+v: want 10 events and a number of its own", h)
		}
		seen[h.Seq] = true
		for i, e := range evs {
			if i > 0 && e.Time != evs[i-1].Time+4 {
				t.Errorf("edge %d: got event time %d after %d, want the edge's events in order", h.Edge, e.Time, evs[i-1].Time)
			}
		}
	}
	f.sealed = f.sealed[:0]
	for edge := range uint16(maxOpenPerPartition + 1) {
		e := event.Event{KeyHash: 1, Edge: 100 + edge}
		f.add(&e, event.EncodedLen(&e))
	}
	if got := len(f.open[0]); got != maxOpenPerPartition {
		t.Errorf("open frames of partition 0: got %d, want at most %d", got, maxOpenPerPartition)
	}
	if got := len(f.sealed); got != 1 || f.openEvents != maxOpenPerPartition {
		t.Errorf("after %d edges: got %d sealed and %d open events, want 1 and %d",
			maxOpenPerPartition+1, got, f.openEvents, maxOpenPerPartition)
	}
}

func TestFramerShrinkingPartitions(t *testing.T) {
	f := testFramer(t, 100, 16<<10, 4, 0)
	for p := range 4 {
		e := event.Event{KeyHash: keyOn(p, 4, 1)}
		f.add(&e, event.EncodedLen(&e))
	}
	f.setPartitions(2) // partitions 2 and 3 are gone: their frames are sealed
	if got := len(f.sealed); got != 2 || f.openEvents != 2 {
		t.Fatalf("after shrinking: got %d sealed and %d open events, want 2 and 2", got, f.openEvents)
	}
	if got := f.discard(); got != 4 || f.openEvents != 0 || len(f.sealed) != 0 {
		t.Errorf("discard: got %d events, %d open, %d sealed; want 4, 0, 0", got, f.openEvents, len(f.sealed))
	}
}

// TestFramerAllocs: framing an event allocates nothing, and neither does
// sealing a frame once the buffers of frames whose outcome is known come
// back; without them, a seal allocates the partition's next buffer.
func TestFramerAllocs(t *testing.T) {
	t.Run("unsigned", func(t *testing.T) { testFramerAllocs(t, testFramer(t, MaxFrameEvents, 64<<10, 4, 0)) })
	t.Run("signed", func(t *testing.T) { // one HMAC per frame, in place
		f := testFramer(t, MaxFrameEvents, 64<<10, 4, 0)
		k, _ := NewFrameKey(make([]byte, MinKeyLen))
		f.key, f.format, f.room = k, signedFrameByte, f.maxBytes-FrameMACLen
		testFramerAllocs(t, f)
	})
}

func testFramerAllocs(t *testing.T, f *framer) {
	e := event.Event{KeyHash: 42, Rule: []byte("api"), Limit: 100, Burst: 100, WindowMillis: 60_000, Cost: 1}
	n := event.EncodedLen(&e)
	if got := testing.AllocsPerRun(1000, func() { f.add(&e, n) }); got != 0 {
		t.Errorf("framer.add allocs: got %v, want 0", got)
	}
	sealRecycle := func() {
		f.add(&e, n)
		f.sealAll()
		for _, s := range f.sealed {
			f.recycle(s.value)
		}
		clear(f.sealed)
		f.sealed = f.sealed[:0]
	}
	sealRecycle()
	if got := testing.AllocsPerRun(100, sealRecycle); got != 0 {
		t.Errorf("seal with buffers recycled allocs: got %v, want 0", got)
	}
	if got := testing.AllocsPerRun(100, func() {
		f.add(&e, n)
		f.sealAll()
		f.sealed = f.sealed[:0]
	}); got != 1 {
		t.Errorf("seal without buffers coming back allocs: got %v, want 1 (the next buffer)", got)
	}
	f.recycle(make([]byte, 10)) // not a frame buffer: not taken
	if b := f.buffer(); cap(b) != f.maxBytes || len(b) != FrameHeaderLen {
		t.Errorf("buffer: got len %d cap %d, want len %d cap %d", len(b), cap(b), FrameHeaderLen, f.maxBytes)
	}
}

func TestFrameSet(t *testing.T) {
	s := newFrameSet(1000)
	if s.seen(1, 0, 5) {
		t.Fatal("first frame: got seen, want new")
	}
	tests := []struct {
		name      string
		edge      uint16
		partition int
		seq       uint64
		want      bool
	}{
		{"the same frame", 1, 0, 5, true},
		{"the same again", 1, 0, 5, true},
		{"another sequence number", 1, 0, 6, false},
		{"another partition", 1, 1, 5, false},
		{"another edge", 2, 0, 5, false},
		{"edge 0, partition 0, seq 0", 0, 0, 0, false},
		{"that again", 0, 0, 0, true},
	}
	for _, tt := range tests {
		if got := s.seen(tt.edge, tt.partition, tt.seq); got != tt.want {
			t.Errorf("%s: seen(%d, %d, %d): got %v, want %v", tt.name, tt.edge, tt.partition, tt.seq, got, tt.want)
		}
	}
	// It remembers at least the latest n/2 frames, whatever came before.
	s = newFrameSet(1000)
	for seq := range uint64(10_000) {
		if s.seen(3, 2, seq) {
			t.Fatalf("frame %d: got seen, want new", seq)
		}
	}
	for seq := uint64(10_000 - 500); seq < 10_000; seq++ {
		if !s.seen(3, 2, seq) {
			t.Fatalf("frame %d of the latest 500: got new, want seen", seq)
		}
	}
	var off frameSet
	if off.seen(1, 1, 1) || off.seen(1, 1, 1) {
		t.Error("zero frameSet: got seen, want it to remember nothing")
	}
	s = newFrameSet(1 << 16)
	seq := uint64(0)
	if got := testing.AllocsPerRun(1000, func() { seq++; s.seen(1, 1, seq) }); got != 0 {
		t.Errorf("frameSet.seen allocs: got %v, want 0", got)
	}
}

func TestRetryBuffer(t *testing.T) {
	m := newProducerMetrics(&Producer{})
	r := retryBuffer{limit: 10, maxAge: time.Minute}
	now := time.Now().UnixNano()
	tests := []struct {
		name   string
		f      frame
		want   bool
		events int // in the buffer after
	}{
		{"recent", frame{events: 4, time: now}, true, 4},
		{"untimed", frame{events: 4}, true, 8},
		{"no room", frame{events: 3, time: now}, false, 8},
		{"old", frame{events: 1, time: now - int64(2*time.Minute)}, false, 8},
		{"fills it", frame{events: 2, time: now, partition: 3}, true, 10},
	}
	for _, tt := range tests {
		if got := r.keep(&tt.f, &m); got != tt.want || r.events != tt.events {
			t.Errorf("%s: keep got %v with %d events kept, want %v with %d", tt.name, got, r.events, tt.want, tt.events)
		}
	}
	if fs := r.take(5, &m); len(fs) != 1 || fs[0].events != 4 {
		t.Errorf("take(5): got %d frames, want the first (4 events: the next would exceed 5)", len(fs))
	}
	if fs := r.take(1, &m); len(fs) != 1 || fs[0].events != 4 {
		t.Errorf("take(1): got %d frames, want one frame however large", len(fs))
	}
	if fs := r.take(100, &m); len(fs) != 1 || fs[0].partition != 3 || r.events != 0 {
		t.Errorf("take(100): got %d frames, %d left, want the last and none left", len(fs), r.events)
	}
	if fs := r.take(100, &m); fs != nil {
		t.Errorf("take of an empty buffer: got %d frames, want none", len(fs))
	}
	buf := make([]byte, 100, 16<<10)
	r.keep(&frame{events: 3, value: buf}, &m)
	if v := r.frames[0].value; cap(v) > 2*len(v) || len(v) != 100 || &v[0] == &buf[0] {
		t.Errorf("kept frame of a buffer little of which is used: got len %d cap %d, want a copy of its 100 bytes", len(v), cap(v))
	}
	if got := r.drain(&m); got != 3 || r.events != 0 {
		t.Errorf("drain: got %d events, %d left, want 3 and 0", got, r.events)
	}
}
