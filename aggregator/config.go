package aggregator

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
)

// The defaults of Config's fields that have no home in the packages the
// aggregator assembles (the topics, the global interval and share are
// pipeline's and global's): the command's flags show these, and a zero
// field takes its default (Config.WithDefaults).
const (
	DefaultListen                       = "127.0.0.1:7080"
	DefaultEmbedded                     = "127.0.0.1:9392"
	DefaultPartitions                   = 8
	DefaultGroup                        = "poplimit-aggregator"
	DefaultEmbeddedRetention            = time.Hour
	DefaultEmbeddedRetentionBytes       = 256 << 20
	DefaultEmbeddedGlobalRetentionBytes = 64 << 20
	DefaultEmbeddedRetentionCheck       = time.Second
	DefaultGlobalMaxKeys                = 1 << 18
	DefaultDedup                        = 1 << 18
	DefaultIdleFlush                    = time.Second
	DefaultShutdownTimeout              = 10 * time.Second
)

// Never, in IdleFlush or GlobalInterval, turns what they pace off: their
// zero is their default, so off is negative (net.Dialer's KeepAlive
// convention).
const Never time.Duration = -1

// Config is an aggregator's configuration. Its zero value is a working
// aggregator at the documented defaults: every zero field takes its
// default in WithDefaults, which Start applies. The command's flags are
// these fields, with WithDefaults' values as their defaults.
type Config struct {
	// Listen is the HTTP address for /metrics, /report and /healthz.
	// Default DefaultListen.
	Listen string
	// Brokers are the Kafka brokers; empty serves an embedded broker.
	Brokers []string
	// Embedded is the embedded broker's address, a loopback host:port
	// (port 0: any free port). Default DefaultEmbedded.
	Embedded string
	// EmbeddedDataDir, when set, is where the embedded broker keeps its
	// log and the group's offsets across restarts.
	EmbeddedDataDir string
	// Partitions is the partition count of the topic the embedded broker
	// creates. Default DefaultPartitions.
	Partitions int
	// EmbeddedRetention bounds how long the embedded broker keeps the
	// messages of both topics (retention.ms), EmbeddedRetentionBytes the
	// bytes of decision events it keeps, all partitions together, and
	// EmbeddedGlobalRetentionBytes those of the counts (retention.bytes,
	// per partition, is the share of each); it holds a topic to 9/8 of
	// its bytes at most (retention drops whole segments, an eighth each),
	// checked every EmbeddedRetentionCheck. Defaults
	// DefaultEmbeddedRetention, DefaultEmbeddedRetentionBytes,
	// DefaultEmbeddedGlobalRetentionBytes and DefaultEmbeddedRetentionCheck.
	EmbeddedRetention            time.Duration
	EmbeddedRetentionBytes       int64
	EmbeddedGlobalRetentionBytes int64
	EmbeddedRetentionCheck       time.Duration
	// EmbeddedSASL, when set (-kafka-sasl with -embedded-edge-users), makes
	// the embedded broker require SASL and ACLs of every client (see
	// startEmbedded). Default nil: no authentication.
	EmbeddedSASL *EmbeddedSASL
	// Consumer configures the consumer group; Brokers is set by Start.
	// A Consumer that sets no more than what it reads and as whom (Topic,
	// GroupID, ClientID, Key, TLS, SASL, OnFrame) takes the rest of
	// pipeline.DefaultConsumerConfig(); any other is taken as it is. An
	// empty Topic is pipeline.DefaultTopic, an empty GroupID DefaultGroup.
	Consumer pipeline.ConsumerConfig
	// Judge configures the judge. A zero Judge is judge.DefaultConfig()
	// with Dedup DefaultDedup; any other is taken as it is (its zeros
	// turn the judge's clock bounds and deduplication off).
	Judge judge.Config
	// IdleFlush is how long without events before everything buffered is
	// judged (a counting rule's events once Judge.SettleLateness old: see
	// judge.Judge.FlushSettled). Default DefaultIdleFlush; Never: never. Judge.Hold needs
	// the same ticker.
	IdleFlush time.Duration
	// ShutdownTimeout bounds the HTTP server's shutdown in Close.
	// Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Pprof serves /debug/pprof/ on Listen (off by default: Listen has
	// no authentication, keep it on loopback when this is on).
	Pprof bool
	// GlobalTopic receives, every GlobalInterval, the counts per PoP of
	// the keys of global rules that matter (package global): the edges of
	// every PoP read it. GlobalMinShare is global.TallyConfig's MinShare.
	// Defaults global.DefaultTopic, global.DefaultInterval (Never: no
	// counts are published) and global.DefaultMinShare.
	GlobalTopic    string
	GlobalInterval time.Duration
	GlobalMinShare float64
	// GlobalMaxKeys bounds the keys of global rules counted for the
	// global topic (global.TallyConfig.MaxKeys, about tallyBytesPerKey
	// each): past it, the events of new keys are not counted until idle
	// keys leave, and are counted in
	// poplimit_aggregator_global_tally_dropped_events_total. Default
	// DefaultGlobalMaxKeys.
	GlobalMaxKeys int
	// GlobalKeyFile holds the secret (at least 32 bytes) the global topic's
	// messages are signed with, shared with the edges (global.LoadKey).
	// Empty: unsigned, with a warning. GlobalPublisher names this
	// aggregator in them; each publisher needs its own name. Default the
	// host's name and the address Listen bound.
	GlobalKeyFile   string
	GlobalPublisher string

	// onApply, when set (tests), sees every batch after the judge took it.
	onApply func([]event.Event)
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	c.Listen = cmp.Or(c.Listen, DefaultListen)
	c.Embedded = cmp.Or(c.Embedded, DefaultEmbedded)
	c.Partitions = cmp.Or(c.Partitions, DefaultPartitions)
	c.EmbeddedRetention = cmp.Or(c.EmbeddedRetention, DefaultEmbeddedRetention)
	c.EmbeddedRetentionBytes = cmp.Or(c.EmbeddedRetentionBytes, DefaultEmbeddedRetentionBytes)
	c.EmbeddedGlobalRetentionBytes = cmp.Or(c.EmbeddedGlobalRetentionBytes, DefaultEmbeddedGlobalRetentionBytes)
	c.EmbeddedRetentionCheck = cmp.Or(c.EmbeddedRetentionCheck, DefaultEmbeddedRetentionCheck)
	c.Consumer = consumerWithDefaults(c.Consumer)
	c.Consumer.Topic = cmp.Or(c.Consumer.Topic, pipeline.DefaultTopic)
	c.Consumer.GroupID = cmp.Or(c.Consumer.GroupID, DefaultGroup)
	if c.Judge == (judge.Config{}) {
		c.Judge = judge.DefaultConfig()
		c.Judge.Dedup = DefaultDedup
	}
	c.IdleFlush = cmp.Or(c.IdleFlush, DefaultIdleFlush)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.GlobalTopic = cmp.Or(c.GlobalTopic, global.DefaultTopic)
	c.GlobalInterval = cmp.Or(c.GlobalInterval, global.DefaultInterval)
	c.GlobalMinShare = cmp.Or(c.GlobalMinShare, global.DefaultMinShare)
	c.GlobalMaxKeys = cmp.Or(c.GlobalMaxKeys, DefaultGlobalMaxKeys)
	return c
}

