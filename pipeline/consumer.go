package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// Consumer reads events as a member of a consumer group and hands them to a
// function, committing offsets only after the function accepted them
// (at-least-once). Run and Close may be called from different goroutines.
// The zero value is not usable: build one with NewConsumer.
type Consumer struct {
	cfg ConsumerConfig
	r   *kafka.Reader
	m   consumerMetrics
	key *FrameKey // nil without ConsumerConfig.Key; used by Run's goroutine only

	stop   context.Context // done once Close is called
	cancel context.CancelFunc

	// mu protects the fields below.
	mu      sync.Mutex
	started bool          // Run was called
	runDone chan struct{} // closed when Run returns
	closed  bool

	closeOnce sync.Once
	closeErr  error
}

// NewConsumer validates cfg, registers the consumer's metrics with reg (nil:
// none) and creates the group reader. The reader joins the group in the
// background at once; nothing is fetched before Run.
func NewConsumer(cfg ConsumerConfig, reg prometheus.Registerer) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc := kafka.ReaderConfig{
		Brokers:                cfg.Brokers,
		GroupID:                cfg.GroupID,
		Topic:                  cfg.Topic,
		Dialer:                 &kafka.Dialer{ClientID: cfg.ClientID, Timeout: cfg.DialTimeout, DualStack: true, TLS: cfg.TLS, SASLMechanism: cfg.SASL},
		QueueCapacity:          cfg.QueueCapacity,
		MinBytes:               cfg.MinBytes,
		MaxBytes:               cfg.MaxBytes,
		MaxWait:                cfg.MaxWait,
		ReadBatchTimeout:       cfg.MaxWait,
		ReadLagInterval:        -1, // not available with groups; Run reports lag from the messages
		HeartbeatInterval:      cfg.HeartbeatInterval,
		CommitInterval:         0, // synchronous: commit after apply, never before
		SessionTimeout:         cfg.SessionTimeout,
		RebalanceTimeout:       cfg.RebalanceTimeout,
		JoinGroupBackoff:       cfg.JoinGroupBackoff,
		RetentionTime:          -time.Millisecond, // -1 ms asks for the broker's offsets retention
		WatchPartitionChanges:  true,              // rebalance when partitions are added
		PartitionWatchInterval: 10 * time.Second,
		StartOffset:            cfg.StartOffset,
		ReadBackoffMin:         cfg.ReadBackoffMin,
		ReadBackoffMax:         cfg.ReadBackoffMax,
		MaxAttempts:            cfg.MaxAttempts,
		GroupBalancers:         []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}},
	}
	if err := rc.Validate(); err != nil { // kafka.NewReader panics on these
		return nil, fmt.Errorf("pipeline: consumer config: %w", err)
	}
	c := &Consumer{cfg: cfg, m: newConsumerMetrics()}
	if cfg.Key != nil {
		var err error
		if c.key, err = NewFrameKey(cfg.Key); err != nil { // unreachable: Validate checked
			return nil, err
		}
	}
	if err := register(reg, c.m.collectors); err != nil {
		return nil, fmt.Errorf("pipeline: register consumer metrics: %w", err)
	}
	c.stop, c.cancel = context.WithCancel(context.Background())
	c.r = kafka.NewReader(rc)
	return c, nil
}

