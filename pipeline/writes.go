package pipeline

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// writeCall is one WriteMessages call, of one message per frame. Each frame
// is counted once: by complete, or by abandon when WriteMessages failed
// before kafka-go took the messages (or, in sync mode, stopped waiting for
// them).
type writeCall struct {
	start  time.Time
	frames []frame

	// mu protects the fields below and the frames' settled flags.
	mu       sync.Mutex
	settled  int  // frames counted
	finished bool // every frame counted; later completions are ignored
}

// send hands frames, as one call, to the writer, which holds them until
// their batches complete. It copies frames, which the caller may reuse.
func (p *Producer) send(frames []frame) {
	call := &writeCall{start: time.Now(), frames: append([]frame(nil), frames...)}
	msgs := p.msgs[:0]
	events := 0
	for i := range call.frames {
		f := &call.frames[i]
		f.call, f.settled = call, false
		events += f.events
		m := kafka.Message{Value: f.value, WriterData: f}
		if f.time != 0 { // else kafka-go stamps the write time
			m.Time = time.Unix(0, f.time)
		}
		msgs = append(msgs, m)
	}
	p.inflight.Add(int64(events))
	p.writes.Add(1)
	timeout := p.cfg.WriteTimeout // Async: only the metadata lookup waits
	if !p.cfg.Async {
		timeout = p.syncBudget
	}
	ctx, cancel := context.WithTimeout(p.runCtx, timeout)
	err := p.w.WriteMessages(ctx, msgs...)
	cancel()
	var werrs kafka.WriteErrors
	if err != nil && !errors.As(err, &werrs) {
		// kafka-go failed before it took the messages (metadata, closed
		// writer), or stopped waiting for them: complete has not counted
		// some of them, and now will not.
		p.abandon(call)
	}
	clear(msgs)
	p.msgs = msgs[:0]
}

// complete is the writer's Completion callback, called from kafka-go's
// goroutines: it counts the outcome of one partition batch, which may hold
// frames of several calls.
func (p *Producer) complete(msgs []kafka.Message, err error) {
	if len(msgs) == 0 {
		return
	}
	if f, ok := msgs[0].WriterData.(*frame); ok {
		p.m.latency.Observe(time.Since(f.call.start).Seconds())
	}
	if err != nil && !p.aborted.Load() {
		p.failing.Store(true) // before finish, which wakes the goroutine to pause
	}
	for i := range msgs {
		if f, ok := msgs[i].WriterData.(*frame); ok {
			p.settle(f, err)
		}
	}
}

// settle counts the outcome of f, once.
func (p *Producer) settle(f *frame, err error) {
	call := f.call
	call.mu.Lock()
	if call.finished || f.settled {
		call.mu.Unlock()
		return
	}
	f.settled = true
	call.settled++
	call.finished = call.settled == len(call.frames)
	finished := call.finished
	call.mu.Unlock()

	p.outcome(f, err, err != nil, true)
	if finished {
		p.finish()
	}
}

// outcome counts f delivered (err nil) or failed, or, when retry is set and
// the producer is not closing, keeps it to be sent again if the retry
// buffer takes it. With done set, kafka-go no longer holds f (its write
// completed), so a frame that ends here lends its buffer to frames to come.
func (p *Producer) outcome(f *frame, err error, retry, done bool) {
	if retry && !p.closing.Load() && !p.aborted.Load() && p.retry.keep(f, &p.m) {
		p.inflight.Add(-int64(f.events))
		return
	}
	if err == nil {
		p.m.framesDelivered.Inc()
	}
	p.count(f.events, err)
	if done {
		p.framer.recycle(f.value)
	}
}

// abandon counts every frame of call not yet settled as failed, or keeps
// them all to be sent again when none was settled.
func (p *Producer) abandon(call *writeCall) {
	call.mu.Lock()
	if call.finished {
		call.mu.Unlock()
		return
	}
	call.finished = true
	untouched := call.settled == 0
	for i := range call.frames {
		if f := &call.frames[i]; !f.settled {
			f.settled, f.abandoned = true, true
		}
	}
	call.mu.Unlock()

	// Nothing of the call was written when none was settled (the broker's
	// metadata could not be had): all of it can be sent again. Otherwise
	// kafka-go may still write the rest, which must not be sent twice.
	// Once finished, no completion reads the flags: no lock is needed.
	for i := range call.frames {
		if f := &call.frames[i]; f.abandoned {
			p.outcome(f, ErrClosed, untouched, false)
		}
	}
	if untouched && !p.closing.Load() && !p.aborted.Load() {
		p.failing.Store(true)
	}
	p.finish()
}

func (p *Producer) count(n int, err error) {
	if n == 0 {
		return
	}
	p.inflight.Add(-int64(n))
	switch {
	case err == nil:
		p.m.delivered.Add(float64(n))
	case p.aborted.Load():
		p.m.failedClosed.Add(float64(n))
	default:
		p.m.failedWrite.Add(float64(n))
	}
}

// finish records that a write has every outcome and wakes the goroutine
// when that matters: it may wait for room (there was none), or it must
// pause (a write failed), or Close waits for the last writes.
func (p *Producer) finish() {
	if p.writes.Add(-1) < int64(p.cfg.MaxWritesInFlight-1) && !p.failing.Load() && !p.closing.Load() {
		return
	}
	select {
	case p.progress <- struct{}{}:
	default:
	}
}
