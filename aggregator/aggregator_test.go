package aggregator

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// These tests run a real Kafka-protocol broker (kfake, embedded in the
// aggregator or started by the test), real pipeline producers and the real
// consumer group, over TCP on loopback ports chosen at run time.

const topic = "decisions"

// testConfig is an aggregator configuration with an embedded broker on any
// free port, timeouts short enough for tests, no idle flush (tests flush
// through /report?flush=1 or Shutdown) and no counts published.
func testConfig(t testing.TB) Config {
	t.Helper()
	c := Config{
		Listen:          "127.0.0.1:0",
		Embedded:        "127.0.0.1:0",
		Partitions:      4,
		Consumer:        pipeline.DefaultConsumerConfig(),
		Judge:           judge.DefaultConfig(),
		ShutdownTimeout: 5 * time.Second,
		IdleFlush:       Never,
		GlobalInterval:  Never,
	}
	c.Consumer.Topic = topic
	c.Consumer.GroupID = "aggregator"
	c.Consumer.MaxBatchWait = 10 * time.Millisecond
	c.Consumer.MaxWait = 100 * time.Millisecond
	c.Consumer.HeartbeatInterval = 500 * time.Millisecond
	c.Consumer.SessionTimeout = 6 * time.Second // kfake's minimum
	c.Consumer.RebalanceTimeout = 5 * time.Second
	c.Consumer.JoinGroupBackoff = 100 * time.Millisecond
	c.Consumer.ReadBackoffMin = 10 * time.Millisecond
	c.Consumer.ReadBackoffMax = 100 * time.Millisecond
	return c
}

// startAggregator starts an aggregator and stops it at the end of the test
// (tests that check the stop call Shutdown themselves first).
func startAggregator(t testing.TB, cfg Config) *Aggregator {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	a, err := Start(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { stopAggregator(t, a) })
	return a
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func stopAggregator(t testing.TB, a *Aggregator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: got %v, want nil", err)
	}
}

func newProducer(t testing.TB, brokers []string) *pipeline.Producer {
	t.Helper()
	c := pipeline.DefaultProducerConfig()
	c.Brokers = brokers
	c.Topic = topic
	c.BatchTimeout = 5 * time.Millisecond
	c.WriteTimeout = 5 * time.Second // a retry after a timeout duplicates a batch
	c.WriteBackoffMin = 20 * time.Millisecond
	c.WriteBackoffMax = 100 * time.Millisecond
	c.DialTimeout = 500 * time.Millisecond
	c.MetadataTTL = 500 * time.Millisecond
	p, err := pipeline.NewProducer(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeProducer(t, p) })
	return p
}

func closeProducer(t testing.TB, p *pipeline.Producer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Errorf("Producer.Close: got %v, want nil (every event delivered)", err)
	}
}

func getReport(t testing.TB, a *Aggregator, flush bool) judge.Report {
	t.Helper()
	url := "http://" + a.Addr() + "/report"
	if flush {
		url += "?flush=1"
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: got status %d, want 200", url, resp.StatusCode)
	}
	var r judge.Report
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return r
}

// trace builds scripted traces: decisions of two edges, alternating, so
// every key's events come from both.
type trace struct {
	base   int64 // Unix ns, a multiple of 10 s
	events []event.Event
}

func newTrace() *trace {
	// A recent instant (the broker stamps messages with it), on a window
	// boundary of the 10 s rules below.
	return &trace{base: time.Now().Add(-time.Minute).Truncate(10 * time.Second).UnixNano()}
}

// add appends n decisions of key from fromMs, stepMs apart, alternating
// between edges 1 and 2.
func (tr *trace) add(fromMs int64, n int, stepMs int64, key uint64, d event.Admission, mod func(*event.Event)) {
	for i := range n {
		e := event.Event{
			Time: tr.base + (fromMs+int64(i)*stepMs)*int64(time.Millisecond), KeyHash: key,
			Rule: []byte("api"), Cost: 1, Limit: 10, WindowMillis: 10_000,
			Edge: uint16(1 + i%2), Decision: d, Estimate: 1,
		}
		if mod != nil {
			mod(&e)
		}
		tr.events = append(tr.events, e)
	}
}