// consumerWithDefaults returns c, with the tuning of
// pipeline.DefaultConsumerConfig() if c sets nothing but what it reads and
// as whom.
func consumerWithDefaults(c pipeline.ConsumerConfig) pipeline.ConsumerConfig {
	tuning := c
	tuning.Brokers, tuning.TLS, tuning.SASL, tuning.Topic, tuning.GroupID, tuning.ClientID, tuning.Key, tuning.OnFrame =
		nil, nil, nil, "", "", "", nil, nil
	if !reflect.ValueOf(tuning).IsZero() {
		return c
	}
	d := pipeline.DefaultConsumerConfig()
	d.Brokers, d.TLS, d.SASL, d.Topic, d.GroupID, d.Key, d.OnFrame = c.Brokers, c.TLS, c.SASL, c.Topic, c.GroupID, c.Key, c.OnFrame
	d.ClientID = cmp.Or(c.ClientID, d.ClientID)
	return d
}

// Validate reports every problem with c, each naming the field and the
// command's flag, that Start would otherwise find one at a time; the
// judge's own Validate covers its config. Start validates c after
// WithDefaults; a zero that WithDefaults would fill is refused here, as
// the command's flags (whose defaults are filled already) want.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, field string, value any, why string) {
		errs = append(errs, fmt.Errorf("aggregator: -%s %v (Config.%s): %s", flag, value, field, why))
	}
	if c.Listen == "" {
		bad("listen", "Listen", `""`, "required")
	}
	if len(c.Brokers) == 0 {
		if _, err := embeddedPort(c.Embedded); err != nil {
			errs = append(errs, err)
		}
		if c.Partitions < 1 || c.Partitions > 10000 {
			bad("partitions", "Partitions", c.Partitions, "must be between 1 and 10000")
		}
		errs = append(errs, c.validateEmbedded()...)
	}
	if c.GlobalMinShare < 0 || c.GlobalMinShare > 1 {
		bad("global-min-share", "GlobalMinShare", c.GlobalMinShare, "want a share between 0 and 1")
	}
	if c.GlobalMaxKeys < 0 {
		bad("global-max-keys", "GlobalMaxKeys", c.GlobalMaxKeys, "must not be negative (0: DefaultGlobalMaxKeys)")
	}
	if len(c.GlobalPublisher) > global.MaxPublisherLen {
		bad("global-publisher", "GlobalPublisher", strconv.Quote(c.GlobalPublisher), fmt.Sprintf("at most %d bytes", global.MaxPublisherLen))
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "ShutdownTimeout", c.ShutdownTimeout, "must be positive")
	}
	if err := c.Judge.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateEmbedded reports the problems of the embedded broker's settings.
