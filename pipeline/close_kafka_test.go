package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
)

// These tests run a real Kafka-protocol broker, franz-go's kfake, on
// loopback ports they pick themselves.

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
			e := event.Event{Rule: []byte("api")}
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

// TestEmitDuringClose emits from several goroutines while Close runs: no
// event is lost uncounted, and nothing enters the queue after Close.
func TestEmitDuringClose(t *testing.T) {
	t.Parallel()
	broker, addr := startBroker(t, 0, "events")
	p, reg := newProducer(t, fastProducerConfig(addr, "events"))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			e := event.Event{Edge: uint16(g), Rule: []byte("api")}
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
	readToEnd(t, broker, "events", cs)
	_ = cs.stop()
	if got := col.len(); got != int(o.delivered) {
		t.Errorf("events in the topic: got %d, want the %v counted as delivered", got, o.delivered)
	}
}

// TestCloseStopsGoroutines checks that after Close no goroutine of the
// producer, the consumer or kafka-go is left.
func TestCloseStopsGoroutines(t *testing.T) {
	_, addr := startBroker(t, 0, "events")
	roundTrip(t, addr, nil, testEvents(1, 5, 5, 0))
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
