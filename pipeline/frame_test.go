package pipeline_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/pipeline"
)

// frameEvents returns the sample events, sorted by name, as events of edge.
func frameEvents(edge uint16) []event.Event {
	m := eventtest.Samples()
	var names []string
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	evs := make([]event.Event, 0, len(names))
	for _, name := range names {
		e := m[name]
		e.Edge = edge
		evs = append(evs, e)
	}
	return evs
}

// mustFrame returns the frame the producer seals of evs, events of edge,
// numbered seq.
func mustFrame(t testing.TB, edge uint16, seq uint64, evs []event.Event) []byte {
	t.Helper()
	for i := range evs {
		if evs[i].Edge != edge {
			t.Fatalf("mustFrame: event %d of edge %d, want edge %d", i, evs[i].Edge, edge)
		}
	}
	return pipeline.SealFrame(t, seq, evs)
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		edge uint16
		seq  uint64
		evs  []event.Event
	}{
		{"one zero event", 0, 0, []event.Event{{}}},
		{"every sample", 7, 0xfedcba9876543210, frameEvents(7)},
		{"max edge and seq", 65535, 1<<64 - 1, frameEvents(65535)[:3]},
		{"many", 3, 42, slices.Repeat(frameEvents(3)[:1], 1000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustFrame(t, tt.edge, tt.seq, tt.evs)
			if !pipeline.IsFrame(b) {
				t.Errorf("IsFrame: got false, want true")
			}
			var h pipeline.FrameHeader
			got, err := pipeline.DecodeFrame(b, &h, []event.Event{{Edge: 9}})
			if err != nil {
				t.Fatalf("DecodeFrame: got %v, want nil", err)
			}
			if want := (pipeline.FrameHeader{Edge: tt.edge, Seq: tt.seq, Count: len(tt.evs)}); h != want {
				t.Errorf("header: got %+v, want %+v", h, want)
			}
			if len(got) != 1+len(tt.evs) || got[0].Edge != 9 {
				t.Fatalf("DecodeFrame: got %d events, want the 1 already in dst then %d", len(got), len(tt.evs))
			}
			for i := range tt.evs {
				if !eventtest.Equal(&got[1+i], &tt.evs[i]) {
					t.Errorf("event %d: got %+v, want %+v", i, got[1+i], tt.evs[i])
				}
			}
			if again := mustFrame(t, h.Edge, h.Seq, got[1:]); !bytes.Equal(again, b) {
				t.Errorf("re-encoding: got %x, want %x", again, b)
			}
		})
	}
}

// TestDecodeFrameV3 reads a frame of version 3 events, as edges that
// predate counting by response write them: the events decode not counting.
func TestDecodeFrameV3(t *testing.T) {
	evs := frameEvents(4)
	head := mustFrame(t, 4, 11, evs[:1])[:pipeline.FrameHeaderLen]
	b := append(bytes.Clone(head[:pipeline.FrameHeaderLen-2]), 0, byte(len(evs)))
	for i := range evs {
		evs[i] = eventtest.AsV3(evs[i])
		ev := eventtest.AppendV3(nil, &evs[i])
		b = append(append(b, binaryUvarint(len(ev))...), ev...)
	}
	var h pipeline.FrameHeader
	got, err := pipeline.DecodeFrame(b, &h, nil)
	if err != nil {
		t.Fatalf("DecodeFrame of version 3 events: got %v, want nil", err)
	}
	if len(got) != len(evs) {
		t.Fatalf("DecodeFrame: got %d events, want %d", len(got), len(evs))
	}
	for i := range evs {
		if !eventtest.Equal(&got[i], &evs[i]) {
			t.Errorf("event %d: got %+v, want %+v", i, got[i], evs[i])
		}
	}
}

