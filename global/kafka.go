package global

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// DefaultTopic is the topic of the counts, one partition (the publisher is
// one aggregator, and every edge reads all of it).
const DefaultTopic = "poplimit-global"

// KafkaConfig says where the topic of the counts is.
type KafkaConfig struct {
	Brokers []string
	Topic   string // default DefaultTopic
	TLS     *tls.Config
	SASL    sasl.Mechanism
	// Timeout bounds one write or one dial. Default 5 s.
	Timeout time.Duration
	// Dial, when set, opens the connections to the brokers (a test's
	// network that it can cut).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (c KafkaConfig) withDefaults() KafkaConfig {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	return c
}

// Publisher writes a Tally's counts that matter, and a heartbeat, to the
// topic every Interval.
type Publisher struct {
	tally    *Tally
	interval time.Duration
	w        *kafka.Writer
	log      *slog.Logger

	published, failed prometheus.Counter
	keys              prometheus.GaugeFunc
}

// NewPublisher returns a Publisher of tally's counts; its metrics
// (poplimit_aggregator_global_*) are registered with reg unless nil.
func NewPublisher(tally *Tally, kc KafkaConfig, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) (*Publisher, error) {
	kc = kc.withDefaults()
	if len(kc.Brokers) == 0 {
		return nil, errors.New("global: publisher: no brokers")
	}
	if interval <= 0 {
		return nil, fmt.Errorf("global: publisher: interval %v: must be positive", interval)
	}
	p := &Publisher{tally: tally, interval: interval, log: log,
		w: &kafka.Writer{
			Addr: kafka.TCP(kc.Brokers...), Topic: kc.Topic, Balancer: &kafka.Hash{},
			BatchTimeout: time.Millisecond, BatchSize: 4096, RequiredAcks: kafka.RequireOne,
			WriteTimeout: kc.Timeout, ReadTimeout: kc.Timeout, MaxAttempts: 1,
			Transport: &kafka.Transport{DialTimeout: kc.Timeout, TLS: kc.TLS, SASL: kc.SASL, Dial: kc.Dial},
		},
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "aggregator",
			Name: "global_counts_published_total", Help: "Counts of keys of global rules published to the topic of the counts (one message per key per interval)."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "aggregator",
			Name: "global_publish_errors_total", Help: "Intervals whose counts could not be written to the topic of the counts."}),
	}
	p.keys = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "aggregator",
		Name: "global_keys", Help: "Keys of global rules counted per PoP by the aggregator."}, func() float64 {
		n, _ := tally.Keys()
		return float64(n)
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{p.published, p.failed, p.keys} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Run publishes every interval until ctx is done, then closes the writer.
func (p *Publisher) Run(ctx context.Context) {
	defer p.w.Close()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	var cs []Counts
	var msgs []kafka.Message
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		cs = p.tally.Snapshot(cs[:0], now)
		msgs = msgs[:0]
		for i := range cs {
			var key [8]byte
			v := AppendCounts(nil, &cs[i])
			copy(key[:], v[1:9])
			msgs = append(msgs, kafka.Message{Key: key[:], Value: v})
		}
		// The heartbeat last: an edge that sees it has the counts before it.
		msgs = append(msgs, kafka.Message{Value: AppendHeartbeat(nil, now)})
		wctx, cancel := context.WithTimeout(ctx, p.interval*4)
		err := p.w.WriteMessages(wctx, msgs...)
		cancel()
		if err != nil {
			p.failed.Inc()
			if ctx.Err() == nil {
				p.log.Warn("global: publishing the counts failed", "keys", len(cs), "err", err)
			}
			continue
		}
		p.published.Add(float64(len(cs)))
	}
}

// Feed reads the topic of the counts into a Table.
type Feed struct {
	table *Table
	r     *kafka.Reader
	log   *slog.Logger

	messages, errors prometheus.Counter
	fresh            prometheus.GaugeFunc
}

// NewFeed returns a Feed into table from the topic's newest message on (the
// publisher sends every key that matters each interval, so a new edge has
// the view after one); its metrics (poplimit_edge_global_*) are registered
// with reg unless nil.
func NewFeed(table *Table, kc KafkaConfig, log *slog.Logger, reg prometheus.Registerer) (*Feed, error) {
	kc = kc.withDefaults()
	if len(kc.Brokers) == 0 {
		return nil, errors.New("global: feed: no brokers")
	}
	rc := kafka.ReaderConfig{
		Brokers: kc.Brokers, Topic: kc.Topic, Partition: 0,
		Dialer:   &kafka.Dialer{Timeout: kc.Timeout, DualStack: true, TLS: kc.TLS, SASLMechanism: kc.SASL, DialFunc: kc.Dial},
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 50 * time.Millisecond, ReadBatchTimeout: 50 * time.Millisecond,
		StartOffset: kafka.LastOffset, ReadBackoffMin: 50 * time.Millisecond, ReadBackoffMax: time.Second,
		MaxAttempts: 3,
	}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("global: feed: %w", err)
	}
	f := &Feed{table: table, r: kafka.NewReader(rc), log: log,
		messages: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "global_feed_messages_total", Help: "Messages read from the topic of the other PoPs' counts."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "global_feed_errors_total", Help: "Reads of the topic of the other PoPs' counts that failed, and messages that did not decode."}),
	}
	f.fresh = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "global_feed_fresh", Help: "1 while the other PoPs' counts are fresh (the publisher's heartbeat came within -global-stale), else 0: global rules are held to -global-share of their limits."}, func() float64 {
		if table.Fresh(time.Now().UnixNano()) {
			return 1
		}
		return 0
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{f.messages, f.errors, f.fresh} {
			if err := reg.Register(c); err != nil {
				_ = f.r.Close()
				return nil, err
			}
		}
	}
	return f, nil
}

// Run reads until ctx is done, then closes the reader. A read that fails
// is counted and retried after a pause; the Table goes stale meanwhile.
func (f *Feed) Run(ctx context.Context) {
	defer f.r.Close()
	var m decoded
	for {
		msg, err := f.r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.errors.Inc()
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		f.messages.Inc()
		if err := decode(msg.Value, &m); err != nil {
			f.errors.Inc()
			continue
		}
		if m.heartbeat {
			f.table.Beat(time.Now().UnixNano())
			continue
		}
		f.table.Apply(&m.c)
	}
}
