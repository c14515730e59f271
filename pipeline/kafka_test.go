package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/pipeline"
)

// These tests run a real Kafka-protocol broker, franz-go's kfake, on
// loopback ports they pick themselves.

const partitions = 4

// startBroker starts a one-broker kfake cluster with topics seeded, on port
// (0: any free port), and returns it with its address.
func startBroker(t testing.TB, port int, topics ...string) (*kfake.Cluster, string) {
	t.Helper()
	return testenv.Broker(t, port, partitions, topics...)
}

// fastProducerConfig is a producer configuration with timeouts short enough
// for tests.
func fastProducerConfig(addr, topic string) pipeline.ProducerConfig {
	c := pipeline.DefaultProducerConfig()
	c.Brokers = []string{addr}
	c.Topic = topic
	c.BatchTimeout = 5 * time.Millisecond
	c.WriteTimeout = time.Second
	c.WriteBackoffMin = 20 * time.Millisecond
	c.WriteBackoffMax = 100 * time.Millisecond
	c.MaxAttempts = 2
	c.DialTimeout = 500 * time.Millisecond
	c.MetadataTTL = 500 * time.Millisecond
	return c
}

func fastConsumerConfig(addr, topic, group string) pipeline.ConsumerConfig {
	c := pipeline.DefaultConsumerConfig()
	c.Brokers = []string{addr}
	c.Topic = topic
	c.GroupID = group
	c.MaxBatchWait = 10 * time.Millisecond
	c.MaxWait = 100 * time.Millisecond
	c.HeartbeatInterval = 500 * time.Millisecond
	c.SessionTimeout = 6 * time.Second // kfake's minimum
	c.RebalanceTimeout = 5 * time.Second
	c.JoinGroupBackoff = 100 * time.Millisecond
	c.ReadBackoffMin = 10 * time.Millisecond
	c.ReadBackoffMax = 100 * time.Millisecond
	return c
}

func newProducer(t testing.TB, cfg pipeline.ProducerConfig) (*pipeline.Producer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := pipeline.NewProducer(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Close(ctx) // tests close explicitly and check; this only stops the goroutine
	})
	return p, reg
}

func closeProducer(t testing.TB, p *pipeline.Producer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Producer.Close: got %v, want nil", err)
	}
}

// outcomes returns the producer's counters: every emitted event must end in
// exactly one of the others.
type outcomes struct {
	emitted, sampledOut, dropped, delivered, failed float64
}

func producerOutcomes(t testing.TB, g prometheus.Gatherer) outcomes {
	return outcomes{
		emitted:    testenv.MetricSum(t, g, "poplimit_pipeline_events_emitted_total"),
		sampledOut: testenv.MetricSum(t, g, "poplimit_pipeline_events_sampled_out_total"),
		dropped:    testenv.MetricSum(t, g, "poplimit_pipeline_events_dropped_total"),
		delivered:  testenv.MetricSum(t, g, "poplimit_pipeline_events_delivered_total"),
		failed:     testenv.MetricSum(t, g, "poplimit_pipeline_events_failed_total"),
	}
}

func (o outcomes) balanced() bool {
	return o.emitted == o.sampledOut+o.dropped+o.delivered+o.failed
}

// collector is an apply function that keeps copies of what it is given.
type collector struct {
	mu     sync.Mutex
	events []pipeline.Event
	onAdd  func(total int) error // optional: called after each batch, under mu
}

func (c *collector) apply(batch []pipeline.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range batch {
		e.Rule = bytes.Clone(e.Rule) // Rule is valid only during apply
		c.events = append(c.events, e)
	}
	if c.onAdd != nil {
		return c.onAdd(len(c.events))
	}
	return nil
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

func (c *collector) snapshot() []pipeline.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]pipeline.Event(nil), c.events...)
}

// consumer runs a Consumer in the background; stop closes it and returns
// Run's error.
type consumer struct {
	c    *pipeline.Consumer
	reg  *prometheus.Registry
	err  chan error
	stop func() error
}

