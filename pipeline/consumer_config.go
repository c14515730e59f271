package pipeline

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/segmentio/kafka-go/sasl"

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
	// TLS, when set, talks to the brokers over TLS; SASL, when set,
	// authenticates (kafka-go's sasl/plain or sasl/scram mechanisms).
	TLS  *tls.Config
	SASL sasl.Mechanism
	// Topic is read. Required; it must exist.
	Topic string
	// GroupID names the consumer group; consumers sharing it split the
	// topic's partitions and resume from the group's committed offsets.
	// Required.
	GroupID string
	// ClientID names the consumer to the brokers. Default "poplimit-pipeline".
	ClientID string
	// Key, when set, is the events key (at least MinKeyLen bytes, the
	// producers'): Run hands apply only the events of frames signed with
	// it for the partition they were read from (FrameKey.Verify), and
	// drops and counts every other message by reason, unsigned (a single
	// event, a frame of FrameVersion) or bad_mac. Default none: every
	// frame and single event is read, and MACs are not checked.
	Key []byte

	// MaxBatch is the most events handed to apply at once. Run reads
	// messages until it holds at least MaxBatch events, or MaxBatch
	// messages, or MaxBatchWait has passed; a frame's events are never
	// split between batches of offsets, so when a batch holds more than
	// MaxBatch events Run hands them to apply in slices of at most
	// MaxBatch and commits after the last. Default 1000.
	MaxBatch int
	// MaxBatchWait is how long Run waits for more messages after the first
	// of a batch before it applies what it has. Default 50 ms.
	MaxBatchWait time.Duration
	// DedupFrames is how many of the latest frames Run remembers by their
	// identity (edge, partition, sequence number) to drop a frame it reads
	// again: a write the producer retried after its acknowledgement was
	// lost, or messages fetched again after a commit was cut off. It
	// remembers between DedupFrames/2 and DedupFrames frames, in 32 bytes
	// each. 0 remembers none. Default 262144 (8 MiB): at least 131,072
	// frames, so at least as many events as the aggregator's judge
	// remembers (131,072 to 262,144), which fingerprints only events
	// that did not come in a frame this dedup checked (Event.Framed).
	DedupFrames int
	// OnFrame, when set, is called by Run with the partition and header of
	// every frame it decodes and does not drop as a copy, before its
	// events are applied: the frames' sequence numbers start at a random
	// value per Producer, so they tell producers apart that write under
	// one edge id. It runs on Run's goroutine and must not keep h.
	OnFrame func(partition int, h *FrameHeader)
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
		DedupFrames:       1 << 18,
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
	if c.Key != nil && len(c.Key) < MinKeyLen {
		bad("Key", strconv.Itoa(len(c.Key))+" bytes", "must be at least "+strconv.Itoa(MinKeyLen)+" bytes")
	}
	if c.MaxBatch < 1 {
		bad("MaxBatch", c.MaxBatch, "must be at least 1")
	}
	positive("MaxBatchWait", c.MaxBatchWait)
	if c.DedupFrames < 0 || c.DedupFrames > 1<<24 {
		bad("DedupFrames", c.DedupFrames, "must be between 0 (off) and 2^24")
	}
	if c.QueueCapacity < 1 {
		bad("QueueCapacity", c.QueueCapacity, "must be at least 1")
	}
	if c.MinBytes < 1 {
		bad("MinBytes", c.MinBytes, "must be at least 1")
	}
	if c.MaxBytes < event.MaxLen+1024 || c.MaxBytes < c.MinBytes {
		bad("MaxBytes", c.MaxBytes, "must be at least MinBytes and hold an event ("+strconv.Itoa(event.MaxLen+1024)+")")
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
