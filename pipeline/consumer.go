package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// ConsumerConfig configures a Consumer. Start from DefaultConsumerConfig and
// set Brokers, Topic and GroupID. As with ProducerConfig, Validate rejects
// zero values instead of letting kafka-go replace them, and every field is
// passed to kafka-go explicitly. Offsets are always committed synchronously,
// after apply (kafka-go's CommitInterval is 0), which is not configurable:
// it is what makes a restart neither lose nor replay committed work. The
// zero value is invalid.
type ConsumerConfig struct {
	// Brokers are the bootstrap brokers, each host:port. Required.
	Brokers []string
	// Topic is read. Required; it must exist.
	Topic string
	// GroupID names the consumer group; consumers sharing it split the
	// topic's partitions and resume from the group's committed offsets.
	// Required.
	GroupID string
	// ClientID names the consumer to the brokers. Default "poplimit-pipeline".
	ClientID string

	// MaxBatch is the most events handed to apply at once. Default 1000.
	MaxBatch int
	// MaxBatchWait is how long Run waits for more messages after the first
	// of a batch before it applies what it has. Default 50 ms.
	MaxBatchWait time.Duration
	// QueueCapacity is how many fetched messages kafka-go buffers ahead of
	// Run (ReaderConfig.QueueCapacity). Default 1000.
	QueueCapacity int
	// MinBytes and MaxBytes bound one fetch response, in bytes
	// (ReaderConfig.MinBytes/MaxBytes). Defaults 1 and 10 MiB.
	MinBytes int
	MaxBytes int
	// MaxWait is how long the broker may hold a fetch waiting for MinBytes
	// (ReaderConfig.MaxWait); also the reader's ReadBatchTimeout. Default 500 ms.
	MaxWait time.Duration
	// HeartbeatInterval, SessionTimeout and RebalanceTimeout drive group
	// membership (ReaderConfig fields of the same names). The broker bounds
	// SessionTimeout (Kafka: 6 s to 30 min by default). Defaults 3 s, 10 s,
	// 5 s. After a broker outage the group is formed again only when the
	// coordinator's rebalance ends, so RebalanceTimeout is most of the time
	// the aggregator takes to catch up (faults TestBrokerOutage: 25 s with
	// 30 s, 6 s with 5 s); the judge commits and rejoins well within it.
	// SessionTimeout is how long a dead aggregator's partitions wait.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	// JoinGroupBackoff is the wait before rejoining the group after an
	// error. Default 1 s.
	JoinGroupBackoff time.Duration
	// ReadBackoffMin and ReadBackoffMax bound the wait between fetch
	// retries. Defaults 100 ms and 1 s.
	ReadBackoffMin time.Duration
	ReadBackoffMax time.Duration
	// MaxAttempts is how many times kafka-go tries a group operation, such
	// as a commit, before it reports an error. Default 3.
	MaxAttempts int
	// CommitTimeout bounds one commit. Run commits with it even after its
	// context is done, so that a batch apply accepted is not replayed.
	// Default 5 s.
	CommitTimeout time.Duration
	// StartOffset is where a group without a committed offset for a
	// partition starts: kafka.FirstOffset or kafka.LastOffset. Default
	// kafka.FirstOffset.
	StartOffset int64
	// DialTimeout bounds opening a connection to a broker. Default 2 s.
	DialTimeout time.Duration
}

// DefaultConsumerConfig returns the defaults documented on ConsumerConfig,
// with Brokers, Topic and GroupID empty.
func DefaultConsumerConfig() ConsumerConfig {
	return ConsumerConfig{
		ClientID:          "poplimit-pipeline",
		MaxBatch:          1000,
		MaxBatchWait:      50 * time.Millisecond,
		QueueCapacity:     1000,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           500 * time.Millisecond,
		HeartbeatInterval: 3 * time.Second,
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  5 * time.Second,
		JoinGroupBackoff:  time.Second,
		ReadBackoffMin:    100 * time.Millisecond,
		ReadBackoffMax:    time.Second,
		MaxAttempts:       3,
		CommitTimeout:     5 * time.Second,
		StartOffset:       kafka.FirstOffset,
		DialTimeout:       2 * time.Second,
	}
}

// Validate reports every invalid field, each with its name and value, joined
// into one error that wraps ErrConfig.
func (c *ConsumerConfig) Validate() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%w: ConsumerConfig.%s = %v: %s", ErrConfig, field, value, why))
	}
	positive := func(field string, d time.Duration) {
		if d <= 0 {
			bad(field, d, "must be positive")
		}
	}
	validateBrokers(c.Brokers, "ConsumerConfig", &errs)
	if c.Topic == "" {
		bad("Topic", `""`, "required")
	}
	if c.GroupID == "" {
		bad("GroupID", `""`, "required")
	}
	if c.MaxBatch < 1 {
		bad("MaxBatch", c.MaxBatch, "must be at least 1")
	}
	positive("MaxBatchWait", c.MaxBatchWait)
	if c.QueueCapacity < 1 {
		bad("QueueCapacity", c.QueueCapacity, "must be at least 1")
	}
	if c.MinBytes < 1 {
		bad("MinBytes", c.MinBytes, "must be at least 1")
	}
	if c.MaxBytes < MaxEventLen+1024 || c.MaxBytes < c.MinBytes {
		bad("MaxBytes", c.MaxBytes, "must be at least MinBytes and hold an event ("+strconv.Itoa(MaxEventLen+1024)+")")
	}
	positive("MaxWait", c.MaxWait)
	positive("HeartbeatInterval", c.HeartbeatInterval)
	positive("SessionTimeout", c.SessionTimeout)
	if c.HeartbeatInterval >= c.SessionTimeout && c.SessionTimeout > 0 {
		bad("HeartbeatInterval", c.HeartbeatInterval, "must be shorter than SessionTimeout")
	}
	positive("RebalanceTimeout", c.RebalanceTimeout)
	positive("JoinGroupBackoff", c.JoinGroupBackoff)
	positive("ReadBackoffMin", c.ReadBackoffMin)
	if c.ReadBackoffMax < c.ReadBackoffMin {
		bad("ReadBackoffMax", c.ReadBackoffMax, "must be at least ReadBackoffMin")
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", c.MaxAttempts, "must be at least 1")
	}
	positive("CommitTimeout", c.CommitTimeout)
	if c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset {
		bad("StartOffset", c.StartOffset, "must be kafka.FirstOffset (-2) or kafka.LastOffset (-1)")
	}
	positive("DialTimeout", c.DialTimeout)
	return errors.Join(errs...)
}