func startConsumer(t testing.TB, cfg pipeline.ConsumerConfig, apply func([]pipeline.Event) error) *consumer {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := pipeline.NewConsumer(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	cs := &consumer{c: c, reg: reg, err: make(chan error, 1)}
	go func() { cs.err <- c.Run(context.Background(), apply) }()
	var once sync.Once
	var runErr error
	cs.stop = func() error {
		once.Do(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Consumer.Close: got %v, want nil", err)
			}
			runErr = <-cs.err
		})
		return runErr
	}
	t.Cleanup(func() { _ = cs.stop() })
	return cs
}

// testEvents returns perKey events for each of keys keys, in emission order.
// Cost holds a unique id; Time increases per key.
func testEvents(edge uint16, keys, perKey int, firstID uint32) []pipeline.Event {
	rules := [][]byte{[]byte("api"), []byte("login"), []byte("search-" + strings.Repeat("x", 40))}
	evs := make([]pipeline.Event, 0, keys*perKey)
	id := firstID
	for s := range perKey {
		for k := range keys {
			evs = append(evs, pipeline.Event{
				Time:           1_700_000_000_000_000_000 + int64(s)*1_000_000 + int64(k),
				Edge:           edge,
				Rule:           rules[k%len(rules)],
				KeyHash:        uint64(k)*0x9e3779b97f4a7c15 + 1,
				Cost:           id,
				Limit:          uint32(100 + k),
				WindowMillis:   60_000,
				Estimate:       float32(s) + 0.5,
				Decision:       pipeline.Decision(s % 2),
				Mode:           pipeline.Mode(k % 2),
				Action:         pipeline.Action((s + k) % 2),
				FromBlockCache: s%3 == 0,
				Shadow:         k%5 == 0,
				Fallback:       s%7 == 0,
			})
			id++
		}
	}
	return evs
}

// checkExactlyOnce checks that got holds every event of want exactly once,
// with every field intact, and that each (edge, key)'s events are in the
// order they were emitted.
func checkExactlyOnce(t *testing.T, got, want []pipeline.Event) {
	t.Helper()
	byID := make(map[uint32]*pipeline.Event, len(want))
	for i := range want {
		byID[want[i].Cost] = &want[i]
	}
	seen := make(map[uint32]int, len(got))
	type edgeKey struct {
		edge uint16
		key  uint64
	}
	last := map[edgeKey]int64{}
	bad := 0
	for i := range got {
		e := &got[i]
		seen[e.Cost]++
		w, ok := byID[e.Cost]
		if !ok {
			t.Errorf("unexpected event %+v", *e)
			continue
		}
		if !equalEvents(e, w) && bad < 5 {
			bad++
			t.Errorf("event %d: got %+v, want %+v", e.Cost, *e, *w)
		}
		k := edgeKey{e.Edge, e.KeyHash}
		if prev, ok := last[k]; ok && e.Time <= prev && bad < 5 {
			bad++
			t.Errorf("edge %d key %x: got time %d after %d, want increasing", e.Edge, e.KeyHash, e.Time, prev)
		}
		last[k] = e.Time
	}
	missing, dup := 0, 0
	for id := range byID {
		switch n := seen[id]; {
		case n == 0:
			missing++
		case n > 1:
			dup += n - 1
		}
	}
	if missing != 0 || dup != 0 {
		t.Errorf("of %d events: got %d missing and %d duplicates, want 0 and 0", len(want), missing, dup)
	}
}

