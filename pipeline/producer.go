package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// ErrClosed reports use of a Producer or Consumer after Close (or a second
// Consumer.Run).
var ErrClosed = errors.New("pipeline: closed")

// ErrConfig is wrapped by every problem Validate reports.
var ErrConfig = errors.New("pipeline: invalid config")

// ProducerConfig configures a Producer. Start from DefaultProducerConfig and
// set Brokers and Topic. Validate rejects zero values instead of replacing
// them, because kafka-go silently replaces zeros with its own defaults
// (BatchTimeout 0 becomes one second, MaxAttempts 0 becomes ten) and a zero
// RequiredAcks means "do not wait for any acknowledgement". Every field below
// is passed to kafka-go explicitly. The zero value is invalid.
type ProducerConfig struct {
	// Brokers are the bootstrap brokers, each host:port. Required.
	Brokers []string
	// Topic receives the events. Required. It must exist: the producer
	// does not create topics. Its partition count bounds the consumers
	// that share the load.
	Topic string
	// ClientID names the producer to the brokers. Default "poplimit-pipeline".
	ClientID string

	// QueueSize is the capacity, in events, of the queue between Emit and
	// the writer goroutine. An event that finds it full is dropped and
	// counted. Default 65536 (4 MiB of 64-byte events).
	QueueSize int
	// SampleRate is the fraction of keys whose events are sent, in (0, 1].
	// Sampling is by key hash, so a sampled key's events are all sent and
	// the others' none (see the package doc). Default 1: every event.
	SampleRate float64

	// BatchSize is the most events in one partition batch (kafka-go
	// Writer.BatchSize). Default 1000.
	BatchSize int
	// BatchBytes is the most bytes in one partition batch (Writer.BatchBytes);
	// at least 1024. Default 1 MiB.
	BatchBytes int64
	// BatchTimeout is how long a partial batch waits for more events before
	// it is sent (Writer.BatchTimeout). Default 10 ms.
	BatchTimeout time.Duration
	// RequiredAcks is how many replicas acknowledge a batch before it counts
	// as delivered: kafka.RequireOne (the leader), kafka.RequireAll (every
	// in-sync replica) or kafka.RequireNone (none: a batch counts as
	// delivered once sent, and a broker-side failure goes unnoticed).
	// Default kafka.RequireOne.
	RequiredAcks kafka.RequiredAcks
	// Compression is the batch codec: 0 (none), kafka.Gzip, kafka.Snappy,
	// kafka.Lz4 or kafka.Zstd. Default kafka.Lz4.
	Compression kafka.Compression
	// WriteTimeout bounds one produce request, and one metadata request
	// (Writer.WriteTimeout and Writer.ReadTimeout). Default 2 s.
	WriteTimeout time.Duration
	// MaxAttempts is how many times a batch is tried before its events are
	// counted as failed (Writer.MaxAttempts). Default 3.
	MaxAttempts int
	// WriteBackoffMin and WriteBackoffMax bound the wait between attempts
	// (Writer.WriteBackoffMin/Max). Defaults 100 ms and 1 s.
	WriteBackoffMin time.Duration
	WriteBackoffMax time.Duration
	// Async makes the writer goroutine hand events to kafka-go and go on
	// draining the queue while kafka-go batches, sends and retries them
	// (Writer.Async); outcomes are counted as they complete. When false the
	// goroutine waits for each write to be acknowledged before it drains
	// more, so throughput is bounded by BatchSize events per broker round
	// trip plus BatchTimeout. Default true.
	Async bool
	// MaxWritesInFlight bounds, in Async mode, the writes (each of up to
	// BatchSize events) handed to kafka-go without an outcome yet. At the
	// bound the goroutine waits for one to complete, success or failure,
	// and events wait in the queue, where the excess is dropped by Emit.
	// It keeps kafka-go's internal queues, which are unbounded, short:
	// while the broker is unreachable they cannot grow, and when it
	// returns little stale data is ahead of fresh events. Default 8.
	MaxWritesInFlight int
	// DialTimeout bounds opening a connection to a broker. Default 2 s.
	DialTimeout time.Duration
	// MetadataTTL is how long the cluster layout is cached between
	// refreshes. Default 5 s.
	MetadataTTL time.Duration
	// RetryBuffer is how many events whose every attempt failed are kept
	// to be sent again once the broker answers. Meanwhile the producer
	// pauses: it takes nothing more from the queue, and probes the broker
	// (an ApiVersions request) at WriteBackoffMin doubling to WriteBackoffMax,
	// so an outage is carried by the queue and this buffer instead of
	// being spent on writes that fail. Events beyond it fail, counted.
	// 0 retries nothing (every failed write is lost, counted). Default
	// 65536.
	RetryBuffer int
	// RetryFor bounds how old (by its Time) an event may be and still be
	// kept to send again: older ones fail, counted, so that a broker that
	// answers but refuses every write (a deleted topic) cannot keep the
	// same events going round for ever. Default 5 min.
	RetryFor time.Duration
}

