package pipeline

import (
	"runtime"
	"sync"
	"testing"

	"github.com/poplimit/poplimit/event"
)

func TestEventRingSequential(t *testing.T) {
	for _, n := range []int{1, 3, 4, 1000} {
		r := newEventRing(n)
		size := 2
		for size < n {
			size <<= 1
		}
		if got := len(r.cells); got != size {
			t.Errorf("capacity of a ring of %d: got %d, want %d", n, got, size)
		}
		for lap := range 3 { // the positions wrap around the cells
			for i := range size {
				if _, ok := r.push(&event.Event{Cost: uint32(lap*size + i)}); !ok {
					t.Fatalf("ring of %d, lap %d: push %d: got full, want room", n, lap, i)
				}
			}
			if _, ok := r.push(&event.Event{}); ok {
				t.Fatalf("ring of %d, lap %d: push into a full ring: got ok, want full", n, lap)
			}
			if got := r.len(); got != size {
				t.Errorf("len of a full ring: got %d, want %d", got, size)
			}
			var e event.Event
			for i := range size {
				if !r.pop(&e) || e.Cost != uint32(lap*size+i) {
					t.Fatalf("ring of %d, lap %d: pop %d: got %d, want %d in order", n, lap, i, e.Cost, lap*size+i)
				}
			}
			if r.pop(&e) || r.len() != 0 {
				t.Fatalf("ring of %d: pop of an empty ring: got an event or len %d, want none", n, r.len())
			}
		}
	}
}

// TestEventRingConcurrent pushes from several goroutines while one pops:
// every event arrives once, and each pusher's in the order it pushed them.
func TestEventRingConcurrent(t *testing.T) {
	const pushers, each = 4, 10_000
	r := newEventRing(64) // small: many laps, and pushers that find it full
	var wg sync.WaitGroup
	for g := range pushers {
		wg.Go(func() {
			e := event.Event{Edge: uint16(g)}
			for i := range each {
				e.Cost = uint32(i)
				for {
					if _, ok := r.push(&e); ok {
						break
					}
					runtime.Gosched()
				}
			}
		})
	}
	next := make([]uint32, pushers)
	var e event.Event
	for got := 0; got < pushers*each; {
		if !r.pop(&e) {
			runtime.Gosched()
			continue
		}
		got++
		if e.Cost != next[e.Edge] {
			t.Fatalf("pusher %d: got event %d, want %d (in order, none lost)", e.Edge, e.Cost, next[e.Edge])
		}
		next[e.Edge]++
	}
	wg.Wait()
	if r.pop(&e) {
		t.Errorf("after every event: got one more, %+v", e)
	}
}

func TestEventRingAllocs(t *testing.T) {
	r := newEventRing(1024)
	e := event.Event{Rule: []byte("r")}
	var out event.Event
	if got := testing.AllocsPerRun(1000, func() {
		r.push(&e)
		r.pop(&out)
	}); got != 0 {
		t.Errorf("push and pop allocs: got %v, want 0", got)
	}
}

func BenchmarkEventRing(b *testing.B) {
	r := newEventRing(1 << 16)
	e := event.Event{Rule: []byte("api")}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // one consumer, as the writer goroutine
		defer close(done)
		var out event.Event
		for {
			select {
			case <-stop:
				return
			default:
			}
			r.pop(&out)
		}
	}()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		e := e
		for pb.Next() {
			for {
				if _, ok := r.push(&e); ok {
					break
				}
			}
		}
	})
	close(stop)
	<-done
}