func TestProduceConsume(t *testing.T) {
	for _, async := range []bool{true, false} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			t.Parallel()
			_, addr := startBroker(t, 0, "events")
			const edges, keys, perKey = 3, 40, 50
			var want []pipeline.Event
			var wg sync.WaitGroup
			regs := make([]*prometheus.Registry, edges)
			for edge := range edges {
				evs := testEvents(uint16(edge), keys, perKey, uint32(edge*keys*perKey))
				want = append(want, evs...)
				cfg := fastProducerConfig(addr, "events")
				cfg.Async = async
				// Delivery, not outages, is under test: a write that times
				// out on a starved machine is retried, and kafka-go has no
				// idempotent producer, so a short timeout would duplicate.
				cfg.WriteTimeout, cfg.MaxAttempts = 10*time.Second, 5
				p, reg := newProducer(t, cfg)
				regs[edge] = reg
				wg.Go(func() { // one producer per edge, emitting concurrently
					for i := range evs {
						if !p.Emit(&evs[i]) {
							t.Errorf("edge %d: Emit %d: got false, want true", edge, i)
							break
						}
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := p.Close(ctx); err != nil {
						t.Errorf("edge %d: Close: got %v, want nil", edge, err)
					}
				})
			}
			wg.Wait()
			for edge, reg := range regs {
				o := producerOutcomes(t, reg)
				if o.emitted != keys*perKey || o.delivered != keys*perKey || !o.balanced() {
					t.Errorf("edge %d outcomes: got %+v, want %d emitted and delivered", edge, o, keys*perKey)
				}
			}

			var col collector
			cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
			testenv.WaitFor(t, 20*time.Second, "every event consumed", func() bool { return col.len() >= len(want) })
			time.Sleep(200 * time.Millisecond) // room for a duplicate to show up
			if err := cs.stop(); err != nil {
				t.Errorf("Run: got %v, want nil", err)
			}
			checkExactlyOnce(t, col.snapshot(), want)
			if got := testenv.MetricSum(t, cs.reg, "poplimit_pipeline_events_consumed_total"); got != float64(len(want)) {
				t.Errorf("consumed: got %v, want %d", got, len(want))
			}
			if got := testenv.MetricSum(t, cs.reg, "poplimit_pipeline_commit_errors_total"); got != 0 {
				t.Errorf("commit errors: got %v, want 0", got)
			}
			if got := testenv.MetricSum(t, cs.reg, "poplimit_pipeline_consumer_lag_messages"); got != 0 {
				t.Errorf("lag after consuming everything: got %v, want 0", got)
			}
		})
	}
}

// TestConsumerResumes stops a consumer after it committed part of the topic
// and starts another in the same group: together they see every event once.
func TestConsumerResumes(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	want := testEvents(1, 30, 100, 0)
	p, _ := newProducer(t, fastProducerConfig(addr, "events"))
	for i := range want {
		p.Emit(&want[i])
	}
	closeProducer(t, p)

	cfg := fastConsumerConfig(addr, "events", "judge")
	cfg.MaxBatch = 100
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := collector{onAdd: func(total int) error {
		if total >= len(want)/3 {
			cancel() // stop after this batch, which Run still commits
		}
		return nil
	}}
	c1, err := pipeline.NewConsumer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Run(ctx, first.apply); err != nil {
		t.Fatalf("first Run: got %v, want nil", err)
	}
	if err := c1.Close(); err != nil {
		t.Fatalf("first Close: got %v, want nil", err)
	}
	n1 := first.len()
	if n1 < len(want)/3 || n1 >= len(want) {
		t.Fatalf("first consumer: got %d events, want between %d and %d", n1, len(want)/3, len(want)-1)
	}

	var second collector
	cs := startConsumer(t, cfg, second.apply)
	testenv.WaitFor(t, 20*time.Second, "the rest consumed", func() bool { return n1+second.len() >= len(want) })
	time.Sleep(200 * time.Millisecond)
	if err := cs.stop(); err != nil {
		t.Errorf("second Run: got %v, want nil", err)
	}
	n2 := second.len()
	t.Logf("first consumer applied %d events, second %d", n1, n2)
	if n1+n2 != len(want) {
		t.Errorf("events applied: got %d + %d = %d, want %d", n1, n2, n1+n2, len(want))
	}
	checkExactlyOnce(t, append(first.snapshot(), second.snapshot()...), want)
}

