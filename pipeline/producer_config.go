package pipeline

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/segmentio/kafka-go"
)

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
	// TLS, when set, talks to the brokers over TLS; SASL, when set,
	// authenticates (kafka-go's sasl/plain or sasl/scram mechanisms).
	TLS  *tls.Config
	SASL sasl.Mechanism
	// Topic receives the events. Required. It must exist: the producer
	// does not create topics. Its partition count bounds the consumers
	// that share the load.
	Topic string
	// ClientID names the producer to the brokers. Default "poplimit-pipeline".
	ClientID string
	// Key, when set, is the events key (at least MinKeyLen bytes, shared
	// with the aggregator): every frame is signed with it
	// (FrameVersionSigned, see FrameKey), one HMAC-SHA256 per frame, and
	// its MAC takes FrameMACLen of FrameBytes. Default none: frames of
	// FrameVersion, unsigned, which an aggregator with a key refuses.
	Key []byte

	// QueueSize is the capacity, in events, of the queue between Emit and
	// the writer goroutine, rounded up to a power of two (at least 2). An
	// event that finds it full is dropped and counted. Default 65536
	// (5.5 MiB of 88-byte cells).
	QueueSize int
	// SampleRate is the fraction of keys whose events are sent, in (0, 1].
	// Sampling is by key hash, so a sampled key's events are all sent and
	// the others' none (see the package doc). Default 1: every event.
	SampleRate float64

	// FrameEvents is the most events in one frame (one Kafka message),
	// 1 to MaxFrameEvents. 1 sends one event per message. Default 1024.
	FrameEvents int
	// FrameBytes is the most bytes in one frame, header (and MAC)
	// included; at least 366 (a frame of the longest event; 398 with a
	// Key) and at most BatchBytes-64.
	// Default 65536 (64 KiB; 1024 events of a rule with an 11-byte name
	// are 45 KiB before compression).
	FrameBytes int
	// BatchTimeout is the frame interval: the first event after an idle
	// spell starts one, and at its end every open frame is sealed and
	// written, so an event waits about this long in the producer at most
	// (a frame that fills goes earlier). A longer interval makes fuller
	// frames and fewer produce requests, which are most of the producer's
	// CPU at low rates. Default 200 ms: at 40,000 decisions a second over
	// 8 partitions, about one full frame a partition an interval, and
	// 0.31-0.38 µs of producer CPU a decision, Emit included, against
	// 0.69-0.82 µs at 50 ms and 1.4 µs at 10 ms with 256-event frames
	// (BENCHMARKS.md); the aggregator's judge allows 2 s of lateness.
	BatchTimeout time.Duration
	// BatchSize is the most events the writer goroutine takes from the
	// queue between two writes, so a write carries at most BatchSize
	// events plus those of the frames still open. A partition's produce
	// request holds at most BatchSize/FrameEvents frames, rounded up
	// (Writer.BatchSize). Default 16384: more than an interval's events
	// at 40,000 a second, so the interval, not the queue, seals frames.
	BatchSize int
	// BatchBytes is the most bytes in one partition's produce request
	// (Writer.BatchBytes); at least 1024. Default 1 MiB.
	BatchBytes int64
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
	// (Writer.WriteBackoffMin/Max), and between probes of a failing broker.
	// Defaults 100 ms and 1 s.
	WriteBackoffMin time.Duration
	WriteBackoffMax time.Duration
	// Async makes the writer goroutine hand frames to kafka-go and go on
	// draining the queue while kafka-go sends and retries them
	// (Writer.Async); outcomes are counted as they complete. When false the
	// goroutine waits for each write to be acknowledged before it drains
	// more, so throughput is bounded by one write per broker round trip.
	// Default true.
	Async bool
	// MaxWritesInFlight bounds, in Async mode, the writes (each of about
	// BatchSize events at most) handed to kafka-go without an outcome yet.
	// At the bound the goroutine waits for one to complete, success or
	// failure, and events wait in the queue, where the excess is dropped by
	// Emit. It keeps kafka-go's internal queues, which are unbounded,
	// short: while the broker is unreachable they cannot grow, and when it
	// returns little stale data is ahead of fresh events. Default 8.
	MaxWritesInFlight int
	// DialTimeout bounds opening a connection to a broker. Default 2 s.
	DialTimeout time.Duration
	// Dial, when set, opens the connections to the brokers instead of a
	// net.Dialer (a test's network that it can cut).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MetadataTTL is how long the cluster layout (the topic's partition
	// count, which places each key's events) is cached between refreshes.
	// Default 5 s.
	MetadataTTL time.Duration
	// RetryBuffer is how many events, in whole frames, whose every attempt
	// failed are kept to be sent again once the broker answers. Meanwhile
	// the producer pauses: it takes nothing more from the queue, and probes
	// the broker (an ApiVersions request) at WriteBackoffMin doubling to
	// WriteBackoffMax, so an outage is carried by the queue and this buffer
	// instead of being spent on writes that fail. Frames beyond it fail,
	// counted. 0 retries nothing (every failed write is lost, counted).
	// Default 65536.
	RetryBuffer int
	// RetryFor bounds how old (since the producer opened it) a frame may
	// be and still be kept to send again: older ones fail, counted, so
	// that a broker that answers but refuses every write (a deleted topic)
	// cannot keep the same events going round for ever. Default 5 min.
	RetryFor time.Duration
}

// DefaultProducerConfig returns the defaults documented on ProducerConfig,
// with Brokers and Topic empty.
func DefaultProducerConfig() ProducerConfig {
	return ProducerConfig{
		ClientID:          "poplimit-pipeline",
		QueueSize:         1 << 16,
		SampleRate:        1,
		FrameEvents:       1024,
		FrameBytes:        64 << 10,
		BatchTimeout:      200 * time.Millisecond,
		BatchSize:         16384,
		BatchBytes:        1 << 20,
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

// messageOverhead bounds what kafka-go adds to a message's value when it
// checks it against BatchBytes (lengths, attributes, timestamp).
const messageOverhead = 64

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
	if c.FrameEvents < 1 || c.FrameEvents > MaxFrameEvents {
		bad("FrameEvents", c.FrameEvents, "must be between 1 and "+strconv.Itoa(MaxFrameEvents))
	}
	if c.Key != nil && len(c.Key) < MinKeyLen {
		bad("Key", strconv.Itoa(len(c.Key))+" bytes", "must be at least "+strconv.Itoa(MinKeyLen)+" bytes")
	}
	minBytes := minFrameBytes
	if c.Key != nil {
		minBytes += FrameMACLen
	}
	if c.FrameBytes < minBytes {
		bad("FrameBytes", c.FrameBytes, "must be at least "+strconv.Itoa(minBytes)+" (a frame of the longest event, and its MAC with a Key)")
	} else if c.BatchBytes >= 1024 && int64(c.FrameBytes) > c.BatchBytes-messageOverhead {
		bad("FrameBytes", c.FrameBytes, "must be at most BatchBytes-"+strconv.Itoa(messageOverhead)+
			" ("+strconv.FormatInt(c.BatchBytes-messageOverhead, 10)+")")
	}
	if c.BatchTimeout <= 0 {
		bad("BatchTimeout", c.BatchTimeout, "must be positive (kafka-go turns 0 into 1s)")
	}
	if c.BatchSize < 1 {
		bad("BatchSize", c.BatchSize, "must be at least 1")
	}
	if c.BatchBytes < 1024 {
		bad("BatchBytes", c.BatchBytes, "must be at least 1024")
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
