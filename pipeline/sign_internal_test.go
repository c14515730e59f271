package pipeline

import (
	"bytes"
	"testing"

	"github.com/poplimit/poplimit/event"
)

// TestFramerSignsWithinFrameBytes: with a key, every sealed frame is
// signed for its partition and, MAC included, within FrameBytes and its
// buffer (no copy to make room for the MAC); without one, events fill
// FrameBytes.
func TestFramerSignsWithinFrameBytes(t *testing.T) {
	const maxBytes = 1024
	for _, signed := range []bool{false, true} {
		cfg := DefaultProducerConfig()
		cfg.FrameEvents, cfg.FrameBytes = MaxFrameEvents, maxBytes
		m := newProducerMetrics(&Producer{})
		var key *FrameKey
		if signed {
			key, _ = NewFrameKey(bytes.Repeat([]byte{3}, MinKeyLen))
		}
		f := newFramer(cfg, 1, key, &m)
		f.setPartitions(2)
		for i := range 200 {
			e := event.Event{KeyHash: keyOn(i%2, 2, i/2+1), Time: int64(i + 1), Rule: []byte("rule")}
			f.add(&e, event.EncodedLen(&e))
		}
		f.sealAll()
		fullest := 0
		for i, s := range f.sealed {
			if len(s.value) > maxBytes || cap(s.value) != maxBytes {
				t.Errorf("signed %v, frame %d: %d bytes in a buffer of %d, want at most %d in one of %d",
					signed, i, len(s.value), cap(s.value), maxBytes, maxBytes)
			}
			fullest = max(fullest, len(s.value))
			if signed != key.verifies(s) {
				t.Errorf("signed %v, frame %d of partition %d: Verify got %v", signed, i, s.partition, !signed)
			}
			decodeFrameT(t, s)
		}
		if fullest < maxBytes-50 {
			t.Errorf("signed %v: fullest frame %d bytes, want frames filled to FrameBytes (within an event)", signed, fullest)
		}
	}
}

// verifies reports whether k, nil or not, verifies f on its partition.
func (k *FrameKey) verifies(f frame) bool {
	if k == nil {
		return false
	}
	return k.Verify(f.value, f.partition)
}