// TestApplyErrorReplays checks at-least-once: a batch that apply refused is
// not committed, and the next consumer in the group gets it again.
func TestApplyErrorReplays(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	want := testEvents(1, 10, 20, 0)
	p, _ := newProducer(t, fastProducerConfig(addr, "events"))
	for i := range want {
		p.Emit(&want[i])
	}
	closeProducer(t, p)

	cfg := fastConsumerConfig(addr, "events", "judge")
	errFull := errors.New("store full")
	refused := 0
	c1, err := pipeline.NewConsumer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c1.Run(ctx, func(batch []pipeline.Event) error {
		refused = len(batch)
		return errFull
	})
	if !errors.Is(err, errFull) {
		t.Fatalf("Run: got %v, want an error wrapping %v", err, errFull)
	}
	if err := c1.Run(context.Background(), nil); !errors.Is(err, pipeline.ErrClosed) {
		t.Errorf("second Run: got %v, want ErrClosed", err)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if refused == 0 {
		t.Fatal("apply was never called")
	}

	var col collector
	cs := startConsumer(t, cfg, col.apply)
	testenv.WaitFor(t, 20*time.Second, "every event consumed", func() bool { return col.len() >= len(want) })
	time.Sleep(200 * time.Millisecond)
	_ = cs.stop()
	checkExactlyOnce(t, col.snapshot(), want)
}

// TestDecodeErrorsSkipped writes messages that are not events between events:
// the consumer counts and skips them.
func TestDecodeErrorsSkipped(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	want := testEvents(1, 1, 10, 0)
	tr := &kafka.Transport{} // not kafka.DefaultTransport, whose goroutines live forever
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(addr), Topic: "events", Balancer: &kafka.Hash{}, Transport: tr,
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne,
	}
	var msgs []kafka.Message
	garbage := [][]byte{nil, {2, 0, 0}, []byte("not an event"), append(mustEncode(t, want[0]), 0)}
	for i := range want {
		msgs = append(msgs,
			kafka.Message{Key: []byte("k"), Value: mustEncode(t, want[i])},
			kafka.Message{Key: []byte("k"), Value: garbage[i%len(garbage)]})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "events and garbage consumed", func() bool {
		return testenv.MetricSum(t, cs.reg, "poplimit_pipeline_decode_errors_total") >= float64(len(want))
	})
	testenv.WaitFor(t, 5*time.Second, "every event consumed", func() bool { return col.len() >= len(want) })
	_ = cs.stop()
	checkExactlyOnce(t, col.snapshot(), want)
	if got := testenv.MetricSum(t, cs.reg, "poplimit_pipeline_decode_errors_total"); got != float64(len(want)) {
		t.Errorf("decode errors: got %v, want %d", got, len(want))
	}
}

