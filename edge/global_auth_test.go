package edge_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
)

// These tests play a writer to the topic of the counts who is not the
// aggregator (anyone the brokers let write): the real edge must not let
// what that writer sends choose another client's limit.

type globalNoEvents struct{}

func (globalNoEvents) Emit(*event.Event) bool { return true }

const globalRule = "rules: [{name: g, limit: 10, window: 1m, scope: global}]"

// globalEdge starts an edge of PoP pop reading the counts from broker.
func globalEdge(t *testing.T, broker, pop string, mod func(*edge.Options)) *edge.Edge {
	t.Helper()
	var o edge.Options
	o.Pop, o.Brokers, o.Events = pop, []string{broker}, globalNoEvents{}
	o.BlockCache.MaxEntries = 1 << 10
	if mod != nil {
		mod(&o)
	}
	return edgetest.Start(t, globalRule, o)
}

// globalLoopbackKey is the global rule's key of a client at 127.0.0.1.
func globalLoopbackKey(e *edge.Edge) uint64 {
	return e.Rules().Rules[0].Hash(netip.MustParseAddr("127.0.0.1").AppendTo(nil))
}

// forgeGlobal writes n messages to the topic of the counts as any client of the
// brokers can, msg(i, now) the i-th, built as it is written.
func forgeGlobal(t *testing.T, broker string, n int, msg func(i int, now int64) kafka.Message) {
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

// forgerHeader is the header of the forged messages, stamped at.
func forgerHeader(at int64) *global.Header {
	return &global.Header{Publisher: "forger", Instance: 1, Stamp: at}
}

// forgedGlobalCounts are counts for key of PoP "x" dated at start (Unix ms),
// units in the current window's first slot, stamped now.
func forgedGlobalCounts(key uint64, start int64, units uint64, now int64) kafka.Message {
	c := global.Counts{Key: key, Start: start, WindowMs: 60_000, Pops: []global.PopCount{{Pop: "x"}}}
	c.Pops[0].Units[global.Slots] = units
	return kafka.Message{Value: global.AppendCounts(nil, forgerHeader(now), &c)}
}

func forgedGlobalBeat(at int64) kafka.Message {
	return kafka.Message{Value: global.AppendHeartbeat(nil, forgerHeader(at), 50*time.Millisecond)}
}

func globalWindow() int64 { return time.Now().UnixMilli() / 60_000 * 60_000 }

// beatingGlobal runs a real publisher of an empty tally (heartbeats only) until
// the test ends.
func beatingGlobal(t *testing.T, broker string) {
	t.Helper()
	publishGlobal(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{})
}

// publishGlobal runs a real publisher of tally every 50 ms until the test ends,
// or until the returned stop.
func publishGlobal(t *testing.T, broker string, tally *global.Tally, kc global.KafkaConfig) (stop func()) {
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

func waitGlobalFresh(t *testing.T, e *edge.Edge, want bool, d time.Duration) {
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

// waitGlobalRead waits until e has read at least n messages of the topic.
func waitGlobalRead(t *testing.T, e *edge.Edge, n float64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total") < n {
		if time.Now().After(deadline) {
			t.Fatalf("the edge read %v messages of the topic in %v, want %v", testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total"), d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func globalAdmitted(t *testing.T, addr string, n int) (ok int) {
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
	beatingGlobal(t, broker)
	e := globalEdge(t, broker, "a", nil)
	waitGlobalFresh(t, e, true, 20*time.Second)
	before := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	yearAhead := time.Now().AddDate(1, 0, 0).UnixMilli() / 60_000 * 60_000
	forgeGlobal(t, broker, 1, func(_ int, now int64) kafka.Message {
		return forgedGlobalCounts(globalLoopbackKey(e), yearAhead, 1000, now)
	})
	waitGlobalRead(t, e, before+3, 20*time.Second) // the forged one and beats after it
	if ok := globalAdmitted(t, e.Addr(), 3); ok != 3 {
		t.Errorf("after counts dated a year ahead: %d of 3 requests admitted, want 3 (a limit of 10, nothing counted)", ok)
	}
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 1 {
		t.Error("not fresh: the decisions above were held to the share")
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
	forgeGlobal(t, broker, 40, func(i int, now int64) kafka.Message {
		if i%2 == 0 {
			return forgedGlobalBeat(0)
		}
		return forgedGlobalBeat(time.Now().AddDate(1, 0, 0).UnixNano())
	})
	waitGlobalRead(t, e, 40, 20*time.Second)
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 0 {
		t.Error("forged heartbeats stamped 0 and a year ahead made the feed fresh")
	}
	// Cut off: held to half the limit of 10.
	if ok := globalAdmitted(t, e.Addr(), 10); ok != 5 {
		t.Errorf("%d of 10 admitted, want 5 (-global-share 0.5 of 10: the feed is not fresh)", ok)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "stale"); n < 20 {
		t.Errorf("dropped{reason=stale}: %v, want ≥ 20", n)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "future"); n < 20 {
		t.Errorf("dropped{reason=future}: %v, want ≥ 20", n)
	}
}

// TestGlobalFullTableHoldsToShare: 5,000 keys fill the edges' tables
// (-global-max-keys 4,096); a key neither table holds is decided as if cut
// off, held to -global-share of its limit in each PoP, and counted;
// before, it got its limit in each PoP, 10 + 10 under a limit of 10.
func TestGlobalFullTableHoldsToShare(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	beatingGlobal(t, broker)
	// A minute's -global-stale: the flood is read as fast as this loaded
	// machine can, and its messages must not go stale meanwhile.
	small := func(o *edge.Options) { o.GlobalStale, o.GlobalMaxKeys = time.Minute, 4096 }
	a := globalEdge(t, broker, "a", small)
	b := globalEdge(t, broker, "b", small)
	waitGlobalFresh(t, a, true, 20*time.Second)
	waitGlobalFresh(t, b, true, 20*time.Second)
	const flood = 5_000
	// Keys of an hour's window: they stay in the tables however slowly
	// this machine reads them.
	hour := time.Now().Truncate(time.Hour).UnixMilli()
	forgeGlobal(t, broker, flood, func(i int, now int64) kafka.Message {
		c := global.Counts{Key: uint64(i) + 1<<40, Start: hour, WindowMs: 3_600_000, Pops: []global.PopCount{{Pop: "x"}}}
		c.Pops[0].Units[global.Slots] = 1
		return kafka.Message{Value: global.AppendCounts(nil, forgerHeader(now), &c)}
	})
	waitGlobalRead(t, a, flood, 120*time.Second)
	waitGlobalRead(t, b, flood, 120*time.Second)
	waitGlobalFresh(t, a, true, 20*time.Second)
	okA, okB := globalAdmitted(t, a.Addr(), 10), globalAdmitted(t, b.Addr(), 10)
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
	start := globalWindow()
	const flood = 20_000
	// The key of a client at 127.0.0.1 under rule g, as an edge hashes it.
	probe := globalEdge(t, broker, "p", func(o *edge.Options) { o.Brokers = nil })
	forgeGlobal(t, broker, flood, func(i int, now int64) kafka.Message {
		if i == flood-1 {
			return forgedGlobalCounts(globalLoopbackKey(probe), start, 1000, now)
		}
		return forgedGlobalCounts(uint64(i)+1<<40, start, 1, now)
	})
	beatingGlobal(t, broker) // one heartbeat per publish: a publish of one message
	e := globalEdge(t, broker, "a", nil)
	waitGlobalFresh(t, e, true, 20*time.Second)
	read := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	t.Logf("messages read by the time the feed was fresh: %v (%d old ones on the topic)", read, flood)
	// From its newest message, the edge reads heartbeats only: at most a
	// few publishes' worth in the time it takes to start.
	if read >= 100 {
		t.Errorf("a new edge read %v messages before it was fresh, want the newest only (the topic held %d old ones)", read, flood)
	}
	if ok := globalAdmitted(t, e.Addr(), 3); ok != 3 {
		t.Errorf("after a restart, %d of 3 admitted: a forged entry of the topic's past came back", ok)
	}
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 1 {
		t.Error("not fresh: the decisions above were held to the share")
	}
}

// writeGlobalKey writes a key file of n bytes and returns its path and the key.
func writeGlobalKey(t *testing.T, n int, fill byte) (string, []byte) {
	t.Helper()
	key := bytes.Repeat([]byte{fill}, n)
	p := filepath.Join(t.TempDir(), "global.key")
	if err := os.WriteFile(p, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, key
}

// TestGlobalUnsignedMessagesChangeNoDecision: with -global-key-file, the
// signed publisher's counts are taken; unsigned messages, and messages
// signed with another key, change no decision and are counted.
func TestGlobalUnsignedMessagesChangeNoDecision(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	path, key := writeGlobalKey(t, 32, 'k')
	publishGlobal(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{Key: key, Name: "agg"})
	e := globalEdge(t, broker, "a", func(o *edge.Options) { o.GlobalKeyFile = path })
	waitGlobalFresh(t, e, true, 20*time.Second)
	before := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	k := globalLoopbackKey(e)
	other := bytes.Repeat([]byte{'o'}, 32)
	forgeGlobal(t, broker, 2, func(i int, now int64) kafka.Message {
		m := forgedGlobalCounts(k, globalWindow(), 1000, now)
		if i == 1 { // signed with another key
			m.Value, _ = global.Sign(other, global.DefaultTopic, m.Key, m.Value)
		}
		return m
	})
	waitGlobalRead(t, e, before+4, 20*time.Second)
	if ok := globalAdmitted(t, e.Addr(), 3); ok != 3 {
		t.Errorf("after unsigned and badly signed counts of 1000: %d of 3 admitted, want 3", ok)
	}
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 1 {
		t.Error("not fresh: the decisions above were held to the share, not decided on the signed counts")
	}
	// A heartbeat of a publisher of its own, unsigned: not a publisher.
	forgeGlobal(t, broker, 1, func(_ int, now int64) kafka.Message { return forgedGlobalBeat(now) })
	waitGlobalRead(t, e, before+7, 20*time.Second)
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "unsigned"); n != 2 {
		t.Errorf("dropped{reason=unsigned}: %v, want 2", n)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "bad_mac"); n != 1 {
		t.Errorf("dropped{reason=bad_mac}: %v, want 1", n)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_publishers"); n != 1 {
		t.Errorf("global_publishers: %v, want 1 (the forged heartbeat's publisher is not one)", n)
	}
	// A signed count of the key does change the decision: the key is the
	// same one the aggregator signs with.
	tally := global.NewTally(global.TallyConfig{})
	for range 8 {
		tally.Add(event.Event{Time: time.Now().UnixNano(), KeyHash: k, Rule: []byte("g"), Cost: 1, Limit: 10,
			WindowMillis: 60_000, Decision: event.Allowed, Global: true, Pop: []byte("b")})
	}
	publishGlobal(t, broker, tally, global.KafkaConfig{Key: key, Name: "agg2"})
	deadline := time.Now().Add(20 * time.Second)
	for testenv.MetricSum(t, e.Registry, "poplimit_edge_global_publishers") != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	waitGlobalFresh(t, e, true, 20*time.Second)
	if ok := globalAdmitted(t, e.Addr(), 3); ok != 0 {
		t.Errorf("PoP b counted 8 of 10 (signed), this PoP 3 already: %d of 3 more admitted, want 0", ok)
	}
	if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 1 {
		t.Error("not fresh: the decisions above were held to the share, not decided on the signed counts")
	}
}

// TestGlobalKeyFileRefused: a key file shorter than 32 bytes, or missing,
// stops the edge from starting, with an error naming the flag.
func TestGlobalKeyFileRefused(t *testing.T) {
	short, _ := writeGlobalKey(t, 31, 's')
	for _, path := range []string{short, filepath.Join(t.TempDir(), "missing")} {
		o := edge.Options{Pop: "a", Brokers: []string{"127.0.0.1:1"}, Events: globalNoEvents{}, GlobalKeyFile: path, Logger: edgetest.Discard}
		o.BlockCache.MaxEntries = 1 << 10
		e, err := edge.Build(o)
		if err == nil {
			e.Close(context.Background())
			t.Errorf("key file %s: built, want an error", path)
			continue
		}
		if !strings.Contains(err.Error(), "-global-key-file") {
			t.Errorf("key file %s: error %q does not name -global-key-file", path, err)
		}
	}
}

// globalCut dials brokers until cut, then refuses (and closes what it
// opened): a publisher that crashes writes no farewell.
type globalCut struct {
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func (c *globalCut) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.cut.Load() {
		return nil, errors.New("cut")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *globalCut) Cut() {
	c.cut.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
}

// TestGlobalTwoPublishersOneDies: two aggregators publish to one topic
// (each its partitions' keys): the edge waits for both; one that stops
// cleanly says so and the feed stays fresh; one that dies leaves the feed
// stale, its keys' counts held to -global-share, until the edge forgets it
// (ForgetStales × -global-stale), not silently stale.
func TestGlobalTwoPublishersOneDies(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	path, key := writeGlobalKey(t, 40, 'z')
	const stale = 300 * time.Millisecond
	e := globalEdge(t, broker, "a", func(o *edge.Options) { o.GlobalKeyFile, o.GlobalStale = path, stale })
	publishers := func() float64 { return testenv.MetricSum(t, e.Registry, "poplimit_edge_global_publishers") }
	waitPublishers := func(n float64, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for publishers() != n {
			if time.Now().After(deadline) {
				t.Fatalf("global_publishers: %v after %v, want %v", publishers(), d, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	publishGlobal(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{Key: key, Name: "agg-1"})
	var cut globalCut
	stop2 := publishGlobal(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{Key: key, Name: "agg-2", Dial: cut.dial})
	waitPublishers(2, 20*time.Second)
	waitGlobalFresh(t, e, true, 20*time.Second)

	// agg-2 dies: no farewell.
	cut.Cut()
	diedAt := time.Now()
	go stop2()
	waitGlobalFresh(t, e, false, 10*time.Second)
	t.Logf("stale %v after agg-2 died", time.Since(diedAt))
	if ok := globalAdmitted(t, e.Addr(), 10); ok != 5 {
		t.Errorf("with agg-2 dead: %d of 10 admitted, want 5 (held to -global-share)", ok)
	}
	if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_fallbacks_total"); n < 5 {
		t.Errorf("global_fallbacks_total: %v, want ≥ 5", n)
	}
	if publishers() != 2 {
		t.Errorf("global_publishers: %v right after agg-2 died, want 2 (waited for)", publishers())
	}
	// Forgotten after ForgetStales × stale (4.5 s): fresh again on agg-1.
	waitPublishers(1, 30*time.Second)
	waitGlobalFresh(t, e, true, 10*time.Second)
	// (Forgotten after its last message, up to one interval before it died.)
	if d := time.Since(diedAt); d < global.ForgetStales*stale-100*time.Millisecond {
		t.Errorf("agg-2 forgotten %v after it died, want about %v", d, global.ForgetStales*stale)
	}

	// agg-3 joins, then stops cleanly: its farewell keeps the feed fresh.
	stop3 := publishGlobal(t, broker, global.NewTally(global.TallyConfig{}), global.KafkaConfig{Key: key, Name: "agg-3"})
	waitPublishers(2, 20*time.Second)
	waitGlobalFresh(t, e, true, 20*time.Second)
	stop3()
	waitPublishers(1, 20*time.Second)
	for range 10 {
		if testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_fresh") != 1 {
			t.Fatal("the feed went stale after agg-3 stopped cleanly")
		}
		time.Sleep(stale / 4)
	}
}

// TestGlobalNewEdgeReadsNoOldMessage: after a flood of 20,000 messages
// (older than -global-stale by the time the edge starts), a new edge reads
// fewer of them than one publish carries (201 messages: 200 keys and a
// heartbeat); each one read would be counted as stale.
func TestGlobalNewEdgeReadsNoOldMessage(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, global.DefaultTopic)
	const flood, keys = 20_000, 200
	start := globalWindow()
	forgeGlobal(t, broker, flood, func(i int, now int64) kafka.Message { return forgedGlobalCounts(uint64(i)+1<<40, start, 1, now) })
	time.Sleep(global.DefaultStale + 500*time.Millisecond) // the flood is stale now
	tally := global.NewTally(global.TallyConfig{})
	for k := range uint64(keys) {
		tally.Add(event.Event{Time: time.Now().UnixNano(), KeyHash: k + 1, Rule: []byte("g"), Cost: 5, Limit: 10,
			WindowMillis: 60_000, Decision: event.Allowed, Global: true, Pop: []byte("b")})
	}
	publishGlobal(t, broker, tally, global.KafkaConfig{Name: "agg"})
	e := globalEdge(t, broker, "a", nil)
	waitGlobalFresh(t, e, true, 20*time.Second)
	time.Sleep(200 * time.Millisecond) // a few publishes more
	old := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_dropped_total", "reason", "stale")
	read := testenv.MetricSum(t, e.Registry, "poplimit_edge_global_feed_messages_total")
	t.Logf("a new edge read %v messages, %v of them old (the topic held %d old ones; a publish is %d)", read, old, flood, keys+1)
	if old >= keys+1 {
		t.Errorf("a new edge read %v old messages, want fewer than one publish's worth (%d)", old, keys+1)
	}
}
