package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/pipeline"
)

// These tests run a real Kafka-protocol broker, franz-go's kfake, on
// loopback ports they pick themselves.

func TestProduceConsume(t *testing.T) {
	for _, async := range []bool{true, false} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			t.Parallel()
			broker, addr := startBroker(t, 0, "events")
			const edges, keys, perKey = 3, 40, 50
			var want []event.Event
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
			readToEnd(t, broker, "events", cs) // a duplicate in the topic has been read
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
	// A replay of the first consumer's events would come before the group
	// commits the log's end.
	testenv.WaitCommitted(t, 20*time.Second, addr, "events", "judge", partitions)
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
	broker, addr := startBroker(t, 0, "events")
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
	err = c1.Run(ctx, func(batch []event.Event) error {
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
	readToEnd(t, broker, "events", cs)
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
	garbage := [][]byte{nil, {2, 0, 0}, []byte("not an event"), append(eventtest.Encode(t, want[0]), 0)}
	for i := range want {
		msgs = append(msgs,
			kafka.Message{Key: []byte("k"), Value: eventtest.Encode(t, want[i])},
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

func TestSamplingEndToEnd(t *testing.T) {
	t.Parallel()
	broker, addr := startBroker(t, 0, "events")
	cfg := fastProducerConfig(addr, "events")
	cfg.SampleRate = 0.25
	p, reg := newProducer(t, cfg)
	all := testEvents(1, 200, 5, 0)
	// A global rule's events are never sampled out: the other PoPs'
	// limits count on them.
	globalKept := 0
	for i := range all {
		if i%50 == 0 && !pipeline.SampleKey(all[i].KeyHash, cfg.SampleRate) {
			all[i].Global = true
			globalKept++
		}
	}
	var want []event.Event
	for i := range all {
		if all[i].Global || pipeline.SampleKey(all[i].KeyHash, cfg.SampleRate) {
			want = append(want, all[i])
		}
		p.Emit(&all[i])
	}
	if globalKept == 0 {
		t.Fatal("no global event among those the sample drops: the test checks nothing of them")
	}
	closeProducer(t, p)
	o := producerOutcomes(t, reg)
	if o.delivered != float64(len(want)) || o.sampledOut != float64(len(all)-len(want)) {
		t.Errorf("outcomes: got %+v, want %d delivered and %d sampled out", o, len(want), len(all)-len(want))
	}
	if n := len(want) - globalKept; n < 150 || n > 350 { // 1000 events of 200 keys at 0.25
		t.Errorf("kept events: got %d, want about 250", n)
	}
	var col collector
	cs := startConsumer(t, fastConsumerConfig(addr, "events", "judge"), col.apply)
	testenv.WaitFor(t, 20*time.Second, "the sampled events", func() bool { return col.len() >= len(want) })
	readToEnd(t, broker, "events", cs)
	_ = cs.stop()
	checkExactlyOnce(t, col.snapshot(), want)
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	_, addr := startBroker(t, 0, "events")
	reg := prometheus.NewRegistry()
	roundTrip(t, addr, reg, testEvents(1, 3, 3, 0))
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
	apply := func(batch []event.Event) error {
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
	warm := event.Event{Rule: []byte("warm-up")}
	p.Emit(&warm)
	testenv.WaitFor(b, 20*time.Second, "the consumer to join", func() bool { return count() >= 1 })

	e := event.Event{Time: 1, Rule: []byte("api"), Limit: 100, WindowMillis: 60_000, Cost: 1}
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