// TestBrokerOutage stops the broker under a running producer, checks that
// Emit stays fast, that the producer pauses and keeps the events of its
// failed writes, and that only what the full queue refused is lost (and
// counted); then starts a new broker on the same port and checks that the
// producer resumes by itself and delivers everything it held.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	broker, addr := startBroker(t, port, "events")
	cfg := fastProducerConfig(addr, "events")
	cfg.QueueSize = 1024
	cfg.MaxWritesInFlight = 2
	cfg.WriteTimeout = 3 * time.Second // so that a network wait would show
	p, reg := newProducer(t, cfg)

	e := pipeline.Event{Time: time.Now().UnixNano(), Rule: []byte("api"), Limit: 10, WindowMillis: 1000}
	for i := range 100 {
		e.KeyHash = uint64(i)
		p.Emit(&e)
	}
	testenv.WaitFor(t, 10*time.Second, "the first events delivered", func() bool {
		return producerOutcomes(t, reg).delivered == 100
	})

	broker.Close()
	// Emit in a tight loop while the writer fails: every call must stay
	// fast, and what cannot be sent must be counted.
	var calls int
	var slowest time.Duration
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		t0 := time.Now()
		e.KeyHash++
		p.Emit(&e)
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
		calls++
	}
	elapsed := time.Since(start)
	mean := elapsed / time.Duration(calls)
	t.Logf("broker down: %d Emit calls in %v, mean %v, slowest %v", calls, elapsed, mean, slowest)
	if mean > 20*time.Microsecond {
		t.Errorf("mean Emit while the broker is down: got %v, want < 20µs", mean)
	}
	// The mean is the evidence (an Emit that waited for the writer would be
	// paced by its retries, milliseconds); the slowest call is a scheduling
	// hiccup on a loaded machine, never a network timeout (3 s).
	if slowest > time.Second {
		t.Errorf("slowest Emit while the broker is down: got %v, want < 1s", slowest)
	}
	testenv.WaitFor(t, 10*time.Second, "the producer paused, holding its failed writes", func() bool {
		return testenv.MetricSum(t, reg, "poplimit_pipeline_paused") == 1 && testenv.MetricSum(t, reg, "poplimit_pipeline_events_retried_total") > 0
	})
	down := producerOutcomes(t, reg)
	if got := testenv.MetricSum(t, reg, "poplimit_pipeline_events_dropped_total", "reason", "queue_full"); got == 0 {
		t.Errorf("dropped (queue full) while the broker is down: got 0, want > 0")
	}
	t.Logf("while down: %+v", down)

	// A new broker on the same port: the producer recovers by itself.
	broker2, _ := startBroker(t, port, "events")
	_ = broker2
	e.Edge = 1 // marks events sent after the broker came back
	recovered := down.delivered
	testenv.WaitFor(t, 15*time.Second, "deliveries after the broker returned", func() bool {
		e.KeyHash++
		p.Emit(&e)
		return producerOutcomes(t, reg).delivered > recovered+10
	})
	// What was queued or kept during the outage drains to the new broker.
	testenv.WaitFor(t, 15*time.Second, "the queue and the retry buffer to drain", func() bool {
		return testenv.MetricSum(t, reg, "poplimit_pipeline_queue_length") == 0 && testenv.MetricSum(t, reg, "poplimit_pipeline_retry_length") == 0
	})
	want := testEvents(2, 20, 10, 1_000_000)
	for i := range want {
		if !p.Emit(&want[i]) {
			t.Fatalf("Emit %d after recovery: got false, want true", i)
		}
	}
	closeProducer(t, p)
	o := producerOutcomes(t, reg)
	t.Logf("after recovery and Close: %+v", o)
	if !o.balanced() {
		t.Errorf("outcomes: got %+v, want emitted = sampled out + dropped + delivered + failed", o)
	}
	if o.failed != 0 {
		t.Errorf("%v events failed: want none, the outage carried by the queue and the retry buffer", o.failed)
	}
	t.Logf("retried %v events of failed writes; %v pauses",
		testenv.MetricSum(t, reg, "poplimit_pipeline_events_retried_total"), testenv.MetricSum(t, reg, "poplimit_pipeline_pauses_total"))

	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "the events sent after recovery", func() bool {
		n := 0
		for _, e := range col.snapshot() {
			if e.Edge == 2 {
				n++
			}
		}
		return n >= len(want)
	})
	time.Sleep(200 * time.Millisecond)
	_ = cs.stop()
	var got []pipeline.Event
	for _, e := range col.snapshot() {
		if e.Edge == 2 {
			got = append(got, e)
		}
	}
	checkExactlyOnce(t, got, want)
}

// TestConsumerSurvivesBrokerRestart keeps one Run going while the broker is
// replaced by a new one on the same port: Run does not end, and the events
// written to the new broker arrive.
func TestConsumerSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	broker, addr := startBroker(t, port, "events")
	before := testEvents(1, 5, 4, 0)
	p, _ := newProducer(t, fastProducerConfig(addr, "events"))
	for i := range before {
		p.Emit(&before[i])
	}
	closeProducer(t, p)

	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "the events before the restart", func() bool { return col.len() >= len(before) })
	broker.Close()
	time.Sleep(500 * time.Millisecond)
	startBroker(t, port, "events")

	after := testEvents(2, 5, 4, 1000)
	p2, _ := newProducer(t, fastProducerConfig(addr, "events"))
	for i := range after {
		p2.Emit(&after[i])
	}
	closeProducer(t, p2)
	testenv.WaitFor(t, 30*time.Second, "the events after the restart", func() bool { return col.len() >= len(before)+len(after) })
	select {
	case err := <-cs.err:
		t.Fatalf("Run ended during the restart: %v", err)
	default:
	}
	if err := cs.stop(); err != nil {
		t.Errorf("Run: got %v, want nil", err)
	}
	checkExactlyOnce(t, col.snapshot(), append(before, after...))
}