// Consumer reads events as a member of a consumer group and hands them to a
// function, committing offsets only after the function accepted them
// (at-least-once). Run and Close may be called from different goroutines.
// The zero value is not usable: build one with NewConsumer.
type Consumer struct {
	cfg ConsumerConfig
	r   *kafka.Reader
	m   consumerMetrics

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
		Dialer:                 &kafka.Dialer{ClientID: cfg.ClientID, Timeout: cfg.DialTimeout, DualStack: true},
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
	if err := register(reg, c.m.collectors); err != nil {
		return nil, fmt.Errorf("pipeline: register consumer metrics: %w", err)
	}
	c.stop, c.cancel = context.WithCancel(context.Background())
	c.r = kafka.NewReader(rc)
	return c, nil
}

// Run fetches events and calls apply with them, in batches of at most
// MaxBatch, until ctx is done or Close is called; then it returns nil. It
// commits a batch's offsets only after apply returned nil, so a consumer that
// stops (or crashes) and another that takes over in the same group neither
// lose nor replay what was committed; what was applied but not yet committed
// is applied again (at-least-once). Each partition's events arrive in the
// order they were produced.
//
// A message that does not decode is counted and skipped (its offset is
// committed with the batch). Errors of the group (a broker that is down) are
// counted and waited out: the reader rejoins by itself. If apply returns an
// error, Run returns it, wrapped, without committing the batch.
//
// apply must not keep batch or the Rule bytes of its events after it
// returns: Run reuses them. Copy what you keep.
//
// Run may be called once: the reader has fetched past offsets it never
// committed, so only a new Consumer resumes correctly after Run returned with
// an error. Later calls return ErrClosed.
func (c *Consumer) Run(ctx context.Context, apply func(batch []Event) error) error {
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
		evs  = make([]Event, 0, c.cfg.MaxBatch)
		lag  = map[int]prometheus.Gauge{}
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
		msgs = append(msgs[:0], m)
		msgs = c.fill(ctx, msgs)

		evs = evs[:0]
		for i := range msgs {
			var e Event
			if err := DecodeEvent(msgs[i].Value, &e); err != nil {
				c.m.decodeErrors.Inc()
				continue
			}
			evs = append(evs, e)
		}
		if len(evs) > 0 {
			if err := apply(evs); err != nil {
				c.m.applyErrors.Inc()
				return fmt.Errorf("pipeline: apply %d events: %w", len(evs), err)
			}
			c.m.consumed.Add(float64(len(evs)))
		}
		c.commit(ctx, msgs)
		c.observeLag(lag, msgs)
		clear(evs)
		clear(msgs)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// fill adds to msgs what arrives within MaxBatchWait, up to MaxBatch.
func (c *Consumer) fill(ctx context.Context, msgs []kafka.Message) []kafka.Message {
	if len(msgs) >= c.cfg.MaxBatch {
		return msgs
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.MaxBatchWait)
	defer cancel()
	for len(msgs) < c.cfg.MaxBatch {
		m, err := c.r.FetchMessage(wctx) // on a timeout no message is lost: it stays queued in the reader
		if err != nil {
			break
		}
		msgs = append(msgs, m)
	}
	return msgs
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

type consumerMetrics struct {
	consumed, decodeErrors, commitErrors, applyErrors, fetchErrors prometheus.Counter
	lag                                                            *prometheus.GaugeVec
	collectors                                                     []prometheus.Collector
}

func newConsumerMetrics() consumerMetrics {
	m := consumerMetrics{
		consumed:     prometheus.NewCounter(counterOpts("events_consumed_total", "Events decoded and accepted by apply.")),
		decodeErrors: prometheus.NewCounter(counterOpts("decode_errors_total", "Messages skipped because they did not decode as events.")),
		commitErrors: prometheus.NewCounter(counterOpts("commit_errors_total", "Offset commits that failed (their events may be replayed).")),
		applyErrors:  prometheus.NewCounter(counterOpts("apply_errors_total", "Batches that apply refused, ending Run.")),
		fetchErrors:  prometheus.NewCounter(counterOpts("fetch_errors_total", "Errors of the consumer group reported by fetches; the reader retries.")),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name: "consumer_lag_messages",
			Help: "Messages behind the partition's high watermark at the last message consumed from it.",
		}, []string{"partition"}),
	}
	m.collectors = []prometheus.Collector{m.consumed, m.decodeErrors, m.commitErrors, m.applyErrors, m.fetchErrors, m.lag}
	return m
}
