package pipeline

import "testing"

// SealFrame returns the frame the producer's framer seals of evs, valid
// events all of one edge, numbered seq: the tests of the frame format
// encode through the encoder that writes to Kafka.
func SealFrame(t testing.TB, seq uint64, evs []Event) []byte {
	t.Helper()
	size := FrameHeaderLen
	for i := range evs {
		if err := evs[i].check(); err != nil {
			t.Fatalf("SealFrame: event %d: %v", i, err)
		}
		n := EncodedLen(&evs[i])
		size += uvarintLen(uint64(n)) + n
	}
	cfg := DefaultProducerConfig()
	cfg.FrameEvents, cfg.FrameBytes = max(len(evs), 1), size
	m := newProducerMetrics(&Producer{})
	f := newFramer(cfg, seq, &m)
	f.setPartitions(1)
	for i := range evs {
		f.add(&evs[i], EncodedLen(&evs[i]))
	}
	f.sealAll()
	if len(f.sealed) != 1 || f.sealed[0].events != len(evs) {
		t.Fatalf("SealFrame: got %d frames, want one of the %d events (events of one edge)", len(f.sealed), len(evs))
	}
	return f.sealed[0].value
}