// blackhole accepts connections and never answers, like a broker that hangs.
func blackhole(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestCloseDeadline closes a producer whose broker hangs, with a short
// deadline: Close returns soon after it with the deadline's error, and every
// queued event is counted as failed.
func TestCloseDeadline(t *testing.T) {
	for _, async := range []bool{true, false} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			t.Parallel()
			cfg := fastProducerConfig(blackhole(t), "events")
			cfg.Async = async
			cfg.DialTimeout = 5 * time.Second // the hung handshake outlasts Close's deadline
			cfg.WriteTimeout = 5 * time.Second
			p, reg := newProducer(t, cfg)
			e := pipeline.Event{Rule: []byte("api")}
			for i := range 5000 {
				e.KeyHash = uint64(i)
				p.Emit(&e)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := p.Close(ctx)
			took := time.Since(start)
			t.Logf("Close took %v: %v", took, err)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Close: got %v, want an error wrapping context.DeadlineExceeded", err)
			}
			if took > 2*time.Second {
				t.Errorf("Close took %v, want about its 300ms deadline", took)
			}
			o := producerOutcomes(t, reg)
			if o.emitted != 5000 || o.delivered != 0 || !o.balanced() {
				t.Errorf("outcomes: got %+v, want 5000 emitted, none delivered, all accounted for", o)
			}
			if got := testenv.MetricSum(t, reg, "poplimit_pipeline_events_failed_total", "reason", "closed"); got == 0 {
				t.Errorf("failed (closed): got 0, want > 0")
			}
			if p.Emit(&e) {
				t.Error("Emit after Close: got true, want false")
			}
			if err2 := p.Close(context.Background()); err2 != err {
				t.Errorf("second Close: got %v, want the first's %v", err2, err)
			}
		})
	}
}

// TestBrokerUnreachable checks that nothing waits when no broker listens:
// writes fail at once, are counted, and Close returns promptly.
func TestBrokerUnreachable(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens
	p, reg := newProducer(t, fastProducerConfig(addr, "events"))
	e := pipeline.Event{Rule: []byte("api")}
	for i := range 5000 {
		e.KeyHash = uint64(i)
		p.Emit(&e)
	}
	closeProducer(t, p)
	o := producerOutcomes(t, reg)
	if o.emitted != 5000 || o.delivered != 0 || o.failed == 0 || !o.balanced() {
		t.Errorf("outcomes: got %+v, want 5000 emitted, none delivered, failures counted, all accounted for", o)
	}
}

