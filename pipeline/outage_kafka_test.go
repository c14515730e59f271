package pipeline_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
)

// These tests run a real Kafka-protocol broker, franz-go's kfake, on
// loopback ports they pick themselves.

// TestBrokerOutage stops the broker under a running producer, checks that
// Emit keeps answering from the queue alone, that the producer pauses and
// keeps the events of its failed writes, and that only what the full queue
// refused is lost (and counted); then starts a new broker on the same port and checks that the
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

	e := event.Event{Time: time.Now().UnixNano(), Rule: []byte("api"), Limit: 10, WindowMillis: 1000}
	for i := range 100 {
		e.KeyHash = uint64(i)
		p.Emit(&e)
	}
	testenv.WaitFor(t, 10*time.Second, "the first events delivered", func() bool {
		return producerOutcomes(t, reg).delivered == 100
	})

	broker.Close()
	// Emit in a tight loop while the writer fails, until the full queue
	// has refused 1,000 events: Emit touches only the queue, so it keeps
	// answering (refusing, once the queue is full) however the writer
	// fares, and every refusal is counted. The bound on the slowest call
	// guards against a hang: a call that waited for the network would
	// take the 3 s write timeout. (Emit's speed is BenchmarkEmit's.)
	var calls, refused int
	var slowest time.Duration
	deadline := time.Now().Add(30 * time.Second)
	for refused < 1000 && time.Now().Before(deadline) {
		t0 := time.Now()
		e.KeyHash++
		if !p.Emit(&e) {
			refused++
		}
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
		calls++
	}
	t.Logf("broker down: %d Emit calls, %d refused, slowest %v", calls, refused, slowest)
	if refused < 1000 {
		t.Fatalf("broker down: %d of %d Emit calls refused in 30 s, want the full queue to refuse 1000", refused, calls)
	}
	if slowest > time.Second {
		t.Errorf("slowest Emit while the broker is down: got %v, want no wait for the network (its timeout is 3 s)", slowest)
	}
	if got := testenv.MetricSum(t, reg, "poplimit_pipeline_events_dropped_total", "reason", "queue_full"); got != float64(refused) {
		t.Errorf("dropped (queue full) while the broker is down: got %v, want the %d refused", got, refused)
	}
	testenv.WaitFor(t, 10*time.Second, "the producer paused, holding its failed writes", func() bool {
		return testenv.MetricSum(t, reg, "poplimit_pipeline_paused") == 1 && testenv.MetricSum(t, reg, "poplimit_pipeline_events_retried_total") > 0
	})
	down := producerOutcomes(t, reg)
	t.Logf("while down: %+v", down)

	// A new broker on the same port: the producer recovers by itself.
	broker2, _ := startBroker(t, port, "events")
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
	readToEnd(t, broker2, "events", cs)
	_ = cs.stop()
	var got []event.Event
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

// TestBrokerUnreachable checks that nothing waits when no broker listens:
// writes fail at once, are counted, and Close returns promptly.
func TestBrokerUnreachable(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens
	p, reg := newProducer(t, fastProducerConfig(addr, "events"))
	e := event.Event{Rule: []byte("api")}
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
// writes are kept to be sent again only if they were framed less than
// RetryFor ago; older ones fail at once, counted. The events' own times do
// not count: a century-old stamp in a recent frame is kept.
func TestRetryOnlyRecentEvents(t *testing.T) {
	tests := []struct {
		name     string
		retryFor time.Duration
		age      time.Duration // of the events' Time
		kept     bool
	}{
		{"framed within RetryFor", time.Minute, 0, true},
		{"framed within RetryFor, events stamped a century ago", time.Minute, 100 * 365 * 24 * time.Hour, true},
		{"framed longer ago than RetryFor", time.Nanosecond, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			broker, addr := startBroker(t, 0, "events")
			cfg := fastProducerConfig(addr, "events")
			cfg.RetryFor = tt.retryFor
			p, reg := newProducer(t, cfg)
			// One event delivered: the producer knows the topic's partitions.
			p.Emit(&event.Event{Rule: []byte("warm-up")})
			testenv.WaitFor(t, 10*time.Second, "the first event delivered", func() bool {
				return producerOutcomes(t, reg).delivered == 1
			})
			broker.Close()
			e := event.Event{Rule: []byte("api")}
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
