package pipeline_test

import (
	"testing"
	"time"

	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// TestSignedEndToEnd: a producer with the events key sends every event to
// a consumer with it, in frames that carry a MAC; the consumer refuses, and
// counts by reason, what a writer without the key adds: single events, an
// unsigned frame, a frame signed with another key, and a signed frame
// copied to another partition (where the duplicate check, which keys on
// the partition, would not catch it).
func TestSignedEndToEnd(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	key := testKey(5)
	pc := fastProducerConfig(addr, "events")
	pc.Key = key
	p, reg := newProducer(t, pc)
	evs := testEvents(1, 20, 5, 0)
	for i := range evs {
		if !p.Emit(&evs[i]) {
			t.Fatalf("Emit %d: got false", i)
		}
	}
	closeProducer(t, p)
	if o := producerOutcomes(t, reg); o.delivered != float64(len(evs)) {
		t.Fatalf("delivered: got %v, want %d", o.delivered, len(evs))
	}

	forged := testEvents(2, 3, 1, 1000)
	signedP0 := pipeline.SealSignedFrame(t, key, 1, forged) // signed for partition 0, written to 1
	writeRaw(t, addr, 1, eventtest.Encode(t, forged[0]), mustFrame(t, 2, 2, forged),
		pipeline.SealSignedFrame(t, testKey(6), 3, forged), signedP0)

	cc := fastConsumerConfig(addr, "events", "judge")
	cc.Key = key
	var col collector
	cs := startConsumer(t, cc, col.apply)
	refused := func(reason string) float64 {
		return testenv.MetricSum(t, cs.reg, "poplimit_pipeline_messages_refused_total", "reason", reason)
	}
	testenv.WaitFor(t, 20*time.Second, "every event consumed, every forgery refused", func() bool {
		return col.len() >= len(evs) && refused("unsigned")+refused("bad_mac") >= 4
	})
	time.Sleep(200 * time.Millisecond)
	if err := cs.stop(); err != nil {
		t.Errorf("Run: got %v, want nil", err)
	}
	checkExactlyOnce(t, col.snapshot(), evs)
	if u, b := refused("unsigned"), refused("bad_mac"); u != 2 || b != 2 {
		t.Errorf("refused: got unsigned %v, bad_mac %v; want 2 (an event, a frame) and 2 (another key, another partition)", u, b)
	}
}