// DefaultProducerConfig returns the defaults documented on ProducerConfig,
// with Brokers and Topic empty.
func DefaultProducerConfig() ProducerConfig {
	return ProducerConfig{
		ClientID:          "poplimit-pipeline",
		QueueSize:         1 << 16,
		SampleRate:        1,
		BatchSize:         1000,
		BatchBytes:        1 << 20,
		BatchTimeout:      10 * time.Millisecond,
		RequiredAcks:      kafka.RequireOne,
		Compression:       kafka.Lz4,
		WriteTimeout:      2 * time.Second,
		MaxAttempts:       3,
		WriteBackoffMin:   100 * time.Millisecond,
		WriteBackoffMax:   time.Second,
		Async:             true,
		MaxWritesInFlight: 8,
		DialTimeout:       2 * time.Second,
		MetadataTTL:       5 * time.Second,
		RetryBuffer:       1 << 16,
		RetryFor:          5 * time.Minute,
	}
}

// Validate reports every invalid field, each with its name and value, joined
// into one error that wraps ErrConfig.
func (c *ProducerConfig) Validate() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%w: ProducerConfig.%s = %v: %s", ErrConfig, field, value, why))
	}
	validateBrokers(c.Brokers, "ProducerConfig", &errs)
	if c.Topic == "" {
		bad("Topic", `""`, "required")
	}
	if c.QueueSize < 1 {
		bad("QueueSize", c.QueueSize, "must be at least 1")
	}
	if !(c.SampleRate > 0 && c.SampleRate <= 1) { // also rejects NaN
		bad("SampleRate", c.SampleRate, "must be in (0, 1]")
	}
	if c.BatchSize < 1 {
		bad("BatchSize", c.BatchSize, "must be at least 1")
	}
	if c.BatchBytes < 1024 {
		bad("BatchBytes", c.BatchBytes, "must be at least 1024")
	}
	if c.BatchTimeout <= 0 {
		bad("BatchTimeout", c.BatchTimeout, "must be positive (kafka-go turns 0 into 1s)")
	}
	switch c.RequiredAcks {
	case kafka.RequireNone, kafka.RequireOne, kafka.RequireAll:
	default:
		bad("RequiredAcks", int(c.RequiredAcks), "must be RequireNone (0), RequireOne (1) or RequireAll (-1)")
	}
	if c.Compression != 0 && c.Compression.Codec() == nil {
		bad("Compression", int(c.Compression), "unknown codec")
	}
	if c.WriteTimeout <= 0 {
		bad("WriteTimeout", c.WriteTimeout, "must be positive")
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", c.MaxAttempts, "must be at least 1")
	}
	if c.WriteBackoffMin <= 0 {
		bad("WriteBackoffMin", c.WriteBackoffMin, "must be positive")
	}
	if c.WriteBackoffMax < c.WriteBackoffMin {
		bad("WriteBackoffMax", c.WriteBackoffMax, "must be at least WriteBackoffMin")
	}
	if c.MaxWritesInFlight < 1 {
		bad("MaxWritesInFlight", c.MaxWritesInFlight, "must be at least 1")
	}
	if c.DialTimeout <= 0 {
		bad("DialTimeout", c.DialTimeout, "must be positive")
	}
	if c.MetadataTTL <= 0 {
		bad("MetadataTTL", c.MetadataTTL, "must be positive")
	}
	if c.RetryBuffer < 0 {
		bad("RetryBuffer", c.RetryBuffer, "must be at least 0")
	}
	if c.RetryBuffer > 0 && c.RetryFor <= 0 {
		bad("RetryFor", c.RetryFor, "must be positive when RetryBuffer is")
	}
	return errors.Join(errs...)
}

func validateBrokers(brokers []string, typ string, errs *[]error) {
	if len(brokers) == 0 {
		*errs = append(*errs, fmt.Errorf("%w: %s.Brokers = []: at least one host:port required", ErrConfig, typ))
	}
	for i, b := range brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			*errs = append(*errs, fmt.Errorf("%w: %s.Brokers[%d] = %q: not host:port", ErrConfig, typ, i, b))
		}
	}
}

