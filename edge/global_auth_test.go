package edge_test

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// These tests play a writer to the topic of the counts who is not the
// aggregator (anyone the brokers let write): the real edge must not let
// what that writer sends choose another client's limit.

type noEvents struct{}

func (noEvents) Emit(*pipeline.Event) bool { return true }

const globalRule = "rules: [{name: g, limit: 10, window: 1m, scope: global}]"

// globalEdge starts an edge of PoP pop reading the counts from broker.
func globalEdge(t *testing.T, broker, pop string, mod func(*edge.Options)) *edge.Edge {
	t.Helper()
	var o edge.Options
	o.Pop, o.Brokers, o.Events = pop, []string{broker}, noEvents{}
	o.BlockCache.MaxEntries = 1 << 10
	if mod != nil {
		mod(&o)
	}
	return edgetest.Start(t, globalRule, o)
}

// loopbackKey is the global rule's key of a client at 127.0.0.1.
func loopbackKey(e *edge.Edge) uint64 {
	return e.Rules().Rules[0].Hash(netip.MustParseAddr("127.0.0.1").AppendTo(nil))
}

// forge writes n messages to the topic of the counts as any client of the
// brokers can, msg(i, now) the i-th, built as it is written.
func forge(t *testing.T, broker string, n int, msg func(i int, now int64) kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: global.DefaultTopic, BatchSize: 10000,
		BatchTimeout: time.Millisecond, BatchBytes: 64 << 20, RequiredAcks: kafka.RequireOne}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < n; {
		now := time.Now().UnixNano()
		var msgs []kafka.Message
		for ; i < n && len(msgs) < 10000; i++ {
			msgs = append(msgs, msg(i, now))
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("forging %d messages: %v", len(msgs), err)
		}
	}
}

// forger is the header of the forged messages, stamped at.
func forger(at int64) *global.Header {
	return &global.Header{Publisher: "forger", Instance: 1, Stamp: at}
}

// forgedCounts are counts for key of PoP "x" dated at start (Unix ms),
// units in the current window's first slot, stamped now.
func forgedCounts(key uint64, start int64, units uint64, now int64) kafka.Message {
	c := global.Counts{Key: key, Start: start, WindowMs: 60_000, Pops: []global.PopCount{{Pop: "x"}}}
	c.Pops[0].Units[global.Slots] = units
	return kafka.Message{Value: global.AppendCounts(nil, forger(now), &c)}
}

func forgedBeat(at int64) kafka.Message {
	return kafka.Message{Value: global.AppendHeartbeat(nil, forger(at), 50*time.Millisecond)}
}

func thisWindow() int64 { return time.Now().UnixMilli() / 60_000 * 60_000 }

// beating runs a real publisher of an empty tally (heartbeats only) until
// the test ends.
func beating(t *testing.T, broker string) {
	t.Helper()
	publish(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{})
}

