package pipeline

import (
	"math"
	"runtime"
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// idleProducer is a Producer whose writer goroutine is not running, so a
// test sees Emit alone (testing.AllocsPerRun counts every goroutine's
// allocations). Its broker address is never dialled.
func idleProducer(t testing.TB, mod func(*ProducerConfig)) *Producer {
	t.Helper()
	cfg := DefaultProducerConfig()
	cfg.Brokers = []string{"127.0.0.1:9"}
	cfg.Topic = "events"
	if mod != nil {
		mod(&cfg)
	}
	p, err := newProducer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.trCancel)
	return p
}

func TestEmitAllocs(t *testing.T) {
	p := idleProducer(t, func(c *ProducerConfig) { c.QueueSize = 4096; c.SampleRate = 0.5 })
	kept, dropped := event.Event{Rule: []byte("r")}, event.Event{Rule: []byte("r")}
	for kept.KeyHash = 1; !SampleKey(kept.KeyHash, 0.5); kept.KeyHash++ {
	}
	for dropped.KeyHash = 1; SampleKey(dropped.KeyHash, 0.5); dropped.KeyHash++ {
	}
	tests := []struct {
		name string
		e    *event.Event
		want bool
	}{
		{"queued", &kept, true},
		{"sampled out", &dropped, false},
		{"invalid", &event.Event{Decision: 7}, false},
	}
	for _, tt := range tests {
		var ok bool
		if got := testing.AllocsPerRun(1000, func() { ok = p.Emit(tt.e) }); got != 0 {
			t.Errorf("%s: Emit allocs: got %v, want 0", tt.name, got)
		}
		if ok != tt.want {
			t.Errorf("%s: Emit: got %v, want %v", tt.name, ok, tt.want)
		}
	}
	for p.Emit(&kept) { // fill the queue
	}
	if got := testing.AllocsPerRun(1000, func() { p.Emit(&kept) }); got != 0 {
		t.Errorf("queue full: Emit allocs: got %v, want 0", got)
	}
	if got, want := p.queue.len(), len(p.queue.cells); got != want {
		t.Errorf("queue length: got %d, want %d (full)", got, want)
	}
	if got := testutil.ToFloat64(p.m.droppedFull); got < 1000 {
		t.Errorf("dropped (queue full): got %v, want >= 1000", got)
	}
}

func TestEmitCopiesEvent(t *testing.T) {
	p := idleProducer(t, nil)
	e := event.Event{KeyHash: 1, Limit: 10, Rule: []byte("r")}
	if !p.Emit(&e) {
		t.Fatal("Emit: got false, want true")
	}
	e.Limit = 99
	var got event.Event
	if !p.queue.pop(&got) {
		t.Fatal("queue: got nothing, want the event")
	}
	if got := got.Limit; got != 10 {
		t.Errorf("queued Limit after the caller changed its event: got %d, want 10", got)
	}
}

func TestEmitAfterClose(t *testing.T) {
	p := idleProducer(t, nil)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if p.Emit(&event.Event{}) {
		t.Error("Emit after Close: got true, want false")
	}
	if got := testutil.ToFloat64(p.m.droppedClosed); got != 1 {
		t.Errorf("dropped (closed): got %v, want 1", got)
	}
}

func TestSampleKey(t *testing.T) {
	tests := []struct {
		rate float64
		want float64 // kept fraction
	}{
		{1, 1}, {0.5, 0.5}, {0.1, 0.1}, {0.01, 0.01}, {0, 0}, {math.NaN(), 0},
	}
	const n = 200_000
	for _, tt := range tests {
		kept := 0
		for k := uint64(0); k < n; k++ { // consecutive hashes: the mix must spread them
			if SampleKey(k, tt.rate) {
				kept++
			}
		}
		got := float64(kept) / n
		if math.Abs(got-tt.want) > 0.01 {
			t.Errorf("SampleKey at rate %v: kept fraction got %.4f, want %.4f ± 0.01", tt.rate, got, tt.want)
		}
	}
	// The producer decides exactly as SampleKey does.
	p := idleProducer(t, func(c *ProducerConfig) { c.SampleRate = 0.3; c.QueueSize = 10_000 })
	for k := uint64(0); k < 10_000; k++ {
		if got, want := p.Emit(&event.Event{KeyHash: k}), SampleKey(k, 0.3); got != want {
			t.Fatalf("Emit of key %d at rate 0.3: got %v, want SampleKey's %v", k, got, want)
		}
	}
}

func BenchmarkEmit(b *testing.B) {
	e := event.Event{Time: 1, KeyHash: 42, Rule: []byte("api"), Cost: 1, Limit: 100, WindowMillis: 60_000}
	b.Run("queued", func(b *testing.B) {
		p := idleProducer(b, nil)
		stop := make(chan struct{})
		defer close(stop)
		go drainQueue(p, stop) // like a writer that keeps up
		b.ReportAllocs()
		for b.Loop() {
			p.Emit(&e)
		}
	})
	b.Run("queued-parallel", func(b *testing.B) {
		p := idleProducer(b, nil)
		stop := make(chan struct{})
		defer close(stop)
		go drainQueue(p, stop)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			e := e
			for pb.Next() {
				p.Emit(&e)
			}
		})
	})
	b.Run("queue-full", func(b *testing.B) {
		p := idleProducer(b, func(c *ProducerConfig) { c.QueueSize = 2 })
		for p.Emit(&e) {
		}
		b.ReportAllocs()
		for b.Loop() {
			p.Emit(&e)
		}
	})
	b.Run("sampled-out", func(b *testing.B) {
		p := idleProducer(b, func(c *ProducerConfig) { c.SampleRate = 0.5 })
		e := e
		for e.KeyHash = 1; SampleKey(e.KeyHash, 0.5); e.KeyHash++ {
		}
		b.ReportAllocs()
		for b.Loop() {
			p.Emit(&e)
		}
	})
}

// drainQueue takes p's queue, without allocating, until stop is closed.
func drainQueue(p *Producer, stop chan struct{}) {
	var e event.Event
	for {
		select {
		case <-stop:
			return
		default:
		}
		if !p.queue.pop(&e) {
			runtime.Gosched()
		}
	}
}
