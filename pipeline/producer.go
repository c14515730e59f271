package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// ErrClosed reports use of a Producer or Consumer after Close (or a second
// Consumer.Run).
var ErrClosed = errors.New("pipeline: closed")

// writerLinger is how long kafka-go waits for more frames of a partition
// before it sends its produce request (Writer.BatchTimeout), at most. Frames
// are already batched over BatchTimeout; this only merges those of writes
// that follow each other closely into one request.
const writerLinger = time.Millisecond

// Producer sends events to Kafka without ever blocking its caller. Emit puts
// a copy of the event on a bounded queue (or drops and counts it); one
// goroutine, started by NewProducer and stopped by Close, drains the queue
// into frames, one stream per partition, and hands them to a kafka-go
// Writer. Emit and Close are safe for concurrent use. The zero value is not
// usable: build one with NewProducer.
type Producer struct {
	cfg        ProducerConfig
	queue      *eventRing
	syncBudget time.Duration
	m          producerMetrics

	w        *kafka.Writer
	tr       *kafka.Transport
	trCancel context.CancelFunc
	dialer   net.Dialer

	// runCtx bounds every write; abort cancels it when Close's deadline
	// passes, interrupting a write that waits for the broker.
	runCtx    context.Context
	runCancel context.CancelFunc

	inflight atomic.Int64  // events handed to w without an outcome yet
	writes   atomic.Int64  // WriteMessages calls with frames lacking an outcome
	progress chan struct{} // capacity 1: a write finished that the goroutine may wait for (see finish)
	aborted  atomic.Bool   // set (before runCtx is cancelled) when Close's deadline passed
	closing  atomic.Bool   // set by Close: failed writes are no longer retried

	// failing is set when a write's every attempt failed, or the topic's
	// partitions could not be learnt: the goroutine pauses until a probe of
	// the broker succeeds.
	failing atomic.Bool
	probe   *kafka.Client
	retry   retryBuffer

	// mu protects closed. Emit holds it shared while it pushes onto queue,
	// so once Close has set closed, nothing more enters the queue.
	mu     sync.RWMutex
	closed bool

	// wake (capacity 1) is signalled by Emit when the writer goroutine is
	// idle (waits for a first event) or wakeAt events are queued.
	wake      chan struct{}
	idle      atomic.Bool
	wakeAt    int
	wakeEvery uint64        // Emit checks wakeAt at positions that are multiples of it
	quit      chan struct{} // closed by Close: flush and return
	done      chan struct{} // closed when run has returned
	closeOnce sync.Once
	closeErr  error

	// owned by run
	framer  framer
	timer   *time.Timer // the end of the frame interval
	ticking bool        // timer runs: an interval has begun
	partsAt time.Time   // when the partition count was last asked for
	msgs    []kafka.Message
}

// NewProducer validates cfg, registers the producer's metrics with reg (nil:
// none) and starts the writer goroutine. It does not contact the brokers: an
// edge starts even when Kafka is down, and events flow once it is up.
func NewProducer(cfg ProducerConfig, reg prometheus.Registerer) (*Producer, error) {
	p, err := newProducer(cfg, reg)
	if err != nil {
		return nil, err
	}
	go p.run()
	return p, nil
}

