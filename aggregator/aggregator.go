package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/aggstate"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
)

// config is the aggregator's configuration, built by parseFlags (or by a
// test). The defaults are the flags'.
type config struct {
	// Listen is the HTTP address for /metrics, /report and /healthz.
	Listen string
	// Brokers are the Kafka brokers; empty serves an embedded broker.
	Brokers []string
	// Embedded is the embedded broker's address, a loopback host:port
	// (port 0: any free port). Default 127.0.0.1:9392.
	Embedded string
	// EmbeddedDataDir, when set, is where the embedded broker keeps its
	// log and the group's offsets across restarts.
	EmbeddedDataDir string
	// Partitions is the partition count of the topic the embedded broker
	// creates. Default 8.
	Partitions int
	// EmbeddedRetention bounds how long the embedded broker keeps the
	// messages of both topics (retention.ms), EmbeddedRetentionBytes the
	// bytes of decision events it keeps, all partitions together, and
	// EmbeddedGlobalRetentionBytes those of the counts (retention.bytes,
	// per partition, is the share of each); it holds a topic to 9/8 of
	// its bytes at most (retention drops whole segments, an eighth each),
	// checked every EmbeddedRetentionCheck. Zero is the default: 1 h,
	// 256 MiB, 64 MiB and 1 s.
	EmbeddedRetention            time.Duration
	EmbeddedRetentionBytes       int64
	EmbeddedGlobalRetentionBytes int64
	EmbeddedRetentionCheck       time.Duration
	// EmbeddedSASL, when set (-kafka-sasl with -embedded-edge-users), makes
	// the embedded broker require SASL and ACLs of every client (see
	// startEmbedded). Default nil: no authentication.
	EmbeddedSASL *embeddedSASL
	// Consumer configures the consumer group; Brokers is set by start.
	Consumer pipeline.ConsumerConfig
	// Judge configures the judge.
	Judge judge.Config
	// IdleFlush is how long without events before everything buffered is
	// judged; 0 never. Default 1 s. Judge.Hold needs the same ticker.
	IdleFlush time.Duration
	// ShutdownTimeout bounds the HTTP server's shutdown. Default 10 s.
	ShutdownTimeout time.Duration
	// Pprof serves /debug/pprof/ on Listen (off by default: Listen has
	// no authentication, keep it on loopback when this is on).
	Pprof bool
	// GlobalTopic receives, every GlobalInterval (0: never), the counts
	// per PoP of the keys of global rules that matter (package global):
	// the edges of every PoP read it. GlobalMinShare is global.TallyConfig's
	// MinShare.
	GlobalTopic    string
	GlobalInterval time.Duration
	GlobalMinShare float64
	// GlobalMaxKeys bounds the keys of global rules counted for the
	// global topic (global.TallyConfig.MaxKeys, about tallyBytesPerKey
	// each): past it, the events of new keys are not counted until idle
	// keys leave, and are counted in
	// poplimit_aggregator_global_tally_dropped_events_total. 0 means
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

// validate reports every problem with c that start would otherwise find
// one at a time; the judge's and consumer's own Validate cover theirs.
// DefaultGlobalMaxKeys is config.GlobalMaxKeys's default.
const DefaultGlobalMaxKeys = 1 << 18

func (c *config) globalMaxKeys() int { return cmp.Or(c.GlobalMaxKeys, DefaultGlobalMaxKeys) }

func (c *config) validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New(`aggregator: -listen "": required`))
	}
	if len(c.Brokers) == 0 {
		if _, err := embeddedPort(c.Embedded); err != nil {
			errs = append(errs, err)
		}
		if c.Partitions < 1 || c.Partitions > 10000 {
			errs = append(errs, fmt.Errorf("aggregator: -partitions %d: must be between 1 and 10000", c.Partitions))
		}
		errs = append(errs, c.validateEmbedded()...)
	}
	if c.GlobalInterval < 0 || c.GlobalMinShare < 0 || c.GlobalMinShare > 1 {
		errs = append(errs, fmt.Errorf("aggregator: -global-interval %v, -global-min-share %v: want a duration not negative and a share between 0 and 1", c.GlobalInterval, c.GlobalMinShare))
	}
	if c.GlobalMaxKeys < 0 {
		errs = append(errs, fmt.Errorf("aggregator: -global-max-keys %d: must be at least 1", c.GlobalMaxKeys))
	}
	if len(c.GlobalPublisher) > global.MaxPublisherLen {
		errs = append(errs, fmt.Errorf("aggregator: -global-publisher %q: at most %d bytes", c.GlobalPublisher, global.MaxPublisherLen))
	}
	if c.IdleFlush < 0 {
		errs = append(errs, fmt.Errorf("aggregator: -idle-flush %v: must not be negative", c.IdleFlush))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("aggregator: -shutdown-timeout %v: must be positive", c.ShutdownTimeout))
	}
	if err := c.Judge.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// embeddedPort checks that addr is a loopback host:port (kfake listens on