func (c *Config) validateEmbedded() []error {
	var errs []error
	if c.EmbeddedRetention < 0 || c.EmbeddedRetentionBytes < 0 || c.EmbeddedGlobalRetentionBytes < 0 || c.EmbeddedRetentionCheck < 0 {
		errs = append(errs, fmt.Errorf("aggregator: -embedded-retention %v, -embedded-retention-bytes %d, -embedded-global-retention-bytes %d (Config.EmbeddedRetention, EmbeddedRetentionBytes, EmbeddedGlobalRetentionBytes, EmbeddedRetentionCheck %v): must not be negative",
			c.EmbeddedRetention, c.EmbeddedRetentionBytes, c.EmbeddedGlobalRetentionBytes, c.EmbeddedRetentionCheck))
	}
	if c.Consumer.TLS != nil {
		errs = append(errs, errors.New("aggregator: -kafka-tls with the embedded broker (Config.Consumer.TLS): it serves plain TCP on loopback only; use -brokers for a TLS cluster"))
	}
	if (c.Consumer.SASL == nil) != (c.EmbeddedSASL == nil) {
		errs = append(errs, errors.New("aggregator: -kafka-sasl (Config.Consumer.SASL) with the embedded broker needs -embedded-edge-users (Config.EmbeddedSASL, the principals the edges authenticate as), and -embedded-edge-users needs -kafka-sasl"))
	}
	return errs
}

// embeddedPort checks that addr is a loopback host:port (kfake listens on
// 127.0.0.1 only, without TLS: it must not face a network) and returns the
// port.
func embeddedPort(addr string) (int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q (Config.Embedded): %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q (Config.Embedded): bad port", addr)
	}
	if host != "127.0.0.1" && host != "localhost" {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q (Config.Embedded): the embedded broker listens on 127.0.0.1 only", addr)
	}
	return port, nil
}
