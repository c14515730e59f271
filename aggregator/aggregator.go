package aggregator

import (
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

// Aggregator is a running aggregator: the embedded broker (if any), the
// consumer feeding the judge, the idle flusher and the HTTP server. Start
// it with Start, stop it with Shutdown or Close; it owns every goroutine
// it starts.
type Aggregator struct {
	cfg      Config
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
	quit      chan struct{} // closed by Shutdown: the ticker returns
	wg        sync.WaitGroup
	stopOnce  sync.Once
	stopErr   error
}

// Start builds and starts an aggregator of cfg, its zero fields taking
// their defaults (Config.WithDefaults), logging to log (nil:
// slog.Default()). ctx bounds the start (the embedded broker's set-up);
// the aggregator runs until Shutdown or Close, or until its consumer fails
// (Failed). On error, whatever it started is stopped.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (a *Aggregator, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	a = &Aggregator{cfg: cfg, log: log, reg: prometheus.NewRegistry(),
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
		if a.broker, err = startEmbedded(ctx, cfg, log); err != nil {
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
	consumer := a.consumer // a is nil once Start returns an error
	undo = append(undo, func() { _ = consumer.Close() })

	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("aggregator: -listen (Config.Listen): %w", err)
	}
	ln := a.ln // a is nil once Start returns an error
	undo = append(undo, func() { ln.Close() })

	if cfg.GlobalInterval > 0 {
		var key []byte
		if cfg.GlobalKeyFile != "" {
			if key, err = global.LoadKey("aggregator: -global-key-file", cfg.GlobalKeyFile); err != nil {
				return nil, err
			}
		}
		a.tally = global.NewTally(global.TallyConfig{MinShare: cfg.GlobalMinShare, MaxKeys: cfg.GlobalMaxKeys})
		a.reg.MustRegister(aggstate.TallyDropped(a.tally))
		pub, err := global.NewPublisher(a.tally, global.KafkaConfig{Brokers: a.brokers, Topic: cfg.GlobalTopic,
			TLS: cc.TLS, SASL: cc.SASL, Key: key, Name: publisherName(cfg, a.ln.Addr())}, cfg.GlobalInterval, log, a.reg)
		if err != nil {
			return nil, err
		}
		pctx, cancel := context.WithCancel(context.Background())
		a.pubStop = cancel
		a.wg.Add(1)
		go func() { defer a.wg.Done(); pub.Run(pctx) }()
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
		"memory_bound_mib", cfg.MemoryBound()>>20,
		"topic", cc.Topic, "group", cc.GroupID, "allowed_lateness", cfg.Judge.AllowedLateness,
		"max_clock_skew", cfg.Judge.MaxClockSkew, "max_event_age", cfg.Judge.MaxEventAge,
		"idle_flush", cfg.IdleFlush)
	return a, nil
}

// publisherName is cfg.GlobalPublisher, or the host's name and the
// address it listens on: two aggregators on one host listen on different
// ones, and a restarted one on the same.
func publisherName(cfg Config, listen net.Addr) string {
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

// Addr is the address the HTTP server listens on (Config.Listen, its port
// chosen if 0).
func (a *Aggregator) Addr() string { return a.ln.Addr().String() }

// Brokers are the brokers the consumer reads from: Config.Brokers, or the
// embedded broker's address.
func (a *Aggregator) Brokers() []string { return a.brokers }

// Report is the judge's report, as /report serves it; with flush, every
// buffered event is judged first (as /report?flush=1).
func (a *Aggregator) Report(flush bool) judge.Report {
	if flush {
		a.judge.Flush()
	}
	return a.judge.Report()
}

// Failed delivers the consumer's error if it stops by itself.
func (a *Aggregator) Failed() <-chan error { return a.failed }

// consume runs the consumer until Shutdown closes it, or until it fails.
func (a *Aggregator) consume() {
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
func (a *Aggregator) apply(batch []event.Event) error {
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
func (a *Aggregator) tick() {
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
				a.judge.FlushSettled(now)
				a.log.Debug("aggregator: stream idle: judged the buffered events (a counting rule's until SettleLateness ago)")
			} else if a.cfg.Judge.Hold > 0 {
				a.judge.Advance(now)
			}
		}
	}
}

// Close is Shutdown within Config.ShutdownTimeout.
func (a *Aggregator) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	return a.Shutdown(ctx)
}

// Shutdown stops the aggregator: the consumer (after committing the batch
// in hand), then the ticker; it judges what is still buffered, stops the
// HTTP server within ctx, and stops the embedded broker last. It is
// idempotent.
func (a *Aggregator) Shutdown(ctx context.Context) error {
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
func (a *Aggregator) handler() http.Handler {
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
func (a *Aggregator) serveReport(w http.ResponseWriter, r *http.Request) {
	var flush bool
	if f := r.URL.Query().Get("flush"); f != "" {
		var err error
		if flush, err = strconv.ParseBool(f); err != nil {
			http.Error(w, fmt.Sprintf("flush=%q: want a boolean", f), http.StatusBadRequest)
			return
		}
	}
	b, err := json.MarshalIndent(a.Report(flush), "", "  ")
	if err != nil { // unreachable: the report holds only finite numbers
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
