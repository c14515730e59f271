package edge

import (
	"cmp"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go/sasl"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rls/xds"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// Options is every setting of an edge, each with its default in one place:
// the zero value of a field means the default that DefaultOptions shows.
// cmd/edge's flags set these fields; tests and programs that embed an edge
// set them directly and build with Build, the same way.
type Options struct {
	Listen string // default "127.0.0.1:7070": rate-limited traffic
	Admin  string // default "127.0.0.1:7071": /metrics, /healthz, /readyz
	// AdminMaxConns bounds the admin listener's connections, beyond which
	// they are closed at once: descriptors kept for it out of the traffic
	// listener's reach (Server.MaxConns is derived without them), and
	// that its own clients cannot take from traffic.
	AdminMaxConns int // default 64
	// RLSListen, when set, serves Envoy's rate limit service (gRPC,
	// envoy.service.ratelimit.v3) there, over the same core, for rules
	// from envoyproxy/ratelimit files. Default off.
	RLSListen string
	RLS       rls.Config
	// RLSHTTPListen, with RLSListen, serves envoyproxy/ratelimit's HTTP
	// port there: POST /json and /healthcheck (rls.Service.HTTPHandler).
	// Default off.
	RLSHTTPListen string

	// EdgeID names this edge in decision events (0 to 65535).
	EdgeID int // default 0
	// EdgeIDDerived says EdgeID was derived by cmd/edge (no -edge-id),
	// not chosen; it only shows in the start log.
	EdgeIDDerived bool

	// RulesFile and OverridesFile are watched and reloaded on change
	// (polled every ReloadPoll) and on SIGHUP, for every front end; a file
	// that does not load is rejected whole, logged and counted, and the
	// running rules stay. Empty RulesFile means decision.DefaultRules.
	RulesFile     string
	OverridesFile string
	ReloadPoll    time.Duration // default 2s; the TLS pairs' files (Server.TLSCert, RLS.TLSCert) are read as often
	// ReloadSettle is how long the rules files' contents must stay the
	// same (read twice, this far apart) before a change or a SIGHUP
	// applies them, so a file written in steps never applies half-written.
	// Negative: apply at first sight.
	ReloadSettle time.Duration // default 1s
	// RulesMaxBytes bounds the rules file, the overrides file and each
	// envoyproxy/ratelimit file: a larger one is refused unread.
	RulesMaxBytes int64 // default rules.DefaultMaxFileBytes (4 MiB)

	// XDS, when XDS.Server is set, takes envoyproxy/ratelimit's rate
	// limit configuration from an xDS management server (state of the
	// world, go-control-plane's RateLimitConfig resources; package
	// rls/xds) instead of RulesFile, which must then be empty: each
	// configuration received applies as a reload of the files does, or is
	// NACKed with the error and the running rules stay. Without
	// XDS.ForceStart, WaitConfig waits for the first one.
	XDS xds.Config

	Server  httpedge.Config // the fasthttp front end: mode, upstream, client addresses, limits, TLS
	Limiter window.Config   // flush interval, store timeout, key table bounds
	Slots   slots.Config    // concurrency rules: renewal; StoreTimeout defaults to Limiter.StoreTimeout
	// Memcache is the shared store; no Servers means an in-memory store
	// (one edge alone: limits do not hold across edges). Timeout defaults
	// to Limiter.StoreTimeout.
	Memcache shardproxy.Config
	// Redis is the shared store instead, when it has Addrs (a server, or
	// Redis Cluster nodes); Timeout defaults to Limiter.StoreTimeout.
	Redis      redisstore.Config
	BlockCache blockcache.Config // default blockcache.DefaultMaxEntries entries

	// Brokers receive decision events on Topic (none: no events), the
	// events of a Sample share of keys.
	Brokers []string
	Topic   string  // default pipeline.DefaultTopic ("poplimit.decisions")
	Sample  float64 // default 1
	// KafkaTLS and KafkaSASL, when set, secure the connections to Brokers.
	KafkaTLS  *tls.Config
	KafkaSASL sasl.Mechanism
	// EventsKey, when set, signs the decision events (at least
	// pipeline.MinKeyLen bytes, the aggregator's -events-key-file): one
	// HMAC-SHA256 per frame, so an aggregator with the key refuses events
	// that no holder of it wrote. Default none: unsigned.
	EventsKey []byte

	// Pop names this edge's PoP (at most 32 bytes) in its events. With
	// Brokers, it also makes rules of scope global hold across PoPs: the
	// edge reads the other PoPs' counts from GlobalTopic (published by the
	// aggregator) and decides a global rule's key against its limit less
	// theirs. Empty: no PoP; global rules hold within the PoP.
	Pop         string
	GlobalTopic string // default global.DefaultTopic
	// GlobalStale is how long without a publisher's heartbeat before the
	// edge counts itself cut off from the other PoPs; it then holds global
	// rules to GlobalShare of their limits. A message of the topic stamped
	// longer ago is dropped.
	GlobalStale time.Duration // default global.DefaultStale (2s)
	GlobalShare float64       // default decision.DefaultGlobalShare (0.5)
	// GlobalKeyFile holds the secret (at least 32 bytes) the aggregators
	// sign the topic's messages with: the edge drops, and counts, every
	// message it did not sign. Empty: messages are taken unsigned, and a
	// warning logged (production needs it: anyone who can write to the
	// topic would choose the other PoPs' counts).
	GlobalKeyFile string
	// GlobalMaxSkew is how far ahead of the edge's clock a message of the
	// topic may be stamped, or its counts' window start, before it is
	// dropped (and counted).
	GlobalMaxSkew time.Duration // default global.DefaultMaxSkew (1s)
	// GlobalMaxKeys bounds the other PoPs' keys the edge holds (about
	// 200 bytes each); a key the full table cannot hold is decided as if
	// cut off, held to GlobalShare of its limit, and counted.
	GlobalMaxKeys int // default global.DefaultMaxKeys (262,144)

	Pprof bool // serve /debug/pprof/ on the admin listener
	// PprofToken, when set, is the bearer token /debug/pprof/ requires
	// (at least 16 bytes): the admin listener is loopback by default, and
	// a profile reveals what the process holds.
	PprofToken      string
	ShutdownTimeout time.Duration // default 10s: to finish requests and flush

	Logger *slog.Logger // default slog.Default()

	// Hooks for tests and embedding. Store replaces the store Memcache
	// would build (several in-process edges can share one MemStore);
	// Events replaces the producer Brokers would build; Registry receives
	// every metric (default a new one with the Go and process collectors).
	Store    store.Store
	Events   decision.Emitter
	Registry Registry
	// ClockSkew is added to the edge's clock: a test hook (the fault
	// suite's skewed edges), refused beyond ±MaxClockSkew.
	ClockSkew time.Duration
	// Clock is the edge's time: the core, the limiter's flushes, the
	// slots' renewals and every front end (the fasthttp server, the
	// decision endpoint, the rate limit service, the middleware) read it,
	// so a test can step time for all of them. ClockSkew is added to it.
	Clock store.Clock // default store.SystemClock
	// RetryJitter is the most random time added to every refusal's
	// Retry-After, by every front end, so that refused clients do not all
	// come back at once; negative: none.
	RetryJitter time.Duration // default decision.DefaultRetryJitter (2s)
	// BodyKeyBytes is the most of a request body read for the rules
	// keyed by it (form: and json: key parts), only for requests such a
	// rule matches; a longer body falls back as the rule's missing_key
	// says (decision.CoreConfig.BodyKeyBytes).
	BodyKeyBytes int // default decision.DefaultBodyKeyBytes (8 KiB)
	// SettleTimeout is how long a decision-mode reservation of a counting
	// rule waits for its settle call (POST /_poplimit/settle); one never
	// settled keeps its units then. MaxReservations bounds the
	// reservations waiting; past it a new one keeps its units at once.
	SettleTimeout   time.Duration // default decision.DefaultSettleTimeout (1m)
	MaxReservations int           // default decision.DefaultMaxHeld (65,536)
	// KafkaDial, when set, opens the connections to Brokers, for the
	// producer and the feed of the other PoPs' counts: a test hook (the
	// fault suite cuts a PoP off from Kafka).
	KafkaDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// MaxClockSkew bounds Options.ClockSkew: a test hook must not be able to
// move an edge's windows far.
const MaxClockSkew = time.Minute

// clock is the edge's time, Clock plus ClockSkew: what its core, limiter,
// slots and front ends read.
func (o *Options) clock() store.Clock {
	c := o.Clock
	if c == nil {
		c = store.SystemClock
	}
	if o.ClockSkew == 0 {
		return c
	}
	return skewedClock{c, o.ClockSkew}
}

// skewedClock is a clock d ahead of another (behind, for d < 0).
type skewedClock struct {
	c store.Clock
	d time.Duration
}

func (s skewedClock) Now() time.Time { return s.c.Now().Add(s.d) }

// Registry is where an edge registers its metrics and whence /metrics
// gathers them (a *prometheus.Registry).
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// DefaultOptions returns the options with every default filled in, for
// flags to show.
func DefaultOptions() Options { return Options{}.withDefaults() }

func (o Options) withDefaults() Options {
	o.Listen = cmp.Or(o.Listen, "127.0.0.1:7070")
	o.Admin = cmp.Or(o.Admin, "127.0.0.1:7071")
	o.AdminMaxConns = cmp.Or(o.AdminMaxConns, 64)
	o.Server = o.Server.WithDefaults()
	o.Limiter = o.Limiter.WithDefaults()
	o.Slots.StoreTimeout = cmp.Or(o.Slots.StoreTimeout, o.Limiter.StoreTimeout)
	o.Slots = o.Slots.WithDefaults()
	o.Memcache.Timeout = cmp.Or(o.Memcache.Timeout, o.Limiter.StoreTimeout)
	o.Redis.Timeout = cmp.Or(o.Redis.Timeout, o.Limiter.StoreTimeout)
	o.Memcache = o.Memcache.WithDefaults() // hash, protocol, pool: shardproxy's
	o.BlockCache = o.BlockCache.WithDefaults()
	o.Topic = cmp.Or(o.Topic, pipeline.DefaultTopic)
	o.GlobalTopic = cmp.Or(o.GlobalTopic, global.DefaultTopic)
	o.GlobalStale = cmp.Or(o.GlobalStale, global.DefaultStale)
	o.GlobalShare = cmp.Or(o.GlobalShare, decision.DefaultGlobalShare)
	o.GlobalMaxSkew = cmp.Or(o.GlobalMaxSkew, global.DefaultMaxSkew)
	o.GlobalMaxKeys = cmp.Or(o.GlobalMaxKeys, global.DefaultMaxKeys)
	o.Sample = cmp.Or(o.Sample, 1)
	o.ShutdownTimeout = cmp.Or(o.ShutdownTimeout, 10*time.Second)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.Clock = cmp.Or(o.Clock, store.SystemClock)
	o.RetryJitter = cmp.Or(o.RetryJitter, decision.DefaultRetryJitter)
	o.BodyKeyBytes = cmp.Or(o.BodyKeyBytes, decision.DefaultBodyKeyBytes)
	o.SettleTimeout = cmp.Or(o.SettleTimeout, decision.DefaultSettleTimeout)
	o.MaxReservations = cmp.Or(o.MaxReservations, decision.DefaultMaxHeld)
	o.ReloadPoll = cmp.Or(o.ReloadPoll, 2*time.Second)
	o.ReloadSettle = cmp.Or(o.ReloadSettle, time.Second)
	o.RulesMaxBytes = cmp.Or(o.RulesMaxBytes, rules.DefaultMaxFileBytes)
	return o
}

// Edge is a whole edge: its store client, limiter, concurrency slots, block
// cache, event producer, decision core and fasthttp front end, built by
// Build from Options. Close stops and closes all of it, in the reverse
// order of building.
type Edge struct {
	Options  Options // as built, defaults filled in
	Core     *decision.Core
	Server   *httpedge.Server
	Limiter  *window.Limiter
	Slots    *slots.Slots
	Blocks   *blockcache.Cache
	RLS      *rls.Service // Envoy's rate limit service; nil without RLSListen
	Registry Registry
	// Global is the other PoPs' counts, fed from Options.GlobalTopic; nil
	// without Options.Pop and Brokers.
	Global *global.Table

	store    store.Store        // the shared store the core decides over
	memcache *shardproxy.Client // nil without Memcache servers
	producer *pipeline.Producer // nil without Brokers
	closers  []func(context.Context) error
	ln, aln  net.Listener
	rln      net.Listener // RLS
	hln      net.Listener // RLS's HTTP port
	rlsHTTP  *http.Server
	admin    *http.Server

	// adminRefused counts the admin connections closed over AdminMaxConns.
	adminRefused prometheus.Counter

	closeOnce sync.Once
	closeErr  error

	// reloadMu serializes reloads.
	reloadMu sync.Mutex
	reload   *reloader

	// watchStop stops the file watchers Serve started (startWatchers);
	// closing is set once Close stopped them, so none start after.
	watchMu   sync.Mutex
	watchStop func()
	closing   bool

	xds *xds.Subscriber // nil without Options.XDS.Server
}

// Build builds an edge from o, with its rules read from o.Server's files
// (or the built-in rule). Nothing listens until Listen; the limiter's
// flusher runs from here on, so Close must be called.
func Build(o Options) (e *Edge, err error) {
	o = o.withDefaults()
	if o.ClockSkew < -MaxClockSkew || o.ClockSkew > MaxClockSkew {
		return nil, fmt.Errorf("edge: ClockSkew %v: a test hook, at most ±%v", o.ClockSkew, MaxClockSkew)
	}
	if o.PprofToken != "" && len(o.PprofToken) < httpedge.MinTokenLen {
		return nil, fmt.Errorf("edge: PprofToken of %d bytes: at least %d", len(o.PprofToken), httpedge.MinTokenLen)
	}
	src, err := decision.ReadSources(o.RulesFile, o.OverridesFile, o.RulesMaxBytes)
	if err != nil {
		return nil, err
	}
	rs, err := src.Rules()
	if err != nil {
		return nil, err
	}
	if o.AdminMaxConns < 0 {
		return nil, fmt.Errorf("edge: AdminMaxConns %d: must be 0 (default 64) or positive", o.AdminMaxConns)
	}
	if o.Server.MaxConns == 0 {
		o.Server.MaxConns = o.ConnsFor(CurrentFileLimit().Soft)
	}
	e = &Edge{Options: o, Registry: o.Registry}
	defer func() {
		if err != nil {
			e.Close(context.Background())
		}
	}()
	if e.Registry == nil {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		e.Registry = r
	}
	reg := e.Registry
	backend := o.Store
	if backend == nil && len(o.Redis.Addrs) > 0 && len(o.Memcache.Servers) > 0 {
		return e, errors.New("edge: Memcache and Redis: one shared store, not both")
	}
	if backend == nil && len(o.Redis.Addrs) > 0 {
		rs, err := redisstore.New(o.Redis, reg)
		if err != nil {
			return e, err
		}
		e.closers = append(e.closers, func(context.Context) error { rs.Close(); return nil })
		backend = rs
	}
	if backend == nil && len(o.Memcache.Servers) > 0 {
		if e.memcache, err = shardproxy.New(o.Memcache, reg); err != nil {
			return e, err
		}
		e.closers = append(e.closers, func(context.Context) error { e.memcache.Close(); return nil })
		ms, err := memcachestore.New(e.memcache, reg)
		if err != nil {
			return e, err
		}
		backend = ms
	}
	if backend == nil {
		backend = store.NewMemStore(nil)
	}
	if e.Blocks, err = blockcache.New(o.BlockCache, reg); err != nil {
		return e, err
	}
	e.closers = append(e.closers, func(context.Context) error { e.Blocks.Close(); return nil })
	events := o.Events
	if events == nil && len(o.Brokers) > 0 {
		pc := pipeline.DefaultProducerConfig()
		pc.Brokers, pc.Topic, pc.SampleRate = o.Brokers, o.Topic, o.Sample
		pc.TLS, pc.SASL, pc.Dial = o.KafkaTLS, o.KafkaSASL, o.KafkaDial
		pc.Key = o.EventsKey
		if e.producer, err = pipeline.NewProducer(pc, reg); err != nil {
			return e, err
		}
		e.closers = append(e.closers, e.producer.Close)
		events = e.producer
	}
	e.store = backend
	if err := e.registerReady(reg); err != nil {
		return e, err
	}
	var others decision.GlobalView
	if o.Pop != "" && len(o.Brokers) > 0 {
		if e.Global, err = e.startGlobal(o, reg); err != nil {
			return e, err
		}
		others = e.Global
	}
	st, err := NewStack(o, rs, StackDeps{Store: backend, Blocks: e.Blocks, Events: events, Registerer: reg, Global: others})
	if err != nil {
		return e, err
	}
	e.closers = append(e.closers, st.Close) // a last flush
	e.Limiter, e.Slots, e.Core = st.Limiter, st.Slots, st.Core
	if e.Server, err = httpedge.NewServer(o.Server, e.Core, httpedge.Deps{Logger: o.Logger, Registerer: reg}); err != nil {
		return e, err
	}
	if e.adminRefused, err = newAdminMetrics(reg); err != nil {
		return e, err
	}
	if e.reload, err = newReloader(reg); err != nil {
		return e, err
	}
	e.reload.loaded = src.Stamp
	if o.RLSListen != "" {
		rc := o.RLS
		if rc.Ready == nil {
			rc.Ready = e.Ready
		}
		if e.RLS, err = rls.New(e.Core, rc, o.Logger, reg); err != nil {
			return e, err
		}
	}
	if o.XDS.Server != "" {
		err = e.startXDS(reg)
	}
	return e, err
}

// startGlobal starts the feed of the other PoPs' counts into a table.
func (e *Edge) startGlobal(o Options, reg prometheus.Registerer) (*global.Table, error) {
	if o.GlobalStale < 0 || o.GlobalShare < 0 || o.GlobalShare > 1 {
		return nil, fmt.Errorf("edge: GlobalStale %v, GlobalShare %v: want a positive duration and a share between 0 and 1", o.GlobalStale, o.GlobalShare)
	}
	if o.GlobalMaxKeys < 0 {
		return nil, fmt.Errorf("edge: GlobalMaxKeys %d (-global-max-keys): must not be negative", o.GlobalMaxKeys)
	}
	if o.GlobalMaxSkew < 0 {
		return nil, fmt.Errorf("edge: GlobalMaxSkew %v (-global-max-skew): must not be negative", o.GlobalMaxSkew)
	}
	var key []byte
	if o.GlobalKeyFile != "" {
		var err error
		if key, err = global.LoadKey("edge: GlobalKeyFile (-global-key-file)", o.GlobalKeyFile); err != nil {
			return nil, err
		}
	}
	skew := int64(o.ClockSkew)
	t := global.NewTable(global.TableConfig{Pop: o.Pop, Stale: o.GlobalStale, MaxSkew: o.GlobalMaxSkew, MaxKeys: o.GlobalMaxKeys,
		Now: func() int64 { return time.Now().UnixNano() + skew }})
	f, err := global.NewFeed(t, global.KafkaConfig{Brokers: o.Brokers, Topic: o.GlobalTopic, TLS: o.KafkaTLS, SASL: o.KafkaSASL, Dial: o.KafkaDial, Key: key}, o.Logger, reg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	e.closers = append(e.closers, func(context.Context) error { cancel(); <-done; return nil })
	return t, nil
}

// Listen binds the traffic and admin listeners (a port 0 picks a free
// one). The admin listener serves /metrics, /healthz, /readyz and, with
// Pprof, /debug/pprof/.
func (e *Edge) Listen() error {
	var err error
	if e.ln, err = net.Listen("tcp", e.Options.Listen); err != nil {
		return fmt.Errorf("edge: listen %s: %w", e.Options.Listen, err)
	}
	if e.aln, err = net.Listen("tcp", e.Options.Admin); err != nil {
		e.ln.Close()
		return fmt.Errorf("edge: admin listen %s: %w", e.Options.Admin, err)
	}
	if e.RLS != nil {
		if e.rln, err = net.Listen("tcp", e.Options.RLSListen); err != nil {
			e.ln.Close()
			e.aln.Close()
			return fmt.Errorf("edge: RLS listen %s: %w", e.Options.RLSListen, err)
		}
		if e.Options.RLSHTTPListen != "" {
			if e.hln, err = net.Listen("tcp", e.Options.RLSHTTPListen); err != nil {
				e.ln.Close()
				e.aln.Close()
				e.rln.Close()
				return fmt.Errorf("edge: RLS HTTP listen %s: %w", e.Options.RLSHTTPListen, err)
			}
			e.rlsHTTP = &http.Server{Handler: e.RLS.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/", e.adminHandler())
	if e.Options.Pprof {
		mux.Handle("/debug/pprof/", bearer(e.Options.PprofToken, http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", bearer(e.Options.PprofToken, http.HandlerFunc(pprof.Profile)))
	}
	e.aln = capListener(e.aln, e.Options.AdminMaxConns, e.adminRefused)
	e.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: adminIdleTimeout}
	return nil
}

// Addr and AdminAddr are the listeners' addresses, after Listen.
func (e *Edge) Addr() string      { return e.ln.Addr().String() }
func (e *Edge) AdminAddr() string { return e.aln.Addr().String() }

// RLSAddr is the rate limit service's address after Listen, "" when off.
func (e *Edge) RLSAddr() string {
	if e.rln == nil {
		return ""
	}
	return e.rln.Addr().String()
}

// RLSHTTPAddr is the address of the rate limit service's HTTP port
// (/json, /healthcheck) after Listen, "" when off.
func (e *Edge) RLSHTTPAddr() string {
	if e.hln == nil {
		return ""
	}
	return e.hln.Addr().String()
}

// Serve serves traffic and the admin listener, reloads the rule files when
// they change or on SIGHUP, until ctx ends; then it finishes the requests
// in flight and closes the edge within ShutdownTimeout.
func (e *Edge) Serve(ctx context.Context) error {
	if e.ln == nil {
		if err := e.Listen(); err != nil {
			return err
		}
	}
	go e.admin.Serve(e.aln)
	e.startWatchers(ctx) // stopped by Close
	errc := make(chan error, 3)
	go func() { errc <- e.Server.Serve(e.ln) }()
	if e.RLS != nil {
		go func() {
			if err := e.RLS.Serve(e.rln); err != nil {
				errc <- fmt.Errorf("RLS: %w", err)
			}
		}()
	}
	if e.rlsHTTP != nil {
		go func() {
			if err := e.rlsHTTP.Serve(e.hln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("RLS HTTP: %w", err)
			}
		}()
	}
	var serveErr error
	select {
	case err := <-errc:
		if err != nil {
			serveErr = fmt.Errorf("edge: serve: %w", err)
		}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), e.Options.ShutdownTimeout)
	defer cancel()
	return errors.Join(serveErr, e.Close(sctx))
}

// Close stops serving (waiting for requests in flight within ctx), then
// closes what Build built in reverse order: the slots and the limiter (a
// last flush of its counts), the producer (flushing its events), the block
// cache, the store client. It is safe to call more than once and from
// several goroutines: the first call closes, the others wait for it.
func (e *Edge) Close(ctx context.Context) error {
	e.closeOnce.Do(func() { e.closeErr = e.close(ctx) })
	return e.closeErr
}

func (e *Edge) close(ctx context.Context) error {
	e.stopWatchers() // no reload while the parts close
	var errs []error
	if e.RLS != nil && e.rln != nil {
		if err := e.RLS.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.rlsHTTP != nil {
		if err := e.rlsHTTP.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if e.hln != nil {
		e.hln.Close()
	}
	if e.Server != nil && e.ln != nil {
		if err := e.Server.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if e.admin != nil {
		e.admin.Close()
	}
	for i := len(e.closers) - 1; i >= 0; i-- {
		if err := e.closers[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Rules returns the rules in force.
func (e *Edge) Rules() *rules.Rules { return e.Core.Rules() }

// LogStart logs that the edge started, with every default it took that
// changes what it does.
func (e *Edge) LogStart() {
	o := &e.Options
	store := "memory (single edge; pass -memcache to share counters)"
	if len(o.Redis.Addrs) > 0 {
		store = "redis " + strings.Join(o.Redis.Addrs, ",")
	} else if len(o.Memcache.Servers) > 0 {
		store = fmt.Sprintf("memcached, %d shards", len(o.Memcache.Servers))
	} else if o.Store != nil {
		store = "embedded"
	}
	events := "off (pass -brokers)"
	if len(o.Brokers) > 0 {
		events = strings.Join(o.Brokers, ",") + " topic " + o.Topic
	}
	rulesFrom := o.RulesFile
	if o.XDS.Server != "" {
		rulesFrom = "xds " + o.XDS.Server + " version " + cmp.Or(e.XDSVersion(), "none yet")
	} else if rulesFrom == "" {
		rulesFrom = "built-in: default-per-client, 100 per 1m per client IP"
	}
	o.Logger.Info("edge: started", "listen", e.Addr(), "admin", e.AdminAddr(), "rls", cmp.Or(e.RLSAddr(), "off (pass -rls-listen)"), "rls_http", cmp.Or(e.RLSHTTPAddr(), "off"), "mode", string(o.Server.Mode),
		"rules", rulesFrom, "store", store, "events", events, "flush_interval", o.Limiter.FlushInterval,
		"store_timeout", o.Limiter.StoreTimeout, "edge_id", o.EdgeID, "edge_id_derived", o.EdgeIDDerived,
		"concurrency", o.Server.Concurrency, "max_conns", connCap(o.Server.MaxConns), "max_conns_per_client", connCap(o.Server.MaxConnsPerClient),
		"idle_timeout", o.Server.IdleTimeout, "admin_max_conns", o.AdminMaxConns,
		"max_decision_body", decisionBody(&o.Server))
	if len(o.Brokers) > 0 && o.EventsKey == nil && o.Events == nil {
		o.Logger.Warn("edge: decision events are not signed: an aggregator with -events-key-file refuses them, and without one any writer of the topic can forge decisions (pass -events-key-file; deploy/KAFKA.md)")
	}
}

// connCap and decisionBody say the connection cap and the body bound as
// the start log shows them.
func connCap(n int) string {
	if n < 0 {
		return "off"
	}
	return strconv.Itoa(n)
}

func decisionBody(c *httpedge.Config) string {
	if c.Mode == httpedge.Proxy {
		return "none (proxy mode streams bodies)"
	}
	return strconv.Itoa(c.MaxDecisionBody)
}

// ParseServers parses memcached shards as "host:port[:weight],...".
func ParseServers(s string) ([]shardproxy.Server, error) {
	var out []shardproxy.Server
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		parts := strings.Split(f, ":")
		srv := shardproxy.Server{Addr: f}
		if len(parts) == 3 {
			w, err := strconv.Atoi(parts[2])
			if err != nil {
				return nil, fmt.Errorf("edge: memcache server %q: weight: %w", f, err)
			}
			srv.Addr, srv.Weight = parts[0]+":"+parts[1], w
		}
		out = append(out, srv)
	}
	return out, nil
}

// Memcache returns the edge's memcached client, nil without memcached.
func (e *Edge) Memcache() *shardproxy.Client { return e.memcache }

// bearer requires "Authorization: Bearer <token>" before h when token is
// set, compared in constant time.
func bearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="poplimit admin"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