// newProducer builds a Producer without starting its goroutine (tests drive
// the queue themselves).
func newProducer(cfg ProducerConfig, reg prometheus.Registerer) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Producer{
		cfg:      cfg,
		queue:    newEventRing(cfg.QueueSize),
		progress: make(chan struct{}, 1),
		wake:     make(chan struct{}, 1),
		wakeAt:   max(1, min(cfg.BatchSize, cfg.QueueSize/2)),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		retry:    retryBuffer{limit: cfg.RetryBuffer, maxAge: cfg.RetryFor},
		timer:    time.NewTimer(time.Hour),
	}
	p.timer.Stop() // started by the first event of each frame interval
	p.wakeEvery = 1
	for 2*p.wakeEvery <= uint64(p.wakeAt)/4 && p.wakeEvery < 64 {
		p.wakeEvery *= 2
	}
	linger := min(cfg.BatchTimeout, writerLinger)
	// A sync write must not time out once kafka-go has taken its frames:
	// give it the metadata lookup, the linger and every attempt with its
	// backoff.
	p.syncBudget = cfg.WriteTimeout + linger +
		time.Duration(cfg.MaxAttempts)*cfg.WriteTimeout +
		time.Duration(cfg.MaxAttempts-1)*cfg.WriteBackoffMax
	p.m = newProducerMetrics(p)
	if err := register(reg, p.m.collectors); err != nil {
		return nil, fmt.Errorf("pipeline: register producer metrics: %w", err)
	}
	var key *FrameKey
	if cfg.Key != nil {
		var err error
		if key, err = NewFrameKey(cfg.Key); err != nil { // unreachable: Validate checked
			return nil, err
		}
	}
	// A random first sequence number: see "Frames" in the package doc.
	p.framer = newFramer(cfg, rand.Uint64(), key, &p.m)

	p.runCtx, p.runCancel = context.WithCancel(context.Background())
	trCtx, cancel := context.WithCancel(context.Background())
	p.trCancel = cancel
	p.tr = &kafka.Transport{
		Dial:           p.dial,
		DialTimeout:    cfg.DialTimeout,
		MetadataTTL:    cfg.MetadataTTL,
		MetadataTopics: []string{cfg.Topic},
		ClientID:       cfg.ClientID,
		Context:        trCtx,
		TLS:            cfg.TLS,
		SASL:           cfg.SASL,
	}
	p.probe = &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.WriteTimeout, Transport: p.tr}
	p.w = &kafka.Writer{
		Addr:            kafka.TCP(cfg.Brokers...),
		Topic:           cfg.Topic,
		Balancer:        framePartition{},
		MaxAttempts:     cfg.MaxAttempts,
		WriteBackoffMin: cfg.WriteBackoffMin,
		WriteBackoffMax: cfg.WriteBackoffMax,
		BatchSize:       writerBatchSize(cfg),
		BatchBytes:      cfg.BatchBytes,
		BatchTimeout:    linger,
		ReadTimeout:     cfg.WriteTimeout,
		WriteTimeout:    cfg.WriteTimeout,
		RequiredAcks:    cfg.RequiredAcks,
		Async:           cfg.Async,
		Completion:      p.complete,
		Compression:     cfg.Compression,
		Transport:       p.tr,
	}
	return p, nil
}

// writerBatchSize is the most frames in one partition's produce request:
// about BatchSize events of full frames. kafka-go allocates room for that
// many messages with every batch, so it is kept to what a write can hold.
func writerBatchSize(cfg ProducerConfig) int {
	return max(1, (cfg.BatchSize+cfg.FrameEvents-1)/cfg.FrameEvents)
}

// Emit queues a copy of e for sending and reports whether it did. It never
// blocks and never allocates: it touches only the queue, never the network.
// It returns false, and counts why, when e is sampled out, invalid (see
// event.Append), the queue is full, or the producer is closed. An event of
// a global rule is never sampled out: the other PoPs' limits count on it.
//
// The copy shares e.Rule's and e.Pop's bytes until the event is encoded:
// they must be immutable (names from configuration), which spares Emit a
// copy.
func (p *Producer) Emit(e *event.Event) bool {
	p.m.emitted.Inc()
	if e.Check() != nil {
		p.m.droppedInvalid.Inc()
		return false
	}
	if !e.Global && !SampleKey(e.KeyHash, p.cfg.SampleRate) {
		p.m.sampledOut.Inc()
		return false
	}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		p.m.droppedClosed.Inc()
		return false
	}
	pos, ok := p.queue.push(e)
	p.mu.RUnlock()
	if !ok {
		p.m.droppedFull.Inc()
		return false
	}
	if p.idle.Load() || (pos%p.wakeEvery == 0 && p.queue.len() >= p.wakeAt) {
		p.wakeWriter()
	}
	return true
}

// wakeWriter wakes the writer goroutine if it sleeps.
func (p *Producer) wakeWriter() {
	p.idle.Store(false)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close stops accepting events, frames and writes what is queued, waits for
// kafka-go to deliver or fail it, and stops the goroutine. If ctx is done
// first, the events not yet written are counted as failed (reason "closed")
// and the writer gives up: no new connection is opened, so kafka-go fails
// what it holds at once, except that a request already sent waits at most
// WriteTimeout. Close then returns ctx's error, wrapped. Close is
// idempotent; later calls wait for the first and return its result.
func (p *Producer) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.closing.Store(true)
		aborted := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(aborted)
			p.abort()
		})
		close(p.quit)
		<-p.done
		if !stop() { // the deadline passed: abort ran, or is running
			<-aborted
			p.closeErr = fmt.Errorf("pipeline: close producer: %w", ctx.Err())
		}
		p.runCancel()
		p.trCancel()
		p.tr.CloseIdleConnections()
	})
	return p.closeErr
}

// abort makes the writer give up on the broker: it interrupts the write in
// progress, opens no new connection, and closes the idle ones.
func (p *Producer) abort() {
	p.aborted.Store(true)
	p.runCancel()
	p.tr.CloseIdleConnections()
}

// dial is the transport's dialer; after an abort it refuses, with an error
// that kafka-go does not retry.
func (p *Producer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.aborted.Load() {
		return nil, ErrClosed
	}
	if p.cfg.Dial != nil {
		return p.cfg.Dial(ctx, network, addr)
	}
	return p.dialer.DialContext(ctx, network, addr)
}