// Producer sends events to Kafka without ever blocking its caller. Emit puts
// a copy of the event on a bounded queue (or drops and counts it); one
// goroutine, started by NewProducer and stopped by Close, drains the queue
// into a kafka-go Writer. Emit and Close are safe for concurrent use. The
// zero value is not usable: build one with NewProducer.
type Producer struct {
	cfg         ProducerConfig
	queue       chan Event
	sampleAll   bool
	sampleBelow uint64 // with !sampleAll, keep a key iff mix64(KeyHash) < sampleBelow
	syncBudget  time.Duration
	m           producerMetrics

	w        *kafka.Writer
	tr       *kafka.Transport
	trCancel context.CancelFunc
	dialer   net.Dialer

	// runCtx bounds every write; abort cancels it when Close's deadline
	// passes, interrupting a write that waits for the broker.
	runCtx    context.Context
	runCancel context.CancelFunc

	inflight atomic.Int64  // events handed to w without an outcome yet
	writes   atomic.Int64  // WriteMessages calls with events lacking an outcome
	progress chan struct{} // capacity 1: a write has finished
	aborted  atomic.Bool   // set (before runCtx is cancelled) when Close's deadline passed
	closing  atomic.Bool   // set by Close: failed writes are no longer retried

	// failing is set when a write's every attempt failed: the goroutine
	// pauses until a probe of the broker succeeds.
	failing atomic.Bool
	// rmu protects retry: messages of failed writes, to send again.
	rmu   sync.Mutex
	retry []kafka.Message
	probe *kafka.Client

	// mu protects closed. Emit holds it shared while it sends on queue, so
	// once Close has set closed, nothing more enters the queue.
	mu     sync.RWMutex
	closed bool

	quit      chan struct{} // closed by Close: flush and return
	done      chan struct{} // closed when run has returned
	closeOnce sync.Once
	closeErr  error

	// owned by run
	batch []Event
	msgs  []kafka.Message
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
		queue:    make(chan Event, cfg.QueueSize),
		progress: make(chan struct{}, 1),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		batch:    make([]Event, 0, cfg.BatchSize),
		msgs:     make([]kafka.Message, 0, cfg.BatchSize),
	}
	p.sampleAll = cfg.SampleRate >= 1
	if !p.sampleAll {
		p.sampleBelow = uint64(cfg.SampleRate * (1 << 64))
	}
	// A sync write must not time out once kafka-go has taken its events:
	// give it the metadata lookup, the batch wait and every attempt with
	// its backoff.
	p.syncBudget = cfg.WriteTimeout + cfg.BatchTimeout +
		time.Duration(cfg.MaxAttempts)*cfg.WriteTimeout +
		time.Duration(cfg.MaxAttempts-1)*cfg.WriteBackoffMax
	p.m = newProducerMetrics(p)
	if err := register(reg, p.m.collectors); err != nil {
		return nil, fmt.Errorf("pipeline: register producer metrics: %w", err)
	}

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
	}
	p.probe = &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.WriteTimeout, Transport: p.tr}
	p.w = &kafka.Writer{
		Addr:            kafka.TCP(cfg.Brokers...),
		Topic:           cfg.Topic,
		Balancer:        &kafka.Hash{},
		MaxAttempts:     cfg.MaxAttempts,
		WriteBackoffMin: cfg.WriteBackoffMin,
		WriteBackoffMax: cfg.WriteBackoffMax,
		BatchSize:       cfg.BatchSize,
		BatchBytes:      cfg.BatchBytes,
		BatchTimeout:    cfg.BatchTimeout,
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

// Emit queues a copy of e for sending and reports whether it did. It never
// blocks and never allocates: it touches only the queue, never the network.
// It returns false, and counts why, when e is sampled out, invalid (see
// AppendEvent), the queue is full, or the producer is closed.
//
// The copy shares e.Rule's bytes until the event is encoded: Rule must be
// immutable (a rule name from configuration), which spares Emit a copy.
func (p *Producer) Emit(e *Event) bool {
	p.m.emitted.Inc()
	if len(e.Rule) > MaxRuleLen || e.Decision > Limited || e.Mode > ModeSync || e.Action > ActionBlock {
		p.m.droppedInvalid.Inc()
		return false
	}
	if !p.sampleAll && mix64(e.KeyHash) >= p.sampleBelow {
		p.m.sampledOut.Inc()
		return false
	}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		p.m.droppedClosed.Inc()
		return false
	}
	select {
	case p.queue <- *e:
		p.mu.RUnlock()
		return true
	default:
		p.mu.RUnlock()
		p.m.droppedFull.Inc()
		return false
	}
}