// 127.0.0.1 only, without TLS: it must not face a network) and returns the
// port.
func embeddedPort(addr string) (int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q: bad port", addr)
	}
	if host != "127.0.0.1" && host != "localhost" {
		return 0, fmt.Errorf("aggregator: -embedded-broker %q: the embedded broker listens on 127.0.0.1 only", addr)
	}
	return port, nil
}

// aggregator is a running aggregator: the embedded broker (if any), the
// consumer feeding the judge, the idle flusher and the HTTP server. Start
// with start, stop with Stop; it owns every goroutine it starts.
type aggregator struct {
	cfg      config
	log      *slog.Logger
	reg      *prometheus.Registry
	broker   *kfake.Cluster // nil with external brokers
	brokers  []string
	judge    *judge.Judge
	consumer *pipeline.Consumer
	tally    *global.Tally // nil without GlobalInterval
	pubStop  context.CancelFunc
	http     *http.Server
	ln       net.Listener

	lastApply atomic.Int64  // wall clock of the last batch, Unix ns
	failed    chan error    // Run's error, if it fails; capacity 1
	runDone   chan struct{} // closed when the consumer goroutine returns
	quit      chan struct{} // closed by Stop: the ticker returns
	wg        sync.WaitGroup
	stopOnce  sync.Once
	stopErr   error
}

// start builds and starts an aggregator. On error, whatever it started is
// stopped.
func start(cfg config, log *slog.Logger) (a *aggregator, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a = &aggregator{cfg: cfg, log: log, reg: prometheus.NewRegistry(),
		failed: make(chan error, 1), runDone: make(chan struct{}), quit: make(chan struct{})}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	a.brokers = cfg.Brokers
	if len(a.brokers) == 0 {
		if a.broker, err = startEmbedded(cfg, log); err != nil {
			return nil, err
		}
		undo = append(undo, a.broker.Close)
		a.brokers = a.broker.ListenAddrs()
		log.Info("aggregator: embedded Kafka broker listening; point the edges at it",
			"brokers", a.brokers[0], "topic", cfg.Consumer.Topic, "partitions", cfg.Partitions,
			"data_dir", nameOr(cfg.EmbeddedDataDir, "none (memory only)"),
			"edge_flags", "-brokers "+a.brokers[0]+" -topic "+cfg.Consumer.Topic)
	}

	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if a.judge, err = judge.New(cfg.Judge, a.reg); err != nil {
		return nil, err
	}
	cc := cfg.Consumer
	cc.Brokers = a.brokers
	cc.OnFrame = aggstate.NewProducers(log, a.reg).Frame
	if a.consumer, err = pipeline.NewConsumer(cc, a.reg); err != nil {
		return nil, err
	}
	consumer := a.consumer // a is nil once start returns an error
	undo = append(undo, func() { _ = consumer.Close() })

	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("aggregator: -listen: %w", err)
	}
	ln := a.ln // a is nil once start returns an error
	undo = append(undo, func() { ln.Close() })

	if cfg.GlobalInterval > 0 {
		var key []byte
		if cfg.GlobalKeyFile != "" {
			if key, err = global.LoadKey("aggregator: -global-key-file", cfg.GlobalKeyFile); err != nil {
				return nil, err
			}
		}
		a.tally = global.NewTally(global.TallyConfig{MinShare: cfg.GlobalMinShare, MaxKeys: cfg.globalMaxKeys()})
		a.reg.MustRegister(aggstate.TallyDropped(a.tally))
		pub, err := global.NewPublisher(a.tally, global.KafkaConfig{Brokers: a.brokers, Topic: cfg.GlobalTopic,
			TLS: cc.TLS, SASL: cc.SASL, Key: key, Name: publisherName(cfg, a.ln.Addr())}, cfg.GlobalInterval, log, a.reg)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		a.pubStop = cancel
		a.wg.Add(1)
		go func() { defer a.wg.Done(); pub.Run(ctx) }()
		undo = append(undo, cancel)
	}

	a.http = &http.Server{Handler: a.handler(), ReadHeaderTimeout: 5 * time.Second}

	// Everything is built: start the goroutines.
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.http.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("aggregator: serving HTTP", "err", err)
		}
	}()
	go a.consume()
	if cfg.IdleFlush > 0 || cfg.Judge.Hold > 0 {
		a.wg.Add(1)
		go a.tick()
	}
	log.Info("aggregator: started", "listen", a.ln.Addr().String(), "brokers", a.brokers,
		"memory_bound_mib", cfg.memoryBound()>>20,
		"topic", cc.Topic, "group", cc.GroupID, "allowed_lateness", cfg.Judge.AllowedLateness,
		"max_clock_skew", cfg.Judge.MaxClockSkew, "max_event_age", cfg.Judge.MaxEventAge,
		"idle_flush", cfg.IdleFlush)
	return a, nil
}