// publish runs a real publisher of tally every 50 ms until the test ends,
// or until the returned stop.
func publish(t *testing.T, broker string, tally *global.Tally, kc global.KafkaConfig) (stop func()) {
	t.Helper()
	kc.Brokers = []string{broker}
	p, err := global.NewPublisher(tally, kc, 50*time.Millisecond, edgetest.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func waitFresh(t *testing.T, e *edge.Edge, want bool, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		fresh := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") == 1
		if fresh == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("global_feed_fresh: still %v after %v, want %v", fresh, d, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRead waits until e has read at least n messages of the topic.
func waitRead(t *testing.T, e *edge.Edge, n float64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total") < n {
		if time.Now().After(deadline) {
			t.Fatalf("the edge read %v messages of the topic in %v, want %v", testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total"), d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func admitted(t *testing.T, addr string, n int) (ok int) {
	t.Helper()
	for range n {
		if get(t, addr, "/").StatusCode == http.StatusOK {
			ok++
		}
	}
	return ok
}

// TestGlobalCountsFromTheFutureChangeNoDecision: counts dated a year ahead
// are ignored (and counted), not held until a year has passed.
func TestGlobalCountsFromTheFutureChangeNoDecision(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	beating(t, broker)
	e := globalEdge(t, broker, "a", nil)
	waitFresh(t, e, true, 20*time.Second)
	before := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	yearAhead := time.Now().AddDate(1, 0, 0).UnixMilli() / 60_000 * 60_000
	forge(t, broker, 1, func(_ int, now int64) kafka.Message { return forgedCounts(loopbackKey(e), yearAhead, 1000, now) })
	waitRead(t, e, before+3, 20*time.Second) // the forged one and beats after it
	if ok := admitted(t, e.Addr(), 3); ok != 3 {
		t.Errorf("after counts dated a year ahead: %d of 3 requests admitted, want 3 (a limit of 10, nothing counted)", ok)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "future"); n < 1 {
		t.Errorf("dropped{reason=future}: %v, want ≥ 1", n)
	}
}

// TestGlobalForgedHeartbeatsKeepNothingFresh: heartbeats stamped 0 (or a
// year ahead) do not make a feed without its publisher fresh.
func TestGlobalForgedHeartbeatsKeepNothingFresh(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	e := globalEdge(t, broker, "a", nil)
	time.Sleep(300 * time.Millisecond) // the feed is at the topic's end
	forge(t, broker, 40, func(i int, now int64) kafka.Message {
		if i%2 == 0 {
			return forgedBeat(0)
		}
		return forgedBeat(time.Now().AddDate(1, 0, 0).UnixNano())
	})
	waitRead(t, e, 40, 20*time.Second)
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 0 {
		t.Error("forged heartbeats stamped 0 and a year ahead made the feed fresh")
	}
	// Cut off: held to half the limit of 10.
	if ok := admitted(t, e.Addr(), 10); ok != 5 {
		t.Errorf("%d of 10 admitted, want 5 (-global-share 0.5 of 10: the feed is not fresh)", ok)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "stale"); n < 20 {
		t.Errorf("dropped{reason=stale}: %v, want ≥ 20", n)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "future"); n < 20 {
		t.Errorf("dropped{reason=future}: %v, want ≥ 20", n)
	}
}

// TestGlobalFullTableHoldsToShare: 300,000 keys fill the edges' tables
// (262,144 entries); a key neither table holds is decided as if cut off,
// held to -global-share of its limit in each PoP, and counted; before,
// it got its limit in each PoP, 10 + 10 under a limit of 10.
func TestGlobalFullTableHoldsToShare(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	beating(t, broker)
	// A minute's -global-stale: the flood is read as fast as this loaded
	// machine can, and its messages must not go stale meanwhile.
	slow := func(o *edge.Options) { o.GlobalStale = time.Minute }
	a := globalEdge(t, broker, "a", slow)
	b := globalEdge(t, broker, "b", slow)
	waitFresh(t, a, true, 20*time.Second)
	waitFresh(t, b, true, 20*time.Second)
	const flood = 300_000
	start := thisWindow()
	forge(t, broker, flood, func(i int, now int64) kafka.Message { return forgedCounts(uint64(i)+1<<40, start, 1, now) })
	waitRead(t, a, flood, 120*time.Second)
	waitRead(t, b, flood, 120*time.Second)
	waitFresh(t, a, true, 20*time.Second)
	okA, okB := admitted(t, a.Addr(), 10), admitted(t, b.Addr(), 10)
	t.Logf("admitted: PoP a %d, PoP b %d of 10 each, limit 10 across PoPs", okA, okB)
	if okA+okB > 10 {
		t.Errorf("a key the full tables could not hold: %d + %d admitted under a global limit of 10, want each PoP held to its share (5)", okA, okB)
	}
	for _, e := range []*edge.Edge{a, b} {
		if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_table_full_total"); n < 1 {
			t.Errorf("global_table_full_total: %v, want ≥ 1", n)
		}
		if f := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_table_fill_ratio"); f != 1 {
			t.Errorf("global_table_fill_ratio: %v, want 1", f)
		}
	}
}

// TestGlobalNewEdgeReadsFromNewest: an edge started after a flood of old
// messages reads the topic from its newest: fewer old messages than one
// publish carries, and the flood's forged entries do not come back.
func TestGlobalNewEdgeReadsFromNewest(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	start := thisWindow()
	const flood = 20_000
	// The key of a client at 127.0.0.1 under rule g, as an edge hashes it.
	probe := globalEdge(t, broker, "p", func(o *edge.Options) { o.Brokers = nil })
	forge(t, broker, flood, func(i int, now int64) kafka.Message {
		if i == flood-1 {
			return forgedCounts(loopbackKey(probe), start, 1000, now)
		}
		return forgedCounts(uint64(i)+1<<40, start, 1, now)
	})
	beating(t, broker) // one heartbeat per publish: a publish of one message
	e := globalEdge(t, broker, "a", nil)
	waitFresh(t, e, true, 20*time.Second)
	read := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	t.Logf("messages read by the time the feed was fresh: %v (%d old ones on the topic)", read, flood)
	// From its newest message, the edge reads heartbeats only: at most a
	// few publishes' worth in the time it takes to start.
	if read >= 100 {
		t.Errorf("a new edge read %v messages before it was fresh, want the newest only (the topic held %d old ones)", read, flood)
	}
	if ok := admitted(t, e.Addr(), 3); ok != 3 {
		t.Errorf("after a restart, %d of 3 admitted: a forged entry of the topic's past came back", ok)
	}
}