// emit sends the trace in time order, each event through its edge's
// producer, as two edges running side by side would.
func (tr *trace) emit(t testing.TB, producers map[uint16]*pipeline.Producer) {
	t.Helper()
	evs := slices.Clone(tr.events)
	slices.SortStableFunc(evs, func(a, b event.Event) int { return int(a.Time - b.Time) })
	for i := range evs {
		if !producers[evs[i].Edge].Emit(&evs[i]) {
			t.Fatalf("Emit %d: got false, want true", i)
		}
	}
}

func loginBlock(e *event.Event) {
	e.Rule, e.Action, e.Limit = []byte("login"), policy.Block, 5
}
func loginCache(e *event.Event) { loginBlock(e); e.FromBlockCache = true }

// knownTrace is a trace with a known exact answer.
func knownTrace() (*trace, judge.DecisionTally) {
	tr := newTrace()
	A, L := event.Allowed, event.Limited
	// api: throttle, 10 per 10 s.
	tr.add(0, 10, 100, 1, A, nil)      // key 1 just under: 10 admitted...
	tr.add(1000, 1, 0, 1, L, nil)      // ...and the 11th refused: right
	tr.add(0, 11, 100, 2, A, nil)      // key 2 just over: the 11th is wrongly allowed
	tr.add(9000, 10, 100, 3, A, nil)   // key 3, boundary double burst, fixed-window edge:
	tr.add(10_000, 10, 100, 3, A, nil) // all ten of the second burst wrongly allowed
	tr.add(9000, 10, 100, 4, A, nil)   // key 4, the same at a sliding-window edge:
	tr.add(10_000, 1, 0, 4, A, nil)    // one more admitted (wrongly)
	tr.add(10_100, 9, 100, 4, L, nil)  // and the rest refused (rightly)
	tr.add(0, 4, 100, 5, A, nil)       // key 5: refused at its 5th attempt,
	tr.add(400, 1, 0, 5, L, nil)       // wrongly limited
	// login: block, 5 per 10 s.
	tr.add(0, 5, 100, 6, A, loginBlock)                                 // key 6: 5 admitted,
	tr.add(500, 1, 0, 6, L, loginBlock)                                 // a block starts (right),
	tr.add(600, 4, 100, 6, L, loginCache)                               // the block cache answers (right by definition),
	tr.add(5000, 1, 0, 6, L, loginCache)                                // and again,
	tr.add(5500, 1, 0, 6, A, loginBlock)                                // the block ends too early: 12 attempts, wrongly allowed
	tr.add(0, 3, 100, 7, A, loginBlock)                                 // key 7: a block starts on the 4th attempt,
	tr.add(300, 1, 0, 7, L, loginBlock)                                 // wrongly limited,
	tr.add(400, 2, 100, 7, L, loginCache)                               // and its block-cache answers are right
	tr.add(0, 11, 10, 8, A, func(e *event.Event) { e.Shadow = true })   // shadow: apart
	tr.add(0, 11, 10, 9, A, func(e *event.Event) { e.Fallback = true }) // fallback: apart
	want := judge.DecisionTally{Decisions: 11 + 11 + 20 + 20 + 5 + 12 + 6, WronglyAllowed: 1 + 10 + 1 + 1, WronglyLimited: 2}
	return tr, want
}

