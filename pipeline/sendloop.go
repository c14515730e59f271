package pipeline

import (
	"context"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// run is the writer goroutine.
func (p *Producer) run() {
	defer close(p.done)
	for p.next() {
	}
	p.flush()
}

// next does one round of the writer goroutine and reports whether to go
// on: false once Close was called. It waits for room for a write (Async);
// while the broker fails it waits for it to answer, and then sends the
// frames of the failed writes before any newer ones. Otherwise it waits for
// the end of the frame interval, which the first event after an idle spell
// starts, and frames what is queued: full frames are written as they fill,
// the others when the interval ends. So the goroutine wakes about once per
// BatchTimeout, not once per event, unless the queue fills faster (Emit
// wakes it when BatchSize events are queued) or a write finishes.
func (p *Producer) next() bool {
	if p.full() {
		select {
		case <-p.progress:
			return true
		case <-p.quit:
			return false
		}
	}
	if p.failing.Load() && !p.awaitBroker() {
		return false
	}
	if fs := p.retry.take(p.cfg.BatchSize, &p.m); len(fs) > 0 {
		p.send(fs)
		return true
	}
	fr := &p.framer
	if len(fr.sealed) > 0 { // sealed while there was no room to write them
		p.sendSealed()
		return true
	}
	if !p.refreshPartitions() {
		// Events cannot be placed before the partition count is known:
		// they wait in the queue while the producer pauses.
		p.failing.Store(true)
		return true
	}
	if !p.ticking {
		if fr.openEvents == 0 && p.queue.len() == 0 {
			// Idle: the first event starts an interval. Emit wakes the
			// goroutine if it finds idle set after its push; idle is set
			// before the queue is looked at again, so no push goes
			// unnoticed.
			p.idle.Store(true)
			if p.queue.len() == 0 {
				select {
				case <-p.wake:
				case <-p.progress:
					p.idle.Store(false)
					return true
				case <-p.quit:
					return false
				}
			}
			p.idle.Store(false)
		}
		p.ticking = true
		p.timer.Reset(p.cfg.BatchTimeout)
	}
	select {
	case <-p.timer.C:
		p.ticking = false
	case <-p.wake:
	case <-p.progress:
		// A write finished: if it failed, pause now, and send its frames
		// again as soon as the broker answers.
	case <-p.quit:
		return false
	}
	p.drainQueued()
	if !p.ticking {
		fr.sealAll()
	}
	if !p.full() {
		p.sendSealed()
	}
	return true
}

// full reports whether Async mode has MaxWritesInFlight writes in flight.
func (p *Producer) full() bool {
	return p.cfg.Async && p.writes.Load() >= int64(p.cfg.MaxWritesInFlight)
}

// add frames e.
func (p *Producer) add(e *event.Event) {
	n := event.EncodedLen(e)
	if n == 0 { // unreachable: Emit checked
		p.m.droppedInvalid.Inc()
		return
	}
	p.framer.add(e, n)
}

// drain frames up to max more events, as many as are queued, and returns
// how many it framed.
func (p *Producer) drain(max int) int {
	var e event.Event
	p.framer.now = time.Now().UnixNano()
	for i := range max {
		if !p.queue.pop(&e) {
			return i
		}
		p.add(&e)
	}
	return max
}

// drainQueued frames what is queued, in rounds of BatchSize events, and
// writes the frames each round fills, while there is room for writes.
func (p *Producer) drainQueued() {
	for !p.full() {
		n := p.drain(p.cfg.BatchSize)
		p.sendSealed()
		if n < p.cfg.BatchSize {
			return
		}
	}
}

// sendSealed writes the sealed frames, if any, as one write.
func (p *Producer) sendSealed() {
	fr := &p.framer
	if len(fr.sealed) == 0 {
		return
	}
	p.send(fr.sealed)
	clear(fr.sealed)
	fr.sealed = fr.sealed[:0]
}

// refreshPartitions learns the topic's partition count when it is unknown
// or older than MetadataTTL, and reports whether one is known: an old one
// stays in use while the broker cannot be asked.
func (p *Producer) refreshPartitions() bool {
	fr := &p.framer
	now := time.Now()
	if fr.parts > 0 && now.Sub(p.partsAt) < p.cfg.MetadataTTL {
		return true
	}
	p.partsAt = now
	ctx, cancel := context.WithTimeout(p.runCtx, p.cfg.WriteTimeout)
	n, err := p.partitionCount(ctx)
	cancel()
	if err == nil && n > 0 {
		fr.setPartitions(n)
	}
	return fr.parts > 0
}

// partitionCount asks the transport, which answers from the metadata it
// caches for the topic (refreshed every MetadataTTL), as the writer does.
func (p *Producer) partitionCount(ctx context.Context) (int, error) {
	r, err := p.tr.RoundTrip(ctx, p.w.Addr, &metadataAPI.Request{TopicNames: []string{p.cfg.Topic}})
	if err != nil {
		return 0, err
	}
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name == p.cfg.Topic {
			if t.ErrorCode != 0 {
				return 0, kafka.Error(t.ErrorCode)
			}
			return len(t.Partitions), nil
		}
	}
	return 0, kafka.UnknownTopicOrPartition
}

// flush writes what is left in the retry buffer, the queue and the open
// frames after Close, until all are empty or Close's deadline passes, then
// closes the writer. Writes that fail now are not retried (closing is set).
func (p *Producer) flush() {
	ctx := p.runCtx
	fr := &p.framer
	var giveUp time.Time // for the partition count, if it is not known yet
	backoff := p.cfg.WriteBackoffMin
	// Emit can no longer add to the queue, so draining it ends.
	for ctx.Err() == nil {
		if p.full() {
			select {
			case <-p.progress:
			case <-ctx.Done():
			}
			continue
		}
		if fs := p.retry.take(p.cfg.BatchSize, &p.m); len(fs) > 0 {
			p.send(fs)
			continue
		}
		if p.queue.len() == 0 && fr.openEvents == 0 && len(fr.sealed) == 0 {
			break
		}
		if fr.parts == 0 && !p.refreshPartitions() {
			// Ask again, as a write would wait for its metadata, for
			// WriteTimeout at most; then what is left fails.
			if giveUp.IsZero() {
				giveUp = time.Now().Add(p.cfg.WriteTimeout)
			} else if time.Now().After(giveUp) {
				break
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, p.cfg.WriteBackoffMax)
			continue
		}
		p.drain(p.cfg.BatchSize)
		if p.queue.len() == 0 {
			fr.sealAll()
		}
		p.sendSealed()
	}
	n := fr.discard()
	for e := (event.Event{}); p.queue.pop(&e); {
		n++
	}
	n += p.retry.drain(&p.m)
	p.m.failedClosed.Add(float64(n))
	// Writer.Close sends kafka-go's partial batches and waits for every
	// outcome; after an abort they fail fast. It returns no error of its own
	// (only our transport's, which Close closes).
	_ = p.w.Close()
}