// TestFrameLayout pins the documented frame layout with a golden encoding.
func TestFrameLayout(t *testing.T) {
	e := event.Event{Time: 1, Edge: 2, Rule: []byte("a"), KeyHash: 3, Limit: 4, Burst: 4}
	ev := eventtest.Encode(t, e)
	b := mustFrame(t, 2, 0x0102030405060708, []event.Event{e, e})
	want := "81" + "0002" + "0102030405060708" + "0002" +
		hex.EncodeToString(append([]byte{byte(len(ev))}, ev...)) + hex.EncodeToString(append([]byte{byte(len(ev))}, ev...))
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("encoding: got %s, want %s", got, want)
	}
	if got, want := len(b), pipeline.FrameHeaderLen+2*(1+len(ev)); got != want {
		t.Errorf("length: got %d, want %d", got, want)
	}
}

func TestDecodeFrameErrors(t *testing.T) {
	evs := frameEvents(5)[:3]
	valid := mustFrame(t, 5, 9, evs)
	first := eventtest.Encode(t, evs[0])
	head := valid[:pipeline.FrameHeaderLen]
	// frameOf builds a frame of count events from raw event bytes.
	frameOf := func(count byte, body ...byte) []byte {
		return append(append(bytes.Clone(head[:pipeline.FrameHeaderLen-1]), count), body...)
	}
	framed := func(ev []byte) []byte { return append([]byte{byte(len(ev))}, ev...) }
	v1 := eventtest.AppendV1(nil, &evs[0])
	v3 := eventtest.AsV3(evs[0])
	otherEdge := evs[0]
	otherEdge.Edge = 6
	long := append(bytes.Clone(first), bytes.Repeat([]byte{0}, event.MaxLen)...)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, event.ErrTruncated},
		{"an event", first, event.ErrVersion},
		{"frame version 3", append([]byte{0x83}, valid[1:]...), event.ErrVersion},
		{"signed frame shorter than its MAC", append([]byte{0x82}, valid[1:pipeline.FrameHeaderLen+pipeline.FrameMACLen-1]...), event.ErrTruncated},
		{"format byte only", valid[:1], event.ErrTruncated},
		{"cut in header", valid[:pipeline.FrameHeaderLen-1], event.ErrTruncated},
		{"header only", head, event.ErrTruncated},
		{"count 0", frameOf(0), event.ErrMalformed},
		{"count above the events", frameOf(2, framed(first)...), event.ErrTruncated},
		{"count below the events", frameOf(1, append(framed(first), framed(first)...)...), event.ErrTrailing},
		{"cut in an event", valid[:len(valid)-1], event.ErrTruncated},
		{"trailing byte", append(bytes.Clone(valid), 0), event.ErrTrailing},
		{"length 0", frameOf(1, 0), event.ErrMalformed},
		{"length not minimal", frameOf(1, append([]byte{0x80 | byte(len(first)), 0}, first...)...), event.ErrMalformed},
		{"length over event.MaxLen", frameOf(1, append(binaryUvarint(len(long)), long...)...), event.ErrMalformed},
		{"length past the end", frameOf(1, 100, 2), event.ErrTruncated},
		{"a version 1 event", frameOf(1, framed(v1)...), event.ErrMalformed},
		{"events of versions 4 and 3", frameOf(2, append(framed(first), framed(eventtest.AppendV3(nil, &v3))...)...), event.ErrMalformed},
		{"an event of another edge", frameOf(1, framed(eventtest.Encode(t, otherEdge))...), event.ErrMalformed},
		{"an event with trailing bytes", frameOf(1, framed(append(bytes.Clone(first), 0))...), event.ErrTrailing},
		{"a malformed event", frameOf(1, framed(append([]byte{2, 0x80}, first[2:]...))...), event.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := pipeline.FrameHeader{Edge: 7}
			dst := []event.Event{{Edge: 8}}
			got, err := pipeline.DecodeFrame(tt.in, &h, dst)
			if !errors.Is(err, tt.want) {
				t.Errorf("DecodeFrame(%x): got %v, want %v", tt.in, err, tt.want)
			}
			if h.Edge != 7 {
				t.Errorf("header after error: got %+v, want it unchanged", h)
			}
			if len(got) != 1 || got[0].Edge != 8 {
				t.Errorf("dst after error: got %d events, want the 1 it held", len(got))
			}
		})
	}
}

