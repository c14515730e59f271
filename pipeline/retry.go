package pipeline

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// retryBuffer keeps whole frames of failed writes, oldest first, to be sent
// again once the broker answers: at most limit events, and only frames
// younger than maxAge. A frame keeps its bytes, sequence number included,
// so a copy that reaches the topic twice is recognised by consumers. It is
// safe for concurrent use: kafka-go's goroutines keep, the writer goroutine
// takes.
type retryBuffer struct {
	limit  int           // events
	maxAge time.Duration // by when the producer opened the frame

	mu     sync.Mutex
	frames []frame
	events int // in frames
}

// keep adds f to the buffer if it has room for its events and f is young
// enough, and reports whether it did. The frame's bytes are never modified
// once sealed, so they are kept as they are, or copied to their length when
// they take little of a frame buffer.
func (r *retryBuffer) keep(f *frame, m *producerMetrics) bool {
	if f.time != 0 && time.Unix(0, f.time).Before(time.Now().Add(-r.maxAge)) {
		return false // too old to be worth another round: it fails
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.events+f.events > r.limit {
		return false
	}
	v := f.value
	if cap(v) > 2*len(v) { // a frame buffer little of which is used
		v = slices.Clone(v)
	}
	r.frames = append(r.frames, frame{value: v, events: f.events, partition: f.partition, time: f.time})
	r.events += f.events
	m.retried.Add(float64(f.events))
	m.retryLen.Set(float64(r.events))
	return true
}

// take returns the oldest kept frames, as many as hold at most maxEvents
// events but at least one frame, and forgets them.
func (r *retryBuffer) take(maxEvents int, m *producerMetrics) []frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.frames) == 0 {
		return nil
	}
	n, events := 1, r.frames[0].events
	for n < len(r.frames) && events+r.frames[n].events <= maxEvents {
		events += r.frames[n].events
		n++
	}
	// The front of the buffer, capped so that keep's appends to the rest
	// cannot reach it: no copy, and the buffer is dropped once empty.
	fs := r.frames[:n:n]
	r.frames = r.frames[n:]
	if len(r.frames) == 0 {
		r.frames = nil
	}
	r.events -= events
	m.retryLen.Set(float64(r.events))
	return fs
}

// drain forgets every kept frame and returns their events.
func (r *retryBuffer) drain(m *producerMetrics) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.events
	r.frames, r.events = nil, 0
	m.retryLen.Set(0)
	return n
}

// awaitBroker pauses the goroutine while the broker fails: it probes it,
// waiting WriteBackoffMin, doubling up to WriteBackoffMax, between probes,
// and returns true once one succeeds, or false when Close is called. The
// probe is an ApiVersions request, or, while the topic's partition count
// is not known, the metadata lookup that learns it.
func (p *Producer) awaitBroker() bool {
	p.m.paused.Set(1)
	defer p.m.paused.Set(0)
	p.m.pauses.Inc()
	wait := p.cfg.WriteBackoffMin
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return false
		case <-t.C:
		}
		if p.probeBroker() {
			p.failing.Store(false)
			return true
		}
		wait = min(2*wait, p.cfg.WriteBackoffMax)
		t.Reset(wait)
	}
}

func (p *Producer) probeBroker() bool {
	if p.framer.parts == 0 {
		return p.refreshPartitions()
	}
	ctx, cancel := context.WithTimeout(p.runCtx, p.cfg.WriteTimeout)
	defer cancel()
	// Not a metadata request: the transport answers those from its cache.
	// ApiVersions goes to a broker every time.
	res, err := p.probe.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
	return err == nil && res.Error == nil
}
