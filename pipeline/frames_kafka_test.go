package pipeline_test

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// readPartition returns every message of one partition of topic, in order,
// read without a group.
func readPartition(t *testing.T, addr, topic string, partition int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, partition)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	last, err := conn.ReadLastOffset()
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	for offset := int64(0); offset < last; {
		if _, err := conn.Seek(offset, kafka.SeekAbsolute); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		batch := conn.ReadBatch(1, 10<<20)
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			m.Partition = partition
			msgs = append(msgs, m)
			offset = m.Offset + 1
		}
		if err := batch.Close(); err != nil {
			t.Fatalf("partition %d at offset %d: %v", partition, offset, err)
		}
	}
	return msgs
}

// hashPartition is kafka-go's Hash balancer on the 8-byte key, written out:
// where one message per event put a key.
func hashPartition(keyHash uint64, n int) int {
	h := fnv.New32a()
	h.Write(binary.BigEndian.AppendUint64(nil, keyHash))
	p := int32(h.Sum32()) % int32(n)
	if p < 0 {
		p = -p
	}
	return int(p)
}

// TestFramesOnTheWire reads the topic below the consumer: every message is
// a frame of at most FrameEvents events, all of keys that hash to the
// frame's partition; each (edge, partition) stream of one producer is
// numbered without a gap, and a restarted producer uses other numbers.
func TestFramesOnTheWire(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	cfg := fastProducerConfig(addr, "events")
	cfg.FrameEvents = 16
	// Delivery, not outages, is under test: see TestProduceConsume.
	cfg.WriteTimeout, cfg.MaxAttempts = 10*time.Second, 5
	first := testEvents(1, 40, 50, 0)
	second := later(testEvents(1, 40, 5, 100_000), 1) // the same edge, restarted
	for _, evs := range [][]event.Event{first, second} {
		p, reg := newProducer(t, cfg)
		for i := range evs {
			if !p.Emit(&evs[i]) {
				t.Fatalf("Emit %d: got false, want true", i)
			}
		}
		closeProducer(t, p)
		if o := producerOutcomes(t, reg); o.delivered != float64(len(evs)) {
			t.Fatalf("outcomes: got %+v, want %d delivered", o, len(evs))
		}
	}

	var got []event.Event
	type run struct{ lo, hi uint64 } // the sequence numbers one producer used on one partition
	runs := map[bool][]run{}         // by producer: restarted or not
	for part := range partitions {
		byRun := map[bool]*run{}
		for _, m := range readPartition(t, addr, "events", part) {
			var h pipeline.FrameHeader
			evs, err := pipeline.DecodeFrame(m.Value, &h, nil)
			if err != nil {
				t.Fatalf("partition %d offset %d: DecodeFrame: %v", part, m.Offset, err)
			}
			if h.Count > cfg.FrameEvents || h.Edge != 1 {
				t.Errorf("frame %+v: want at most %d events, of edge 1", h, cfg.FrameEvents)
			}
			restarted := evs[0].Cost >= 100_000
			for _, e := range evs {
				if p := hashPartition(e.KeyHash, partitions); p != part {
					t.Errorf("key %x in a frame of partition %d: want partition %d, as kafka.Hash places it", e.KeyHash, part, p)
				}
				if (e.Cost >= 100_000) != restarted {
					t.Errorf("frame %+v holds events of both producers", h)
				}
			}
			got = append(got, evs...)
			r := byRun[restarted]
			switch {
			case r == nil:
				byRun[restarted] = &run{h.Seq, h.Seq}
			case h.Seq != r.hi+1:
				t.Errorf("partition %d: frame %d after %d, want consecutive numbers", part, h.Seq, r.hi)
				r.hi = h.Seq
			default:
				r.hi = h.Seq
			}
		}
		for restarted, r := range byRun {
			runs[restarted] = append(runs[restarted], *r)
		}
	}
	checkExactlyOnce(t, got, append(first, second...))
	for restarted, rs := range runs {
		for _, r := range rs[1:] {
			if r.lo != rs[0].lo {
				t.Errorf("restarted=%v: partitions start at %d and %d, want one first number per producer", restarted, rs[0].lo, r.lo)
			}
		}
	}
	for _, a := range runs[false] {
		for _, b := range runs[true] {
			if a.lo <= b.hi && b.lo <= a.hi {
				t.Errorf("the restarted producer reused numbers: [%d, %d] and [%d, %d]", a.lo, a.hi, b.lo, b.hi)
			}
		}
	}
}

// later moves evs s seconds later, after the events of testEvents with
// the same keys.
func later(evs []event.Event, s int64) []event.Event {
	for i := range evs {
		evs[i].Time += s * int64(time.Second)
	}
	return evs
}