func binaryUvarint(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

func TestIsFrame(t *testing.T) {
	tests := []struct {
		in   []byte
		want bool
	}{
		{nil, false},
		{[]byte{1}, false},
		{[]byte{2}, false},
		{[]byte{0x7f}, false},
		{[]byte{0x81}, true},
		{[]byte{0xff}, true},
	}
	for _, tt := range tests {
		if got := pipeline.IsFrame(tt.in); got != tt.want {
			t.Errorf("IsFrame(%x): got %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestFrameAllocs(t *testing.T) {
	evs := frameEvents(1)
	buf := mustFrame(t, 1, 2, evs)
	var h pipeline.FrameHeader
	dst := make([]event.Event, 0, len(evs))
	if got := testing.AllocsPerRun(100, func() {
		var err error
		if dst, err = pipeline.DecodeFrame(buf, &h, dst[:0]); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("DecodeFrame allocs: got %v, want 0", got)
	}
	bad := buf[:len(buf)-1]
	if got := testing.AllocsPerRun(100, func() { dst, _ = pipeline.DecodeFrame(bad, &h, dst[:0]) }); got != 0 {
		t.Errorf("DecodeFrame allocs on error: got %v, want 0", got)
	}
}

// FuzzDecodeFrame checks that DecodeFrame never panics, fails only with a
// sentinel and leaves dst as it was, and is canonical: what it accepts
// re-encodes to itself.
func FuzzDecodeFrame(f *testing.F) {
	evs := frameEvents(4)
	for _, b := range [][]byte{
		mustFrame(f, 4, 1, evs[:1]),
		mustFrame(f, 4, 1<<40, evs[:5]),
		mustFrame(f, 4, 0, evs),
	} {
		f.Add(b)
		for _, n := range []int{0, 1, 12, 13, 14, len(b) - 1} {
			if n < len(b) {
				f.Add(b[:n])
			}
		}
		f.Add(append(bytes.Clone(b), 0))
	}
	f.Add([]byte{0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{0x82})
	f.Add(pipeline.SealSignedFrame(f, bytes.Repeat([]byte{7}, pipeline.MinKeyLen), 3, evs[:3]))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h pipeline.FrameHeader
		dst := []event.Event{{Edge: 1}}
		got, err := pipeline.DecodeFrame(b, &h, dst)
		if err != nil {
			known := false
			for _, s := range []error{event.ErrVersion, event.ErrTruncated, event.ErrTrailing, event.ErrMalformed} {
				known = known || errors.Is(err, s)
			}
			if !known {
				t.Fatalf("DecodeFrame(%x): got error %v, want a package sentinel", b, err)
			}
			if len(got) != 1 || h != (pipeline.FrameHeader{}) {
				t.Fatalf("after error: got %d events and header %+v, want dst and the header unchanged", len(got), h)
			}
			return
		}
		if !pipeline.IsFrame(b) || h.Count != len(got)-1 || h.Count < 1 {
			t.Fatalf("DecodeFrame(%x): got header %+v and %d events", b, h, len(got)-1)
		}
		enc := mustFrame(t, h.Edge, h.Seq, got[1:])
		if b[0] == 0x80|pipeline.FrameVersionSigned { // the same frame, with a MAC DecodeFrame does not check
			enc = append(append([]byte{b[0]}, enc[1:]...), b[len(b)-pipeline.FrameMACLen:]...)
		}
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding: got %x, want the input %x (the encoding is canonical)", enc, b)
		}
	})
}

func BenchmarkDecodeFrame(b *testing.B) {
	e := eventtest.Samples()["typical"]
	evs := slices.Repeat([]event.Event{e}, 256)
	for i := range evs {
		evs[i].KeyHash = uint64(i)
	}
	buf := mustFrame(b, e.Edge, 1, evs)
	dst := make([]event.Event, 0, len(evs))
	var h pipeline.FrameHeader
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		var err error
		if dst, err = pipeline.DecodeFrame(buf, &h, dst[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}