// TestRetryOnlyRecentEvents: while the broker is away, the frames of failed
// writes are kept to be sent again only if they are younger than RetryFor;
// older ones fail at once, counted.
func TestRetryOnlyRecentEvents(t *testing.T) {
	tests := []struct {
		name string
		age  time.Duration
		kept bool
	}{
		{"recent", 0, true},
		{"two minutes old", 2 * time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			broker, addr := startBroker(t, 0, "events")
			cfg := fastProducerConfig(addr, "events")
			cfg.RetryFor = time.Minute
			p, reg := newProducer(t, cfg)
			// One event delivered: the producer knows the topic's partitions.
			p.Emit(&pipeline.Event{Rule: []byte("warm-up")})
			testenv.WaitFor(t, 10*time.Second, "the first event delivered", func() bool {
				return producerOutcomes(t, reg).delivered == 1
			})
			broker.Close()
			e := pipeline.Event{Rule: []byte("api")}
			for i := range 200 {
				e.KeyHash = uint64(i)
				e.Time = time.Now().Add(-tt.age).UnixNano()
				p.Emit(&e)
			}
			// The writer frames what is queued until a write fails and it
			// pauses; then nothing is in flight and the counts are final.
			testenv.WaitFor(t, 10*time.Second, "the producer paused with nothing in flight", func() bool {
				return testenv.MetricSum(t, reg, "poplimit_pipeline_paused") == 1 &&
					testenv.MetricSum(t, reg, "poplimit_pipeline_in_flight_events") == 0 &&
					testenv.MetricSum(t, reg, "poplimit_pipeline_events_failed_total")+
						testenv.MetricSum(t, reg, "poplimit_pipeline_retry_length") > 0
			})
			failed := testenv.MetricSum(t, reg, "poplimit_pipeline_events_failed_total", "reason", "write")
			kept := testenv.MetricSum(t, reg, "poplimit_pipeline_retry_length")
			t.Logf("of the events written before the pause, %v failed and %v were kept", failed, kept)
			if tt.kept && (failed != 0 || kept == 0) {
				t.Errorf("recent events: got %v failed and %v kept, want none failed and some kept", failed, kept)
			}
			if !tt.kept && (failed == 0 || kept != 0) {
				t.Errorf("old events: got %v failed and %v kept, want some failed and none kept", failed, kept)
			}
			closeProducer(t, p)
			if o := producerOutcomes(t, reg); o.emitted != 201 || o.delivered != 1 || o.failed != 200 || !o.balanced() {
				t.Errorf("outcomes %+v: want 201 emitted, 1 delivered, the rest failed by Close, all accounted for", o)
			}
		})
	}
}

// TestEmitDuringClose emits from several goroutines while Close runs: no
// event is lost uncounted, and nothing enters the queue after Close.
func TestEmitDuringClose(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	p, reg := newProducer(t, fastProducerConfig(addr, "events"))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			e := pipeline.Event{Edge: uint16(g), Rule: []byte("api")}
			<-start
			for i := range 20_000 {
				e.KeyHash = uint64(i)
				p.Emit(&e)
			}
		})
	}
	close(start)
	time.Sleep(2 * time.Millisecond)
	closeProducer(t, p)
	wg.Wait()
	o := producerOutcomes(t, reg)
	t.Logf("outcomes: %+v", o)
	if o.emitted != 4*20_000 || !o.balanced() {
		t.Errorf("outcomes: got %+v, want 80000 emitted, each counted once", o)
	}
	if got := testenv.MetricSum(t, reg, "poplimit_pipeline_queue_length"); got != 0 {
		t.Errorf("queue after Close: got %v events, want 0", got)
	}
	// What the producer counts as delivered is what the topic holds.
	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "the delivered events", func() bool { return col.len() >= int(o.delivered) })
	time.Sleep(200 * time.Millisecond)
	_ = cs.stop()
	if got := col.len(); got != int(o.delivered) {
		t.Errorf("events in the topic: got %d, want the %v counted as delivered", got, o.delivered)
	}
}

