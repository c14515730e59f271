package global

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// DefaultTopic is the topic of the counts, one partition (every edge reads
// all of it; each aggregator of the group publishes its keys to it).
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
	// Key is the secret the aggregators and the edges share (LoadKey):
	// a Publisher signs every message with it, a Feed drops every message
	// it did not sign. Nil: messages go unsigned and a Feed takes any
	// (whoever can write to the topic then chooses the other PoPs'
	// counts); both log a warning.
	Key []byte
	// Name is a Publisher's name in its messages: every aggregator that
	// publishes to the topic needs its own. Default the host's name.
	Name string
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
	mac      *mac // nil: unsigned
	topic    string
	hdr      Header

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
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if kc.Name == "" {
		kc.Name, _ = os.Hostname()
	}
	if kc.Name == "" || len(kc.Name) > MaxPublisherLen {
		return nil, fmt.Errorf("global: publisher: name %q: want 1 to %d bytes", kc.Name, MaxPublisherLen)
	}
	if kc.Key != nil && len(kc.Key) < MinKeyLen {
		return nil, fmt.Errorf("global: publisher: a key of %d bytes, want at least %d", len(kc.Key), MinKeyLen)
	}
	var inst [8]byte
	if _, err := rand.Read(inst[:]); err != nil {
		return nil, fmt.Errorf("global: publisher: %w", err)
	}
	p := &Publisher{tally: tally, interval: interval, log: log, mac: newMAC(kc.Key, kc.Topic), topic: kc.Topic,
		hdr: Header{Publisher: kc.Name, Instance: binary.BigEndian.Uint64(inst[:])},
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
	if p.mac == nil {
		log.Warn("global: publishing the counts unsigned: whoever can write to the topic chooses the other PoPs' counts; production needs -global-key-file on the aggregators and the edges", "topic", kc.Topic)
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

// Run publishes every interval until ctx is done, then writes a farewell
// (so that the edges stop waiting for this publisher) and closes the
// writer.
func (p *Publisher) Run(ctx context.Context) {
	defer p.w.Close()
	defer p.farewell()
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
		p.hdr.Stamp = max(now, p.hdr.Stamp+1)
		msgs = msgs[:0]
		for i := range cs {
			var key [8]byte
			binary.BigEndian.PutUint64(key[:], cs[i].Key)
			msgs = append(msgs, p.message(key[:], AppendCounts(nil, &p.hdr, &cs[i])))
		}
		// The heartbeat last: an edge that sees it has the counts before it.
		msgs = append(msgs, p.message(nil, AppendHeartbeat(nil, &p.hdr, p.interval)))
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

// message is a message of key and value, signed with the key if any.
func (p *Publisher) message(key, value []byte) kafka.Message {
	if p.mac != nil {
		value, _ = p.mac.sign(key, value) // key is 8 bytes or none
	}
	return kafka.Message{Key: key, Value: value}
}

// farewell tells the edges that this publisher stops: they no longer wait
// for its heartbeat (a publisher that stops without one is waited for
// TableConfig.Forget, with the view held to its share meanwhile).
func (p *Publisher) farewell() {
	p.hdr.Stamp = max(time.Now().UnixNano(), p.hdr.Stamp+1)
	ctx, cancel := context.WithTimeout(context.Background(), max(p.interval*4, time.Second))
	defer cancel()
	if err := p.w.WriteMessages(ctx, p.message(nil, AppendFarewell(nil, &p.hdr))); err != nil {
		p.log.Warn("global: the publisher's farewell was not written: the edges hold global rules to their share until they forget it", "err", err)
	}
}

// Feed reads the topic of the counts into a Table.
type Feed struct {
	table *Table
	r     *kafka.Reader
	log   *slog.Logger
	mac   *mac // nil: messages are not checked

	messages, errors prometheus.Counter
	dropped          [numDrops]prometheus.Counter
	droppedVec       *prometheus.CounterVec
	fresh            prometheus.GaugeFunc
	fill             prometheus.GaugeFunc
	full             prometheus.CounterFunc
	publishers       prometheus.GaugeFunc
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
	if kc.Key != nil && len(kc.Key) < MinKeyLen {
		return nil, fmt.Errorf("global: feed: a key of %d bytes, want at least %d", len(kc.Key), MinKeyLen)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rc := kafka.ReaderConfig{
		Brokers: kc.Brokers, Topic: kc.Topic, Partition: 0,
		Dialer:   &kafka.Dialer{Timeout: kc.Timeout, DualStack: true, TLS: kc.TLS, SASLMechanism: kc.SASL, DialFunc: kc.Dial},
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 50 * time.Millisecond, ReadBatchTimeout: 50 * time.Millisecond,
		ReadBackoffMin: 50 * time.Millisecond, ReadBackoffMax: time.Second,
		MaxAttempts: 3,
	}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("global: feed: %w", err)
	}
	f := &Feed{table: table, r: kafka.NewReader(rc), log: log, mac: newMAC(kc.Key, kc.Topic),
		messages: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "global_feed_messages_total", Help: "Messages read from the topic of the other PoPs' counts."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "global_feed_errors_total", Help: "Reads of the topic of the other PoPs' counts that failed."}),
		droppedVec: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "global_feed_dropped_total", Help: "Messages of the topic of the other PoPs' counts that changed nothing, by reason: unsigned, bad_mac, malformed, future, stale, replay, table_full, publishers."}, []string{"reason"}),
	}
	// A reader without a group starts at its first offset whatever
	// StartOffset says: set the newest.
	if err := f.r.SetOffset(kafka.LastOffset); err != nil {
		_ = f.r.Close()
		return nil, fmt.Errorf("global: feed: %w", err)
	}
	for d := DropUnsigned; d < numDrops; d++ {
		f.dropped[d] = f.droppedVec.WithLabelValues(d.String())
	}
	f.fresh = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "global_feed_fresh", Help: "1 while the other PoPs' counts are fresh (every publisher's heartbeat came within -global-stale), else 0: global rules are held to -global-share of their limits."}, func() float64 {
		if table.Fresh(table.now()) {
			return 1
		}
		return 0
	})
	f.fill = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "global_table_fill_ratio", Help: "Keys held in the table of the other PoPs' counts, over the most it holds; at 1, a key it cannot hold is decided as if cut off."}, func() float64 {
		n, m := table.Keys()
		return float64(n) / float64(m)
	})
	f.full = prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "global_table_full_total", Help: "Decisions of global rules held to -global-share because the table of the other PoPs' counts, full, may have refused their key's counts."}, func() float64 {
		return float64(table.HeldFull())
	})
	f.publishers = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "global_publishers", Help: "Publishers of the other PoPs' counts (aggregators) the edge waits for: every one must beat within -global-stale for the counts to be fresh."}, func() float64 {
		return float64(table.Publishers())
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{f.messages, f.errors, f.droppedVec, f.fresh, f.fill, f.full, f.publishers} {
			if err := reg.Register(c); err != nil {
				_ = f.r.Close()
				return nil, err
			}
		}
	}
	if f.mac == nil {
		log.Warn("global: taking the other PoPs' counts unsigned: whoever can write to the topic chooses them; production needs -global-key-file on the aggregators and the edges", "topic", kc.Topic)
	}
	return f, nil
}

// sweepEvery is how often a Feed sweeps one of the Table's shards: the
// whole table about every 1.3 s.
const sweepEvery = 20 * time.Millisecond

// Run reads until ctx is done, then closes the reader. A read that fails
// is counted and retried after a pause; the Table goes stale meanwhile.
// Meanwhile it sweeps the Table by the edge's clock.
func (f *Feed) Run(ctx context.Context) {
	defer f.r.Close()
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f.table.Sweep(f.table.now())
			}
		}
	}()
	defer func() { <-swept }()
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
		if d := f.take(&msg, &m); d != Kept {
			f.dropped[d].Inc()
		}
	}
}

// take checks one message and applies it to the table.
func (f *Feed) take(msg *kafka.Message, m *decoded) Drop {
	if f.mac != nil {
		switch {
		case len(msg.Value) == 0 || msg.Value[0]&signedBit == 0:
			return DropUnsigned
		case !f.mac.verify(msg.Key, msg.Value):
			return DropBadMAC
		}
	}
	if decode(msg.Value, m) != nil {
		return DropMalformed
	}
	return f.table.take(m, f.table.now())
}