// Run fetches events and calls apply with them, in batches of at most
// MaxBatch, until ctx is done or Close is called; then it returns nil. It
// commits a batch's offsets only after apply returned nil for all of it, so
// a consumer that stops (or crashes) and another that takes over in the
// same group neither lose nor replay what was committed; what was applied
// but not yet committed is applied again (at-least-once), except that a
// frame this Run already read is recognised and dropped (DedupFrames).
// Each partition's events arrive in the order they were produced.
//
// A message is a frame of events or a single event (as producers before
// frames wrote, version 1 or 2). A message that does not decode is counted
// and skipped whole (its offset is committed with the batch). With a Key,
// so is every message that is not a frame signed with it for its
// partition: only events whose MAC holds reach apply. Errors of the
// group (a broker that is down) are counted and waited out: the reader
// rejoins by itself. If apply returns an error, Run returns it, wrapped,
// without committing the batch.
//
// apply must not keep batch or the Rule bytes of its events after it
// returns: Run reuses them. Copy what you keep.
//
// Run may be called once: the reader has fetched past offsets it never
// committed, so only a new Consumer resumes correctly after Run returned with
// an error. Later calls return ErrClosed.
func (c *Consumer) Run(ctx context.Context, apply func(batch []event.Event) error) error {
	c.mu.Lock()
	if c.closed || c.started {
		c.mu.Unlock()
		return ErrClosed
	}
	c.started = true
	c.runDone = make(chan struct{})
	c.mu.Unlock()
	defer close(c.runDone)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.stop, cancel)()

	var (
		msgs = make([]kafka.Message, 0, c.cfg.MaxBatch)
		evs  = make([]event.Event, 0, c.cfg.MaxBatch)
		lag  = map[int]prometheus.Gauge{}
		b    = batch{seen: newFrameSet(c.cfg.DedupFrames)}
	)
	for {
		m, err := c.r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) { // stopped or closed
				return nil
			}
			// The group could not be joined after MaxAttempts tries (the
			// broker is down, say). The reader keeps trying and then
			// resumes from the committed offsets: nothing is lost by
			// waiting for it.
			c.m.fetchErrors.Inc()
			select {
			case <-time.After(c.cfg.ReadBackoffMax):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		b.frames = 0
		msgs = append(msgs[:0], m)
		evs = c.decode(&b, evs[:0], &msgs[0])
		msgs, evs = c.fill(ctx, &b, msgs, evs)

		for i := 0; i < len(evs); i += c.cfg.MaxBatch {
			chunk := evs[i:min(i+c.cfg.MaxBatch, len(evs))]
			if err := apply(chunk); err != nil {
				c.m.applyErrors.Inc()
				return fmt.Errorf("pipeline: apply %d events: %w", len(chunk), err)
			}
			c.m.consumed.Add(float64(len(chunk)))
		}
		c.m.framesConsumed.Add(float64(b.frames))
		c.commit(ctx, msgs)
		c.observeLag(lag, msgs)
		clear(evs)
		clear(msgs)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// batch is Run's decoding state.
type batch struct {
	seen   frameSet
	frames int // frames decoded into the batch
	head   FrameHeader
}

// decode appends the events of m to evs: a frame's, unless it was read
// before, or a single event. What does not decode, or, with a key, is not
// signed with it, is counted and skipped.
func (c *Consumer) decode(b *batch, evs []event.Event, m *kafka.Message) []event.Event {
	if c.key != nil {
		switch {
		case len(m.Value) == 0 || m.Value[0] != signedFrameByte:
			c.m.refusedUnsigned.Inc()
			return evs
		case !c.key.Verify(m.Value, m.Partition):
			c.m.refusedBadMAC.Inc()
			return evs
		}
	}
	if !IsFrame(m.Value) {
		var e event.Event
		if err := event.Decode(m.Value, &e); err != nil {
			c.m.decodeErrors.Inc()
			return evs
		}
		return append(evs, e)
	}
	n := len(evs)
	evs, err := DecodeFrame(m.Value, &b.head, evs)
	if err != nil {
		c.m.decodeErrors.Inc()
		return evs
	}
	if b.seen.seen(b.head.Edge, m.Partition, b.head.Seq) {
		c.m.duplicateFrames.Inc()
		c.m.duplicateEvents.Add(float64(b.head.Count))
		clear(evs[n:])
		return evs[:n]
	}
	b.frames++
	if c.cfg.OnFrame != nil {
		c.cfg.OnFrame(m.Partition, &b.head)
	}
	if c.cfg.DedupFrames > 0 {
		for i := n; i < len(evs); i++ {
			evs[i].Framed = true
		}
	}
	return evs
}

// fill adds to msgs, and their events to evs, what arrives within
// MaxBatchWait, until evs or msgs holds MaxBatch.
func (c *Consumer) fill(ctx context.Context, b *batch, msgs []kafka.Message, evs []event.Event) ([]kafka.Message, []event.Event) {
	if len(evs) >= c.cfg.MaxBatch || len(msgs) >= c.cfg.MaxBatch {
		return msgs, evs
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.MaxBatchWait)
	defer cancel()
	for len(evs) < c.cfg.MaxBatch && len(msgs) < c.cfg.MaxBatch {
		m, err := c.r.FetchMessage(wctx) // on a timeout no message is lost: it stays queued in the reader
		if err != nil {
			break
		}
		msgs = append(msgs, m)
		evs = c.decode(b, evs, &msgs[len(msgs)-1])
	}
	return msgs, evs
}

// commit commits msgs' offsets, even after ctx is done, within CommitTimeout.
// A failed commit is counted, not returned: the next commit covers the same
// partitions, and what it cannot cover is replayed, never lost.
func (c *Consumer) commit(ctx context.Context, msgs []kafka.Message) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	if err := c.r.CommitMessages(cctx, msgs...); err != nil {
		c.m.commitErrors.Inc()
	}
}

// observeLag sets each partition's lag from the last of its messages.
func (c *Consumer) observeLag(lag map[int]prometheus.Gauge, msgs []kafka.Message) {
	for i := range msgs {
		m := &msgs[i]
		if i+1 < len(msgs) && msgs[i+1].Partition == m.Partition {
			continue
		}
		g, ok := lag[m.Partition]
		if !ok {
			g = c.m.lag.WithLabelValues(strconv.Itoa(m.Partition))
			lag[m.Partition] = g
		}
		g.Set(float64(max(m.HighWaterMark-m.Offset-1, 0)))
	}
}

// Close stops Run after the batch in hand is applied and committed, waits
// for it, and leaves the group, so that its partitions move to the other
// members at once. Close is idempotent.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		done := c.runDone
		c.mu.Unlock()
		c.cancel()
		if done != nil {
			<-done
		}
		if err := c.r.Close(); err != nil {
			c.closeErr = fmt.Errorf("pipeline: close consumer: %w", err)
		}
	})
	return c.closeErr
}