// publisherName is cfg.GlobalPublisher, or the host's name and the
// address it listens on: two aggregators on one host listen on different
// ones, and a restarted one on the same.
func publisherName(cfg config, listen net.Addr) string {
	if cfg.GlobalPublisher != "" {
		return cfg.GlobalPublisher
	}
	host, _ := os.Hostname()
	name := host + "/" + listen.String()
	return name[max(0, len(name)-global.MaxPublisherLen):]
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Failed delivers the consumer's error if it stops by itself.
func (a *aggregator) Failed() <-chan error { return a.failed }

// consume runs the consumer until Stop closes it, or until it fails.
func (a *aggregator) consume() {
	defer close(a.runDone)
	err := a.consumer.Run(context.Background(), a.apply)
	if err != nil && !errors.Is(err, pipeline.ErrClosed) {
		a.failed <- err
	}
}

// apply hands a batch to the judge, arrived now by the wall clock: the
// clock the judge holds events against (judge.Config.Hold) and bounds
// their times by (MaxClockSkew, MaxEventAge). It never fails: the judge
// copies what it keeps, so the batch may be committed as soon as this
// returns.
func (a *aggregator) apply(batch []event.Event) error {
	now := time.Now().UnixNano()
	a.judge.Add(now, batch...)
	if a.tally != nil {
		a.tally.Add(batch...)
	}
	a.lastApply.Store(now)
	if a.cfg.onApply != nil {
		a.cfg.onApply(batch)
	}
	return nil
}

// tick drives the judge's clock: it releases the events whose hold is over
// (judge.Config.Hold) and judges everything buffered once no batch has
// arrived for IdleFlush.
func (a *aggregator) tick() {
	defer a.wg.Done()
	period := time.Second
	if h := a.cfg.Judge.Hold; h > 0 {
		period = min(period, h/2)
	}
	if a.cfg.IdleFlush > 0 {
		period = min(period, a.cfg.IdleFlush/4)
	}
	t := time.NewTicker(max(period, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-a.quit:
			return
		case <-t.C:
			now := time.Now().UnixNano()
			if a.cfg.IdleFlush > 0 && now-a.lastApply.Load() >= int64(a.cfg.IdleFlush) && a.judge.Buffered() > 0 {
				a.judge.Flush()
				a.log.Debug("aggregator: stream idle: judged every buffered event")
			} else if a.cfg.Judge.Hold > 0 {
				a.judge.Advance(now)
			}
		}
	}
}

// Stop stops the aggregator: the consumer (after committing the batch in
// hand), then the ticker; it judges what is still buffered, stops the
// HTTP server within ctx, and stops the embedded broker last. It is
// idempotent.
func (a *aggregator) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() {
		var errs []error
		if err := a.consumer.Close(); err != nil {
			errs = append(errs, err)
		}
		<-a.runDone
		if a.pubStop != nil {
			a.pubStop()
		}
		close(a.quit)
		a.judge.Flush()
		r := a.judge.Report()
		a.log.Info("aggregator: judged everything consumed", "events", r.Events, "duplicates", r.Duplicates, "judged", r.Judged,
			"late", r.Late, "invalid", r.Invalid, "invalid_future", r.InvalidBreakdown["future"],
			"invalid_past", r.InvalidBreakdown["past"], "wrongly_allowed", r.Enforced.WronglyAllowed,
			"wrongly_limited", r.Enforced.WronglyLimited, "wrong_ratio", r.Enforced.WrongRatio,
			"mean_relative_error", r.MeanRelativeError)
		if err := a.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("aggregator: stop HTTP: %w", err))
			a.http.Close()
		}
		a.wg.Wait()
		if a.broker != nil {
			a.broker.Close()
		}
		a.log.Info("aggregator: stopped")
		a.stopErr = errors.Join(errs...)
	})
	return a.stopErr
}

// handler serves /metrics, /report and /healthz.
func (a *aggregator) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	mux.HandleFunc("GET /report", a.serveReport)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	if a.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	return mux
}

// serveReport writes the judge's report as JSON. With flush=1 (or true) it
// first judges every buffered event, as at the end of a replay; events that
// arrive later and older than those are then late.
func (a *aggregator) serveReport(w http.ResponseWriter, r *http.Request) {
	if f := r.URL.Query().Get("flush"); f != "" {
		flush, err := strconv.ParseBool(f)
		if err != nil {
			http.Error(w, fmt.Sprintf("flush=%q: want a boolean", f), http.StatusBadRequest)
			return
		}
		if flush {
			a.judge.Flush()
		}
	}
	b, err := json.MarshalIndent(a.judge.Report(), "", "  ")
	if err != nil { // unreachable: the report holds only finite numbers
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