// toPartition is a balancer that sends every message to one partition.
type toPartition int

func (p toPartition) Balance(kafka.Message, ...int) int { return int(p) }

// writeRaw writes values, in order, to one partition with a plain kafka-go
// writer, as a retried write or an older producer would have.
func writeRaw(t *testing.T, addr string, partition int, values ...[]byte) {
	t.Helper()
	tr := &kafka.Transport{} // not kafka.DefaultTransport, whose goroutines live forever
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(addr), Topic: "events", Balancer: toPartition(partition), Transport: tr,
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne,
	}
	msgs := make([]kafka.Message, len(values))
	for i, v := range values {
		msgs[i] = kafka.Message{Value: v}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerDropsDuplicateFrames writes frames twice, as a retried write
// does, among frames that only look alike (same sequence number on another
// partition or of another edge) and single events of both versions: the
// consumer applies every event once, drops and counts the copies, and hands
// apply at most MaxBatch events at a time.
func TestConsumerDropsDuplicateFrames(t *testing.T) {
	for _, dedup := range []bool{true, false} {
		t.Run(map[bool]string{true: "dedup", false: "off"}[dedup], func(t *testing.T) {
			t.Parallel()
			_, addr := startBroker(t, 0, "events")
			a := testEvents(1, 10, 3, 0)              // edge 1, seq 10
			b := later(testEvents(1, 10, 2, 1000), 1) // edge 1, seq 11
			c := testEvents(2, 10, 2, 2000)           // edge 2, seq 10: another stream
			g := later(testEvents(1, 10, 2, 3000), 2) // edge 1, seq 10, on partition 1: another stream
			single := testEvents(3, 2, 1, 4000)
			for i := range g { // keys of its own, as a partition's are
				g[i].KeyHash = ^g[i].KeyHash
			}
			fa, fb, fc, fg := mustFrame(t, 1, 10, a), mustFrame(t, 1, 11, b), mustFrame(t, 2, 10, c), mustFrame(t, 1, 10, g)
			v1 := eventtest.AppendV1(nil, &single[1])
			writeRaw(t, addr, 0, fa, fb, fa, fc, eventtest.Encode(t, single[0]), v1, fb)
			writeRaw(t, addr, 1, fg)
			want := append(append(append(append(append([]event.Event(nil), a...), b...), c...), g...), eventtest.AsV1(single[1]), single[0])
			if !dedup {
				want = append(want, a...)
				want = append(want, b...)
			}

			cfg := fastConsumerConfig(addr, "events", "judge")
			cfg.MaxBatch = 7
			if !dedup {
				cfg.DedupFrames = 0
			}
			var col collector
			var mu sync.Mutex
			largest := 0
			cs := startConsumer(t, cfg, func(batch []event.Event) error {
				mu.Lock()
				largest = max(largest, len(batch))
				mu.Unlock()
				return col.apply(batch)
			})
			testenv.WaitFor(t, 20*time.Second, "every event consumed", func() bool { return col.len() >= len(want) })
			// A copy is applied (or dropped) before the group commits past
			// it: once the whole log is committed, none is left to arrive.
			testenv.WaitCommitted(t, 20*time.Second, addr, "events", "judge", partitions)
			if err := cs.stop(); err != nil {
				t.Errorf("Run: got %v, want nil", err)
			}
			got := col.snapshot()
			if dedup {
				checkExactlyOnce(t, got, want)
			} else if len(got) != len(want) {
				t.Errorf("events without frame dedup: got %d, want %d (the copies too)", len(got), len(want))
			}
			mu.Lock()
			if largest > cfg.MaxBatch {
				t.Errorf("largest batch applied: got %d events, want at most MaxBatch %d", largest, cfg.MaxBatch)
			}
			mu.Unlock()
			wantFrames, wantDupFrames, wantDupEvents := 4.0, 2.0, float64(len(a)+len(b))
			if !dedup {
				wantFrames, wantDupFrames, wantDupEvents = 6, 0, 0
			}
			for _, m := range []struct {
				name string
				want float64
			}{
				{"poplimit_pipeline_frames_consumed_total", wantFrames},
				{"poplimit_pipeline_duplicate_frames_total", wantDupFrames},
				{"poplimit_pipeline_duplicate_events_total", wantDupEvents},
				{"poplimit_pipeline_events_consumed_total", float64(len(want))},
				{"poplimit_pipeline_decode_errors_total", 0},
			} {
				if got := testenv.MetricSum(t, cs.reg, m.name); got != m.want {
					t.Errorf("%s: got %v, want %v", m.name, got, m.want)
				}
			}
		})
	}
}
