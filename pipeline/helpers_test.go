package pipeline_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/policy"
)

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
	events []event.Event
	onAdd  func(total int) error // optional: called after each batch, under mu
}

func (c *collector) apply(batch []event.Event) error {
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

func (c *collector) snapshot() []event.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event.Event(nil), c.events...)
}

// consumer runs a Consumer in the background; stop closes it and returns
// Run's error.
type consumer struct {
	c    *pipeline.Consumer
	reg  *prometheus.Registry
	err  chan error
	stop func() error
}

func startConsumer(t testing.TB, cfg pipeline.ConsumerConfig, apply func([]event.Event) error) *consumer {
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
func testEvents(edge uint16, keys, perKey int, firstID uint32) []event.Event {
	rules := [][]byte{[]byte("api"), []byte("login"), []byte("search-" + strings.Repeat("x", 40))}
	evs := make([]event.Event, 0, keys*perKey)
	id := firstID
	for s := range perKey {
		for k := range keys {
			evs = append(evs, event.Event{
				Time:           1_700_000_000_000_000_000 + int64(s)*1_000_000 + int64(k),
				Edge:           edge,
				Rule:           rules[k%len(rules)],
				KeyHash:        uint64(k)*0x9e3779b97f4a7c15 + 1,
				Cost:           id,
				Limit:          uint32(100 + k),
				WindowMillis:   60_000,
				Estimate:       float32(s) + 0.5,
				Decision:       event.Admission(s % 2),
				Mode:           policy.Mode(k % 2),
				Action:         policy.Action((s + k) % 2),
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
func checkExactlyOnce(t *testing.T, got, want []event.Event) {
	t.Helper()
	byID := make(map[uint32]*event.Event, len(want))
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
		if !eventtest.Equal(e, w) && bad < 5 {
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

// roundTrip sends evs through a producer to the broker at addr, topic
// "events", closes it, then runs a consumer until it has applied them all
// and closes it; both register their metrics with reg (nil: none).
func roundTrip(t *testing.T, addr string, reg prometheus.Registerer, evs []event.Event) {
	t.Helper()
	p, err := pipeline.NewProducer(fastProducerConfig(addr, "events"), reg)
	if err != nil {
		t.Fatal(err)
	}
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
}

// readToEnd waits until the consumer cs has handed to apply every message
// that broker holds on topic: each partition holding any reports, at the
// last message cs consumed from it, no lag behind its high watermark. The
// producers must be done: then a duplicate the topic holds has been read,
// the explicit signal a test of exactly-once delivery waits for.
func readToEnd(t testing.TB, broker *kfake.Cluster, topic string, cs *consumer) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "the consumer at the end of every partition", func() bool {
		held := 0
		for _, p := range broker.PartitionInfos(topic) {
			if p.HighWatermark <= p.LogStartOffset {
				continue // empty
			}
			held++
			if lag, ok := consumerLag(t, cs.reg, p.Partition); !ok || lag != 0 {
				return false
			}
		}
		if held == 0 {
			t.Fatalf("readToEnd: the broker holds no message on %s", topic)
		}
		return true
	})
}

// consumerLag is the consumer_lag_messages gauge of partition p, and
// whether it is set (a message of p was consumed).
func consumerLag(t testing.TB, g prometheus.Gatherer, p int32) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(int(p))
	for _, mf := range mfs {
		if mf.GetName() != "poplimit_pipeline_consumer_lag_messages" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == want {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}