// Close stops accepting events, writes what is queued, waits for kafka-go to
// deliver or fail it, and stops the goroutine. If ctx is done first, the
// events not yet written are counted as failed (reason "closed") and the
// writer gives up: no new connection is opened, so kafka-go fails what it
// holds at once, except that a request already sent waits at most
// WriteTimeout. Close then returns ctx's error, wrapped. Close is idempotent;
// later calls wait for the first and return its result.
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

// run is the writer goroutine.
func (p *Producer) run() {
	defer close(p.done)
	for p.next() {
	}
	p.flush()
}

// next waits for room for a write (Async) and for events, writes a batch of
// them and reports whether to go on: false once Close was called. While the
// broker fails it waits for it to answer, and then sends the events of the
// failed writes before any newer ones.
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
	if msgs := p.takeRetry(); len(msgs) > 0 {
		p.send(msgs)
		return true
	}
	select {
	case e := <-p.queue:
		p.write(p.take(e))
		return true
	case <-p.quit:
		return false
	}
}

// full reports whether Async mode has MaxWritesInFlight writes in flight.
func (p *Producer) full() bool {
	return p.cfg.Async && p.writes.Load() >= int64(p.cfg.MaxWritesInFlight)
}

// take returns a batch of first and whatever else is queued, up to BatchSize.
func (p *Producer) take(first Event) []Event {
	b := append(p.batch[:0], first)
	for len(b) < p.cfg.BatchSize {
		select {
		case e := <-p.queue:
			b = append(b, e)
			continue
		default:
		}
		break
	}
	p.batch = b
	return b
}

// flush writes what is left in the retry buffer and the queue after Close,
// until both are empty or Close's deadline passes, then closes the writer.
// Writes that fail now are not retried (closing is set).
func (p *Producer) flush() {
	ctx := p.runCtx
	// Emit can no longer add to the queue, so a non-empty queue cannot block
	// the receive below.
	for ctx.Err() == nil {
		if p.full() {
			select {
			case <-p.progress:
			case <-ctx.Done():
			}
			continue
		}
		if msgs := p.takeRetry(); len(msgs) > 0 {
			p.send(msgs)
			continue
		}
		if len(p.queue) == 0 {
			break
		}
		p.write(p.take(<-p.queue))
	}
	n := 0
	for len(p.queue) > 0 {
		<-p.queue
		n++
	}
	p.rmu.Lock()
	n += len(p.retry)
	p.m.retryLen.Set(0)
	p.retry = nil
	p.rmu.Unlock()
	p.m.failedClosed.Add(float64(n))
	// Writer.Close sends kafka-go's partial batches and waits for every
	// outcome; after an abort they fail fast. It returns no error of its own
	// (only our transport's, which Close closes).
	_ = p.w.Close()
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
	return p.dialer.DialContext(ctx, network, addr)
}

// writeCall is one WriteMessages call. Each of its messages is counted once:
// by complete, or by abandon when WriteMessages failed before kafka-go took
// the messages (or, in sync mode, stopped waiting for them).
type writeCall struct {
	start time.Time
	n     int // messages in the call

	// mu protects the fields below.
	mu       sync.Mutex
	settled  int  // messages counted by complete
	finished bool // every message counted; later completions are ignored
}

// write encodes evs into messages and hands them to the writer.
func (p *Producer) write(evs []Event) {
	// One buffer per call holds every key and value: kafka-go holds the
	// slices until their batch completes, after this returns in Async mode,
	// so the buffer is never reused.
	size := 0
	for i := range evs {
		size += 8 + EncodedLen(&evs[i])
	}
	buf := make([]byte, 0, size)
	msgs := p.msgs[:0]
	for i := range evs {
		e := &evs[i]
		start := len(buf)
		buf = binary.BigEndian.AppendUint64(buf, e.KeyHash)
		var err error
		if buf, err = AppendEvent(buf, e); err != nil { // unreachable: Emit checked
			buf = buf[:start]
			p.m.droppedInvalid.Inc()
			continue
		}
		m := kafka.Message{
			Key:   buf[start : start+8 : start+8],
			Value: buf[start+8 : len(buf) : len(buf)],
		}
		if e.Time != 0 { // else kafka-go stamps the write time
			m.Time = time.Unix(0, e.Time)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) > 0 {
		p.send(msgs)
	}
	clear(msgs)
	p.msgs = msgs[:0]
}

// send hands msgs, as one call, to the writer, which holds them until their
// batches complete.
func (p *Producer) send(msgs []kafka.Message) {
	call := &writeCall{start: time.Now(), n: len(msgs)}
	for i := range msgs {
		msgs[i].WriterData = call
	}
	p.inflight.Add(int64(call.n))
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
		p.abandon(call, msgs)
	}
}

