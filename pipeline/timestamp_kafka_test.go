package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// A frame's message timestamp is when the producer framed it, whatever its
// events' own times: a frame whose first event was stamped 100 years ago
// (a skewed or forged clock) would otherwise be deleted at once by a
// broker's time-based retention, or refused by one that bounds timestamps,
// and the valid events framed with it lost with it (kfake, with a retention
// of an hour, deleted such a frame within half a second). Here the frames
// start with events stamped a century off, followed by valid ones.
func TestFrameTimestampIsTheProducers(t *testing.T) {
	const topic = "stamps"
	_, addr := startBroker(t, 0, topic)
	p, _ := newProducer(t, fastProducerConfig(addr, topic))
	century := int64(100 * 365 * 24 * time.Hour)
	before := time.Now()
	for i, off := range []int64{-century, century} {
		for k := range uint64(16) { // keys over every partition
			key := k*0x9e3779b97f4a7c15 + 1
			for j, at := range []int64{time.Now().UnixNano() + off, time.Now().UnixNano()} {
				e := event.Event{Time: at, Edge: 1, Rule: []byte("api"), KeyHash: key, Cost: 1, Limit: 10,
					WindowMillis: 1000, Decision: event.Allowed, Mode: policy.Async, Estimate: float32(i + j)}
				if !p.Emit(&e) {
					t.Fatal("Emit: got false")
				}
			}
		}
	}
	closeProducer(t, p)
	after := time.Now()

	read := 0
	for part := range partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: part, MaxWait: 100 * time.Millisecond})
		conn, err := kafka.DialLeader(context.Background(), "tcp", addr, topic, part)
		if err != nil {
			t.Fatal(err)
		}
		end, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(0); off < end; off++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			m, err := r.ReadMessage(ctx)
			cancel()
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", part, off, err)
			}
			read++
			if m.Time.Before(before.Add(-time.Second)) || m.Time.After(after.Add(time.Second)) {
				t.Errorf("partition %d offset %d: message timestamp %v, want between %v and %v (when it was produced)", part, off, m.Time, before, after)
			}
		}
		r.Close()
	}
	if read == 0 {
		t.Fatal("no message on the topic")
	}
	t.Logf("%d frames, each stamped when it was produced", read)
}