func TestSamplingEndToEnd(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	cfg := fastProducerConfig(addr, "events")
	cfg.SampleRate = 0.25
	p, reg := newProducer(t, cfg)
	all := testEvents(1, 200, 5, 0)
	var want []pipeline.Event
	for i := range all {
		if pipeline.SampleKey(all[i].KeyHash, cfg.SampleRate) {
			want = append(want, all[i])
		}
		p.Emit(&all[i])
	}
	closeProducer(t, p)
	o := producerOutcomes(t, reg)
	if o.delivered != float64(len(want)) || o.sampledOut != float64(len(all)-len(want)) {
		t.Errorf("outcomes: got %+v, want %d delivered and %d sampled out", o, len(want), len(all)-len(want))
	}
	if n := len(want); n < 150 || n > 350 { // 1000 events of 200 keys at 0.25
		t.Errorf("kept events: got %d, want about 250", n)
	}
	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "the sampled events", func() bool { return col.len() >= len(want) })
	time.Sleep(200 * time.Millisecond)
	_ = cs.stop()
	checkExactlyOnce(t, col.snapshot(), want)
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	reg := prometheus.NewRegistry()
	p, err := pipeline.NewProducer(fastProducerConfig(addr, "events"), reg)
	if err != nil {
		t.Fatal(err)
	}
	evs := testEvents(1, 3, 3, 0)
	for i := range evs {
		p.Emit(&evs[i])
	}
	closeProducer(t, p)
	c, err := pipeline.NewConsumer(fastConsumerConfig(addr, "events", "judge"), reg)
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	col.onAdd = func(total int) error {
		if total >= len(evs) {
			cancel()
		}
		return nil
	}
	if err := c.Run(ctx, col.apply); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	if got := testenv.MetricSum(t, reg, "poplimit_pipeline_batch_write_duration_seconds"); got == 0 {
		t.Error("batch write latency: got no observation, want some")
	}
	// A second producer on the same registry is refused, not a panic.
	if _, err := pipeline.NewProducer(fastProducerConfig(addr, "events"), reg); err == nil {
		t.Error("second NewProducer on one registry: got nil error, want a registration error")
	}
}

// BenchmarkEndToEnd measures events per second from Emit, through kfake, to
// a consumer group's apply, with the consumer already in its group.
func BenchmarkEndToEnd(b *testing.B) {
	for _, async := range []bool{true, false} {
		b.Run(fmt.Sprintf("async=%v", async), func(b *testing.B) { benchmarkEndToEnd(b, async) })
	}
}

func benchmarkEndToEnd(b *testing.B, async bool) {
	_, addr := startBroker(b, 0, "events")
	cfg := fastProducerConfig(addr, "events")
	cfg.Async = async
	p, reg := newProducer(b, cfg)
	var mu sync.Mutex
	n := 0
	apply := func(batch []pipeline.Event) error {
		mu.Lock()
		n += len(batch)
		mu.Unlock()
		return nil
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	startConsumer(b, fastConsumerConfig(addr, "events", "bench"), apply)
	warm := pipeline.Event{Rule: []byte("warm-up")}
	p.Emit(&warm)
	testenv.WaitFor(b, 20*time.Second, "the consumer to join", func() bool { return count() >= 1 })

	e := pipeline.Event{Time: 1, Rule: []byte("api"), Limit: 100, WindowMillis: 60_000, Cost: 1}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		e.KeyHash = uint64(i)
		for !p.Emit(&e) { // measure throughput, not drops: wait for room
			time.Sleep(50 * time.Microsecond)
		}
	}
	testenv.WaitFor(b, time.Minute, "every event consumed", func() bool { return count() >= b.N+1 })
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	if o := producerOutcomes(b, reg); o.failed != 0 {
		b.Errorf("failed events: got %v, want 0", o.failed)
	}
}

// TestCloseStopsGoroutines checks that after Close no goroutine of the
// producer, the consumer or kafka-go is left.
func TestCloseStopsGoroutines(t *testing.T) {
	_, addr := startBroker(t, 0, "events")
	p, err := pipeline.NewProducer(fastProducerConfig(addr, "events"), nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := testEvents(1, 5, 5, 0)
	for i := range evs {
		p.Emit(&evs[i])
	}
	closeProducer(t, p)
	c, err := pipeline.NewConsumer(fastConsumerConfig(addr, "events", "judge"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var col collector
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	col.onAdd = func(total int) error {
		if total >= len(evs) {
			cancel()
		}
		return nil
	}
	if err := c.Run(ctx, col.apply); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	leftover := func() []string {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var left []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "segmentio/kafka-go") || strings.Contains(g, "pipeline.(*") {
				left = append(left, g)
			}
		}
		return left
	}
	deadline := time.Now().Add(5 * time.Second)
	for left := leftover(); len(left) > 0; left = leftover() {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines after Close: got %d, want 0:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
