package aggregator

import (
	"crypto/rand"
	"encoding/binary"
	"net/http"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/segmentio/kafka-go"
)

// forgedEvent is a decision of a global rule's key, allowed, as an edge of
// another PoP would report it: what a writer of the topic forges to make a
// key look spent everywhere, and its admissions wrongly allowed.
func forgedEvent(key uint64, i int) event.Event {
	return event.Event{Time: time.Now().UnixNano() + int64(i), KeyHash: key, Rule: []byte("g"),
		Pop: []byte("pop-b"), Global: true, Cost: 1, Limit: 2, WindowMillis: 60_000, Edge: 9,
		Decision: event.Allowed, Estimate: 1}
}

// TestForgedEventsRefused writes forged decision events straight to the
// topic, as anyone allowed to write it can (every edge must be): single
// events, an unsigned frame, and a frame signed with another key, beside
// the signed frames of a real edge. With the events key set, the real
// aggregator (embedded broker, consumer, judge and global tally as
// cmd/aggregator assembles them) judges and counts the edge's events only;
// the forgeries make no global count and no wrongly allowed figure, and
// each is counted by why it was refused.
func TestForgedEventsRefused(t *testing.T) {
	t.Parallel()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	cfg := testConfig(t)
	cfg.GlobalTopic, cfg.GlobalInterval = "global", 50*time.Millisecond
	cfg.IdleFlush = 200 * time.Millisecond
	cfg.Consumer.Key = key
	a := startAggregator(t, cfg)

	// A real edge of PoP pop-a, signing its events with the key.
	var o edge.Options
	o.Brokers, o.Topic, o.GlobalTopic, o.Pop, o.EdgeID = a.Brokers(), topic, "global", "pop-a", 3
	o.EventsKey = key
	ed := edgetest.Start(t, "rules: [{name: g, limit: 100, window: 1m, scope: global}]", o)
	testenv.WaitFor(t, 30*time.Second, "the edge's feed of the other PoPs' counts fresh", func() bool {
		return ed.Global.Fresh(time.Now().UnixNano())
	})
	const honest = 3
	for i := range honest {
		resp, err := http.Get("http://" + ed.Addr() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("honest request %d: got %d, want 200", i, resp.StatusCode)
		}
	}

	// The forgeries, written with kafka-go as any writer of the topic can.
	const forgedKey, forgedFramed = 0xf0f0, 0xf1f1
	var msgs []kafka.Message
	for i := range 6 {
		e := forgedEvent(forgedKey, i)
		b, err := event.Append(nil, &e)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, kafka.Message{Key: binary.BigEndian.AppendUint64(nil, forgedKey), Value: b})
	}
	e := forgedEvent(forgedFramed, 0)
	unsigned, err := frameOf(&e, 1)
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, kafka.Message{Key: binary.BigEndian.AppendUint64(nil, forgedFramed), Value: unsigned})
	other := make([]byte, 32)
	_, _ = rand.Read(other)
	badMAC := signedFrame(t, other, &e, 2, partitionFor(t, a, forgedFramed))
	msgs = append(msgs, kafka.Message{Key: binary.BigEndian.AppendUint64(nil, forgedFramed), Value: badMAC})
	w := &kafka.Writer{Addr: kafka.TCP(a.Brokers()...), Topic: topic, Balancer: &kafka.Hash{},
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne}
	defer w.Close()
	if err := w.WriteMessages(t.Context(), msgs...); err != nil {
		t.Fatal(err)
	}

	refused := func(reason string) float64 {
		return testenv.MetricSum(t, a.reg, "poplimit_pipeline_messages_refused_total", "reason", reason)
	}
	testenv.WaitFor(t, 30*time.Second, "the honest events judged and the forgeries refused", func() bool {
		r := getReport(t, a, false)
		return r.Events >= honest && refused("unsigned")+refused("bad_mac") >= 8
	})
	// Refused messages are committed with their batch: once the group has
	// committed the whole log, every message was judged or refused.
	testenv.WaitCommitted(t, 30*time.Second, a.Brokers()[0], topic, cfg.Consumer.GroupID, cfg.Partitions)
	r := getReport(t, a, true)
	if r.Events != honest || r.Enforced.WronglyAllowed != 0 {
		t.Errorf("events, wrongly allowed: got %d, %d; want %d (the edge's), 0", r.Events, r.Enforced.WronglyAllowed, honest)
	}
	if got, want := refused("unsigned"), 7.0; got != want {
		t.Errorf("refused unsigned: got %v, want %v (6 single events, 1 frame)", got, want)
	}
	if got := refused("bad_mac"); got != 1 {
		t.Errorf("refused bad_mac: got %v, want 1", got)
	}
	if n, _ := a.tally.Keys(); n != 1 {
		t.Errorf("global keys counted: got %d, want 1 (the edge's key only)", n)
	}
}

// signedFrame returns a frame of the one event e, numbered seq, signed with
// key for partition as pipeline/FORMAT.md lays out a frame of version 2.
func signedFrame(t testing.TB, key []byte, e *event.Event, seq uint64, partition int) []byte {
	t.Helper()
	b, err := frameOf(e, seq)
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 0x80 | pipeline.FrameVersionSigned
	k, err := pipeline.NewFrameKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return k.Sign(b, partition)
}

// partitionFor returns the partition of a's topic that kafka-go's Hash
// balancer picks for keyHash's 8 bytes, as the producer places events.
func partitionFor(t testing.TB, a *Aggregator, keyHash uint64) int {
	t.Helper()
	parts := make([]int, a.cfg.Partitions)
	for i := range parts {
		parts[i] = i
	}
	return (&kafka.Hash{}).Balance(kafka.Message{Key: binary.BigEndian.AppendUint64(nil, keyHash)}, parts...)
}