// TestKnownAnswer sends a scripted trace through two edges' producers, the
// aggregator's embedded broker and its consumer group, and checks the
// report's exact counts.
func TestKnownAnswer(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	// The trace spans 11 s of event time but is emitted within
	// milliseconds, so an edge's events may all arrive before the other's:
	// a lateness longer than the trace lets the judge order them.
	cfg.Judge.AllowedLateness = time.Minute
	a := startAggregator(t, cfg)
	tr, want := knownTrace()
	producers := map[uint16]*pipeline.Producer{1: newProducer(t, a.Brokers()), 2: newProducer(t, a.Brokers())}
	tr.emit(t, producers)
	for _, p := range producers {
		closeProducer(t, p)
	}
	testenv.WaitFor(t, 30*time.Second, "every event consumed", func() bool {
		return getReport(t, a, false).Events >= int64(len(tr.events))
	})
	r := getReport(t, a, true)
	if r.Events != int64(len(tr.events)) || r.Judged != r.Events || r.Late != 0 || r.Buffered != 0 {
		t.Errorf("events, judged, late, buffered: got %d, %d, %d, %d; want %d, %d, 0, 0",
			r.Events, r.Judged, r.Late, r.Buffered, len(tr.events), len(tr.events))
	}
	got := judge.DecisionTally{Decisions: r.Enforced.Decisions, WronglyAllowed: r.Enforced.WronglyAllowed, WronglyLimited: r.Enforced.WronglyLimited}
	if got != want {
		t.Errorf("enforced: got %+v, want %+v", got, want)
	}
	if r.Shadow.WronglyAllowed != 1 || r.Fallback.WronglyAllowed != 1 {
		t.Errorf("shadow, fallback wrongly allowed: got %d, %d, want 1, 1", r.Shadow.WronglyAllowed, r.Fallback.WronglyAllowed)
	}
	if r.FalseNegativeKeys != 4 || r.FalsePositiveKeys != 2 {
		t.Errorf("false negative, positive keys: got %d, %d, want 4, 2", r.FalseNegativeKeys, r.FalsePositiveKeys)
	}
	if len(r.TopFalseNegatives) == 0 || r.TopFalseNegatives[0].KeyHash != "0000000000000006" || r.TopFalseNegatives[0].Ratio != 2.4 {
		t.Errorf("worst false negative: got %+v, want key 6 at 12/5 = 2.4", r.TopFalseNegatives)
	}
	var byEdge, wantByEdge [2]int64
	for _, b := range r.ByEdge {
		if b.Name == "1" || b.Name == "2" {
			byEdge[b.Name[0]-'1'] = b.Enforced.Decisions + b.Shadow.Decisions + b.Fallback.Decisions
		}
	}
	for _, e := range tr.events {
		wantByEdge[e.Edge-1]++
	}
	if byEdge != wantByEdge || len(r.ByEdge) != 2 {
		t.Errorf("decisions by edge: got %v (%d rows), want %v", byEdge, len(r.ByEdge), wantByEdge)
	}

	problems, err := testutil.GatherAndLint(a.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	resp, err := http.Get("http://" + a.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var body strings.Builder
	_, _ = io.Copy(&body, resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf(`poplimit_aggregator_decisions_total{class="enforced",edge="1",mode="async",rule="login",source="limiter",verdict="wrongly_limited"} %d`, 1),
		"poplimit_aggregator_overshoot_ratio_bucket",
		"poplimit_pipeline_consumer_lag_messages",
		fmt.Sprintf("poplimit_pipeline_events_consumed_total %d", len(tr.events)),
	} {
		if !strings.Contains(body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// frameOf returns a frame of the one event e, numbered seq, laid out as
// pipeline/FORMAT.md says (what a Producer writes), so that a test can send
// one frame twice as a retried write does.
func frameOf(e *event.Event, seq uint64) ([]byte, error) {
	b := []byte{0x80 | pipeline.FrameVersion}
	b = binary.BigEndian.AppendUint16(b, e.Edge)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.AppendUvarint(b, uint64(event.EncodedLen(e)))
	return event.Append(b, e)
}

// TestCopiesJudgedOnce writes every event of the known trace twice, as
// copies arrive: half as a single-event message sent twice (a producer
// from before frames), which the judge's fingerprint drops, and half as a
// frame sent twice with its identity (a retried write), which the
// consumer drops before the judge. Each event is judged once, and the
// verdicts are the known ones.
func TestCopiesJudgedOnce(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Judge.AllowedLateness = time.Minute
	cfg.Judge.Dedup = 1 << 12
	a := startAggregator(t, cfg)
	tr, want := knownTrace()
	evs := slices.Clone(tr.events)
	slices.SortStableFunc(evs, func(a, b event.Event) int { return int(a.Time - b.Time) })
	w := &kafka.Writer{Addr: kafka.TCP(a.Brokers()...), Topic: topic, Balancer: &kafka.Hash{},
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne}
	defer w.Close()
	var msgs []kafka.Message
	seq := map[uint16]uint64{}
	singles, frames := 0, 0
	for i := range evs {
		e := &evs[i]
		var v []byte
		var err error
		if i%2 == 0 {
			v, err = event.Append(nil, e)
			singles++
		} else {
			seq[e.Edge]++
			v, err = frameOf(e, seq[e.Edge])
			frames++
		}
		if err != nil {
			t.Fatal(err)
		}
		key := []byte(fmt.Sprint(e.KeyHash)) // one partition per key: its events in order
		msgs = append(msgs, kafka.Message{Key: key, Value: v}, kafka.Message{Key: key, Value: v})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	n := int64(len(evs))
	testenv.WaitFor(t, 30*time.Second, "every event and copy consumed", func() bool {
		r := getReport(t, a, false)
		dupFrames := testenv.MetricSum(t, a.reg, "poplimit_pipeline_duplicate_frames_total")
		return r.Events+r.Duplicates+int64(dupFrames) >= 2*n
	})
	r := getReport(t, a, true)
	dupFrames := testenv.MetricSum(t, a.reg, "poplimit_pipeline_duplicate_frames_total")
	got := judge.DecisionTally{Decisions: r.Enforced.Decisions, WronglyAllowed: r.Enforced.WronglyAllowed, WronglyLimited: r.Enforced.WronglyLimited}
	if r.Events != n || r.Duplicates != int64(singles) || int(dupFrames) != frames || got != want {
		t.Errorf("events %d, copies dropped by the judge %d and by the consumer %v, enforced %+v; want %d, %d, %d, %+v",
			r.Events, r.Duplicates, dupFrames, got, n, singles, frames, want)
	}
}

// idOf identifies an event of the restart trace.
type idOf struct {
	edge uint16
	key  uint64
	time int64
}

// TestRestartExactlyOnce stops an aggregator gracefully in the middle of a
// stream and starts another in the same group, on a broker that outlives
// both (as a real cluster does): every event produced is judged exactly
// once across the two.
func TestRestartExactlyOnce(t *testing.T) {
	t.Parallel()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	cfg := testConfig(t)
	cfg.Brokers = broker.ListenAddrs()
	cfg.IdleFlush = 200 * time.Millisecond

	// 200 keys × 30 decisions from two edges over 30 s of event time.
	tr := newTrace()
	for k := range uint64(200) {
		tr.add(int64(k), 30, 1000, k+1, event.Admission(k%3/2), nil)
	}
	slices.SortStableFunc(tr.events, func(a, b event.Event) int { return int(a.Time - b.Time) })
	n := len(tr.events)

	var mu sync.Mutex
	seen := map[idOf]int{}
	var applied [2]int
	observe := func(i int) func([]event.Event) {
		return func(batch []event.Event) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range batch {
				seen[idOf{e.Edge, e.KeyHash, e.Time}]++
			}
			applied[i] += len(batch)
		}
	}
	cfg.onApply = observe(0)
	first := startAggregator(t, cfg)

	// The stream: both edges emit in time order, 100 events every 40 ms,
	// once the first aggregator has joined its group and judged the first.
	producers := map[uint16]*pipeline.Producer{1: newProducer(t, cfg.Brokers), 2: newProducer(t, cfg.Brokers)}
	emit := func(chunk []event.Event) {
		for j := range chunk {
			if !producers[chunk[j].Edge].Emit(&chunk[j]) {
				t.Errorf("Emit: got false, want true")
			}
		}
	}
	emit(tr.events[:1])
	testenv.WaitFor(t, 30*time.Second, "the first aggregator to join", func() bool { return getReport(t, first, false).Events >= 1 })
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		for i := 1; i < n; i += 100 {
			emit(tr.events[i:min(i+100, n)])
			time.Sleep(40 * time.Millisecond)
		}
	}()

	testenv.WaitFor(t, 30*time.Second, "the first aggregator to judge a quarter", func() bool {
		return getReport(t, first, false).Events >= int64(n/4)
	})
	stopAggregator(t, first)
	r1 := first.judge.Report()

	cfg.onApply = observe(1)
	second := startAggregator(t, cfg)
	<-streamed
	for _, p := range producers {
		closeProducer(t, p) // every event delivered, or the test fails here
	}
	// The producers are at-least-once: a frame retried after a timeout is
	// in the log twice, and the consumers drop the copy. What the
	// aggregators must judge exactly once is every distinct frame's events.
	logged := testenv.TopicEvents(t, cfg.Brokers[0], topic, 4)
	if logged < int64(n) {
		t.Fatalf("events in the topic: got %d, want at least the %d produced", logged, n)
	}
	testenv.WaitFor(t, 30*time.Second, "the second aggregator to take the rest", func() bool {
		return r1.Events+getReport(t, second, false).Events >= logged
	})
	// A frame logged twice is applied, and dropped, before the group
	// commits past it: once the group has committed the whole log, no
	// copy is left to arrive.
	testenv.WaitCommitted(t, 30*time.Second, cfg.Brokers[0], topic, cfg.Consumer.GroupID, 4)
	stopAggregator(t, second)
	r2 := second.judge.Report()

	t.Logf("first aggregator: %d events (%d judged, %d late); second: %d (%d judged, %d late); produced %d, in the log %d",
		r1.Events, r1.Judged, r1.Late, r2.Events, r2.Judged, r2.Late, n, logged)
	if r1.Events == 0 || r1.Events >= logged || r2.Events == 0 {
		t.Errorf("events per aggregator: got %d and %d, want both some of %d", r1.Events, r2.Events, logged)
	}
	if got := r1.Events + r2.Events; got != logged {
		t.Errorf("events across the restart: got %d + %d = %d, want the %d in the log", r1.Events, r2.Events, got, logged)
	}
	for i, r := range []judge.Report{r1, r2} {
		if r.Buffered != 0 || r.Judged+r.Late+r.Invalid != r.Events {
			t.Errorf("aggregator %d after Shutdown: got %d buffered, %d judged + %d late + %d invalid of %d events; "+
				"want nothing buffered, all accounted for", i+1, r.Buffered, r.Judged, r.Late, r.Invalid, r.Events)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	missing, total := 0, 0
	for _, e := range tr.events {
		if seen[idOf{e.Edge, e.KeyHash, e.Time}] == 0 {
			missing++
		}
	}
	for _, c := range seen {
		total += c
	}
	if missing != 0 || int64(total) != logged {
		t.Errorf("of %d events produced: got %d missing and %d applied, want 0 and the %d in the log", n, missing, total, logged)
	}
	if dup := logged - int64(n); dup > 0 {
		t.Logf("the producers wrote %d events twice (retries); each copy was judged once", dup)
	}
	if int64(applied[0]) != r1.Events || int64(applied[1]) != r2.Events {
		t.Errorf("applied: got %v, want the reports' %d and %d", applied, r1.Events, r2.Events)
	}
}

// TestEmbeddedDataDir restarts an aggregator whose embedded broker keeps its
// state in a directory: the new one resumes from the committed offsets.
func TestEmbeddedDataDir(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Embedded = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg.EmbeddedDataDir = t.TempDir()
	cfg.IdleFlush = 100 * time.Millisecond

	tr := newTrace()
	for k := range uint64(20) {
		tr.add(0, 25, 100, k+1, event.Allowed, nil)
	}
	half := len(tr.events) / 2

	first := startAggregator(t, cfg)
	p := newProducer(t, first.Brokers())
	for i := range tr.events[:half] {
		p.Emit(&tr.events[i])
	}
	closeProducer(t, p)
	testenv.WaitFor(t, 30*time.Second, "the first half judged", func() bool { return getReport(t, first, false).Events >= int64(half) })
	stopAggregator(t, first)

	second := startAggregator(t, cfg)
	p = newProducer(t, second.Brokers())
	for i := range tr.events[half:] {
		p.Emit(&tr.events[half+i])
	}
	closeProducer(t, p)
	rest := int64(len(tr.events) - half)
	testenv.WaitFor(t, 30*time.Second, "the second half judged", func() bool { return getReport(t, second, false).Events >= rest })
	// Had the first half not been committed, the second aggregator would
	// replay it before committing the log's end.
	testenv.WaitCommitted(t, 30*time.Second, second.Brokers()[0], topic, cfg.Consumer.GroupID, cfg.Partitions)
	if got := getReport(t, second, false).Events; got != rest {
		t.Errorf("events after the restart: got %d, want %d (the first half was committed)", got, rest)
	}
}