// complete is the writer's Completion callback, called from kafka-go's
// goroutines: it counts the outcome of one partition batch, which may hold
// messages of several calls.
func (p *Producer) complete(msgs []kafka.Message, err error) {
	if len(msgs) == 0 {
		return
	}
	if first, ok := msgs[0].WriterData.(*writeCall); ok {
		p.m.latency.Observe(time.Since(first.start).Seconds())
	}
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && msgs[j].WriterData == msgs[i].WriterData {
			j++
		}
		if call, ok := msgs[i].WriterData.(*writeCall); ok {
			p.settle(call, msgs[i:j], err)
		}
		i = j
	}
	if err != nil && !p.aborted.Load() {
		p.failing.Store(true)
	}
}

// settle counts the outcome of msgs, all of call: delivered, or failed, or,
// when the write failed and the producer is not closing, kept to be sent
// again as far as the retry buffer has room.
func (p *Producer) settle(call *writeCall, msgs []kafka.Message, err error) {
	call.mu.Lock()
	if call.finished {
		call.mu.Unlock()
		return
	}
	n := len(msgs)
	call.settled += n
	call.finished = call.settled >= call.n
	finished := call.finished
	call.mu.Unlock()

	kept := 0
	if err != nil && !p.closing.Load() && !p.aborted.Load() {
		kept = p.keep(msgs)
	}
	p.inflight.Add(-int64(kept))
	p.count(n-kept, err)
	if finished {
		p.finish()
	}
}

// keep adds what room allows of msgs, those younger than RetryFor, to the
// retry buffer and returns how many it took. The messages' bytes are never reused (see write), so they
// are kept as they are.
func (p *Producer) keep(msgs []kafka.Message) int {
	oldest := time.Now().Add(-p.cfg.RetryFor)
	p.rmu.Lock()
	defer p.rmu.Unlock()
	n := 0
	for _, m := range msgs {
		if len(p.retry) == p.cfg.RetryBuffer {
			break
		}
		if !m.Time.IsZero() && m.Time.Before(oldest) {
			continue // too old to be worth another round: it fails
		}
		p.retry = append(p.retry, kafka.Message{Key: m.Key, Value: m.Value, Time: m.Time})
		n++
	}
	p.m.retried.Add(float64(n))
	p.m.retryLen.Set(float64(len(p.retry)))
	return n
}

// takeRetry returns up to BatchSize kept messages, oldest first.
func (p *Producer) takeRetry() []kafka.Message {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if len(p.retry) == 0 {
		return nil
	}
	// The front of the buffer, capped so that keep's appends to the rest
	// cannot reach it: no copy, and the buffer is dropped once empty.
	n := min(len(p.retry), p.cfg.BatchSize)
	msgs := p.retry[:n:n]
	p.retry = p.retry[n:]
	if len(p.retry) == 0 {
		p.retry = nil
	}
	p.m.retryLen.Set(float64(len(p.retry)))
	return msgs
}

// awaitBroker pauses the goroutine while the broker fails: it probes it
// with an ApiVersions request, waiting WriteBackoffMin, doubling
// up to WriteBackoffMax, between probes, and returns true once one
// succeeds, or false when Close is called.
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
		ctx, cancel := context.WithTimeout(p.runCtx, p.cfg.WriteTimeout)
		// Not a metadata request: the transport answers those from its
		// cache. ApiVersions goes to a broker every time.
		res, err := p.probe.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
		cancel()
		if err == nil && res.Error == nil {
			p.failing.Store(false)
			return true
		}
		wait = min(2*wait, p.cfg.WriteBackoffMax)
		t.Reset(wait)
	}
}

