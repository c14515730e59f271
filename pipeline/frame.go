package pipeline

import (
	"encoding/binary"

	"github.com/poplimit/poplimit/event"
)

// FrameVersion is the frame format version that a Producer without an
// events key writes. A frame's first byte is frameTag | its version (0x81
// or 0x82), a value no event version takes (events are numbered from 1 to
// 127), so a reader tells a frame from a single event by its first byte.
const FrameVersion = 1

// FrameVersionSigned is the format of a frame that ends with a MAC (see
// FrameKey): what a Producer with an events key writes. DecodeFrame reads
// both versions.
const FrameVersionSigned = 2

const frameTag = 0x80

// frameByte is the first byte of a version 1 frame; signedFrameByte, of a
// version 2 (signed) frame.
const (
	frameByte       = frameTag | FrameVersion
	signedFrameByte = frameTag | FrameVersionSigned
)

// FrameHeaderLen is the length of a frame's header, in bytes: the format
// byte, the edge (2), the sequence number (8) and the event count (2).
const FrameHeaderLen = 1 + 2 + 8 + 2

// MaxFrameEvents is the most events one frame can hold.
const MaxFrameEvents = 1<<16 - 1

// minFrameBytes is the smallest frame bound that holds any one event: the
// header and the longest event with its length.
const minFrameBytes = FrameHeaderLen + 2 + event.MaxLen

// FrameHeader is the head of a frame: which stream it belongs to and how
// many events follow. The zero value is the header of no frame (Count 0 is
// invalid).
type FrameHeader struct {
	// Edge is the edge every event of the frame comes from.
	Edge uint16
	// Seq numbers the frame within its (edge, partition) stream; with the
	// partition the frame was read from, it identifies the frame.
	Seq uint64
	// Count is the number of events, 1 to MaxFrameEvents.
	Count int
}

func appendFrameHeader(dst []byte, format byte, edge uint16, seq uint64, count int) []byte {
	dst = append(dst, format)
	dst = binary.BigEndian.AppendUint16(dst, edge)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	return binary.BigEndian.AppendUint16(dst, uint16(count))
}

// appendFramedEvent appends e, valid and n bytes long, with its length.
func appendFramedEvent(dst []byte, e *event.Event, n int) []byte {
	dst = binary.AppendUvarint(dst, uint64(n))
	dst, _ = event.Append(dst, e) // cannot fail: e is valid
	return dst
}

// IsFrame reports whether b looks like a frame rather than a single event:
// whether its first byte carries the frame tag. DecodeFrame tells whether
// it is a valid one.
func IsFrame(b []byte) bool { return len(b) > 0 && b[0]&frameTag != 0 }

// DecodeFrame decodes the frame b into h and appends its events to dst, in
// order, returning the extended slice. It allocates nothing when dst has
// room for the events; their Rule fields alias b.
//
// A frame of FrameVersionSigned decodes as one of FrameVersion followed by
// FrameMACLen bytes, which DecodeFrame does not check: FrameKey.Verify
// does.
//
// A frame decodes whole or not at all: on error, h is unchanged and dst is
// returned at its original length. It returns event.ErrVersion if b is not
// a frame of FrameVersion or FrameVersionSigned (a single event, or a
// future format), event.ErrTruncated if b ends inside the frame,
// event.ErrTrailing if bytes follow its last event, and event.ErrMalformed
// if the count is 0, an event's length is not minimally encoded or longer
// than event.MaxLen, or an event is not of event.Version,
// event.VersionV3 or event.VersionV2, not of the version of the frame's first event, or not
// of the frame's edge; an event's own errors are as event.Decode's.
// DecodeFrame never panics, whatever b holds.
func DecodeFrame(b []byte, h *FrameHeader, dst []event.Event) ([]event.Event, error) {
	if len(b) == 0 {
		return dst, event.ErrTruncated
	}
	switch b[0] {
	case frameByte:
	case signedFrameByte:
		if len(b) < FrameHeaderLen+FrameMACLen {
			return dst, event.ErrTruncated
		}
		b = b[:len(b)-FrameMACLen]
	default:
		return dst, event.ErrVersion
	}
	if len(b) < FrameHeaderLen {
		return dst, event.ErrTruncated
	}
	hd := FrameHeader{
		Edge:  binary.BigEndian.Uint16(b[1:]),
		Seq:   binary.BigEndian.Uint64(b[3:]),
		Count: int(binary.BigEndian.Uint16(b[11:])),
	}
	if hd.Count == 0 {
		return dst, event.ErrMalformed
	}
	n0 := len(dst)
	fail := func(err error) ([]event.Event, error) {
		clear(dst[n0:]) // drop the aliases of b
		return dst[:n0], err
	}
	off := FrameHeaderLen
	var ver byte // the frame's event version
	for range hd.Count {
		l, n, err := uvarint(b[off:], event.MaxLen)
		if err != nil {
			return fail(err)
		}
		off += n
		if l == 0 {
			return fail(event.ErrMalformed)
		}
		if uint64(len(b)-off) < l {
			return fail(event.ErrTruncated)
		}
		ev := b[off : off+int(l)]
		off += int(l)
		if ver == 0 {
			ver = ev[0]
		}
		if ev[0] != event.Version && ev[0] != event.VersionV3 && ev[0] != event.VersionV2 || ev[0] != ver {
			return fail(event.ErrMalformed) // a frame holds events of one version, 2 or later
		}
		dst = append(dst, event.Event{})
		e := &dst[len(dst)-1]
		if err := event.Decode(ev, e); err != nil {
			return fail(err)
		}
		if e.Edge != hd.Edge {
			return fail(event.ErrMalformed)
		}
	}
	if off != len(b) {
		return fail(event.ErrTrailing)
	}
	*h = hd
	return dst, nil
}

// uvarint decodes a minimally encoded unsigned varint of at most max from the
// start of b and returns it with its length, as package event reads its own
// varints.
func uvarint(b []byte, max uint64) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, 0, event.ErrTruncated
	case n < 0:
		return 0, 0, event.ErrMalformed // overflows 64 bits
	case n > 1 && b[n-1] == 0:
		return 0, 0, event.ErrMalformed // not minimal: a trailing zero group
	case v > max:
		return 0, 0, event.ErrMalformed
	}
	return v, n, nil
}

// uvarintLen is the number of bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
