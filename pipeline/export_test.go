package pipeline

import (
	"testing"

	"github.com/poplimit/poplimit/event"
)

// SealFrame returns the frame the producer's framer seals of evs, valid
// events all of one edge, numbered seq: the tests of the frame format
// encode through the encoder that writes to Kafka.
func SealFrame(t testing.TB, seq uint64, evs []event.Event) []byte {
	t.Helper()
	return sealFrame(t, nil, seq, evs)
}

// SealSignedFrame is SealFrame by a producer with the events key key: a
// frame of FrameVersionSigned, signed for partition 0.
func SealSignedFrame(t testing.TB, key []byte, seq uint64, evs []event.Event) []byte {
	t.Helper()
	k, err := NewFrameKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return sealFrame(t, k, seq, evs)
}

func sealFrame(t testing.TB, key *FrameKey, seq uint64, evs []event.Event) []byte {
	t.Helper()
	size := FrameHeaderLen
	if key != nil {
		size += FrameMACLen
	}
	for i := range evs {
		if err := evs[i].Check(); err != nil {
			t.Fatalf("SealFrame: event %d: %v", i, err)
		}
		n := event.EncodedLen(&evs[i])
		size += uvarintLen(uint64(n)) + n
	}
	cfg := DefaultProducerConfig()
	cfg.FrameEvents, cfg.FrameBytes = max(len(evs), 1), size
	m := newProducerMetrics(&Producer{})
	f := newFramer(cfg, seq, key, &m)
	f.setPartitions(1)
	for i := range evs {
		f.add(&evs[i], event.EncodedLen(&evs[i]))
	}
	f.sealAll()
	if len(f.sealed) != 1 || f.sealed[0].events != len(evs) {
		t.Fatalf("SealFrame: got %d frames, want one of the %d events (events of one edge)", len(f.sealed), len(evs))
	}
	return f.sealed[0].value
}