// abandon counts every message of call not yet settled as failed, or keeps
// them all to be sent again when none was settled.
func (p *Producer) abandon(call *writeCall, msgs []kafka.Message) {
	call.mu.Lock()
	if call.finished {
		call.mu.Unlock()
		return
	}
	call.finished = true
	n := call.n - call.settled
	untouched := call.settled == 0
	call.mu.Unlock()

	kept := 0
	if untouched && !p.closing.Load() && !p.aborted.Load() {
		// Nothing of the call was written (the broker's metadata could
		// not be had): all of it can be sent again.
		kept = p.keep(msgs)
		p.failing.Store(true)
	}
	p.inflight.Add(-int64(kept))
	p.count(n-kept, ErrClosed)
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

// finish records that a write has every outcome and wakes the goroutine if
// it waits for room.
func (p *Producer) finish() {
	p.writes.Add(-1)
	select {
	case p.progress <- struct{}{}:
	default:
	}
}

// mix64 is the SplitMix64 finalizer, a bijection that spreads the bits of a
// key hash, so that sampling does not follow whatever structure the hash that
// placed the key on a partition or a shard left in its bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// SampleKey reports whether the events of the key whose hash is keyHash are
// kept at the given rate, exactly as a Producer with that SampleRate decides.
// Every edge decides alike, so a sampled key's events from all edges reach
// the aggregator and the others' never do.
func SampleKey(keyHash uint64, rate float64) bool {
	if rate >= 1 {
		return true
	}
	if !(rate > 0) {
		return false
	}
	return mix64(keyHash) < uint64(rate*(1<<64))
}

type producerMetrics struct {
	emitted, sampledOut, delivered             prometheus.Counter
	droppedFull, droppedClosed, droppedInvalid prometheus.Counter
	failedWrite, failedClosed                  prometheus.Counter
	retried, pauses                            prometheus.Counter
	retryLen, paused                           prometheus.Gauge
	latency                                    prometheus.Histogram
	collectors                                 []prometheus.Collector
}

const (
	namespace = "poplimit"
	subsystem = "pipeline"
)

func counterOpts(name, help string) prometheus.CounterOpts {
	return prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

func newProducerMetrics(p *Producer) producerMetrics {
	emitted := prometheus.NewCounter(counterOpts("events_emitted_total", "Events offered to Producer.Emit."))
	sampled := prometheus.NewCounter(counterOpts("events_sampled_out_total",
		"Events not sent because their key is outside the sample."))
	delivered := prometheus.NewCounter(counterOpts("events_delivered_total",
		"Events acknowledged by the broker (sent, with RequiredAcks none)."))
	dropped := prometheus.NewCounterVec(counterOpts("events_dropped_total",
		"Events that Emit refused, by reason: queue_full, closed, invalid."), []string{"reason"})
	failed := prometheus.NewCounterVec(counterOpts("events_failed_total",
		"Queued events that were not delivered, by reason: write (every attempt failed or the broker was unreachable), "+
			"closed (cut off by the deadline of Close)."), []string{"reason"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "batch_write_duration_seconds",
		Help:    "Time from handing events to the Kafka writer until their partition batch was acknowledged or failed.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
	})
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "queue_length", Help: "Events waiting in the producer queue.",
	}, func() float64 { return float64(len(p.queue)) })
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "in_flight_events", Help: "Events handed to the Kafka writer without an outcome yet.",
	}, func() float64 { return float64(p.inflight.Load()) })
	retried := prometheus.NewCounter(counterOpts("events_retried_total",
		"Events of failed writes kept to be sent again once the broker answers (each is later counted delivered or failed)."))
	pauses := prometheus.NewCounter(counterOpts("pauses_total",
		"Times the producer paused because a write failed, until a probe of the broker succeeded."))
	retryLen := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "retry_length", Help: "Events of failed writes waiting to be sent again."})
	paused := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "paused", Help: "1 while the producer waits for a failing broker to answer; events wait in the queue."})
	return producerMetrics{
		retried:        retried,
		pauses:         pauses,
		retryLen:       retryLen,
		paused:         paused,
		emitted:        emitted,
		sampledOut:     sampled,
		delivered:      delivered,
		droppedFull:    dropped.WithLabelValues("queue_full"),
		droppedClosed:  dropped.WithLabelValues("closed"),
		droppedInvalid: dropped.WithLabelValues("invalid"),
		failedWrite:    failed.WithLabelValues("write"),
		failedClosed:   failed.WithLabelValues("closed"),
		latency:        latency,
		collectors:     []prometheus.Collector{emitted, sampled, delivered, dropped, failed, latency, queue, inflight, retried, pauses, retryLen, paused},
	}
}

// register registers cs with reg (nil: nothing), all or none.
func register(reg prometheus.Registerer, cs []prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}
