// Command edge is one poplimit edge server: it decides every request against
// the rate-limit rules, from a local view of counters shared through a
// sharded memcached pool, and streams its decisions to Kafka.
//
// With no flags it starts a working edge on 127.0.0.1:7070 (decision mode,
// in-memory store, the built-in rule of 100 requests per minute per client
// IP) with metrics on 127.0.0.1:7071, and logs every default it took.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	listen, admin   string
	edge            edge.Config
	trusted         string
	memcache        string
	hash            string
	storeTimeout    time.Duration
	flushInterval   time.Duration
	maxKeys         int
	newKeyWait      time.Duration
	blockEntries    int
	brokers, topic  string
	sample          float64
	logLevel        string
	clockSkew       time.Duration
	shutdownTimeout time.Duration
	pprof           bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7070", "address for rate-limited traffic")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:7071", "address for /metrics, /healthz and /readyz")
	mode := fs.String("mode", "decision", `"decision" (answer 200/429, Envoy ext_authz) or "proxy" (forward allowed requests to -upstream)`)
	fs.StringVar(&o.edge.Upstream, "upstream", "", "upstream host:port in proxy mode")
	fs.DurationVar(&o.edge.UpstreamTimeout, "upstream-timeout", 10*time.Second, "upstream timeout (504 past it)")
	fs.StringVar(&o.edge.RulesFile, "rules", "", "rules YAML file, reloaded on change and SIGHUP (default: the built-in rule)")
	fs.StringVar(&o.edge.OverridesFile, "overrides", "", "key → tier overrides YAML file")
	fs.IntVar(&o.edge.EdgeID, "edge-id", 0, "this edge's id in decision events (0-65535)")
	fs.StringVar(&o.trusted, "trusted-proxies", "", "comma-separated CIDRs whose X-Forwarded-For is believed")
	fwd := fs.String("forwarded-header", string(edge.XForwardedFor), `header trusted proxies append client hops to: "x-forwarded-for" or "forwarded" (RFC 7239); every line counts`)
	fs.StringVar(&o.edge.ClientIPHeader, "client-ip-header", "", "header a trusted proxy sets to the client IP (e.g. CF-Connecting-IP)")
	fs.StringVar(&o.edge.CheckPrefix, "check-prefix", "/check", "path prefix stripped from checks in decision mode")
	fs.IntVar(&o.edge.MaxHeaderSize, "max-header-bytes", 8192, "largest request head; larger gets 431")
	fs.IntVar(&o.edge.Concurrency, "concurrency", 65536, "requests in flight at most; beyond, 503")
	fs.DurationVar(&o.edge.RetryJitter, "retry-jitter", 2*time.Second, "most jitter added to Retry-After")
	fs.StringVar(&o.memcache, "memcache", "", "memcached shards host:port[:weight],... (default: in-memory store, single edge)")
	fs.StringVar(&o.hash, "hash", "fnv1a_64", "key hash of the ketama ring, as nutcracker's hash:")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 100*time.Millisecond, "timeout of one store operation")
	fs.DurationVar(&o.flushInterval, "flush-interval", 5*time.Millisecond, "how often coalesced increments go to the store")
	fs.IntVar(&o.maxKeys, "max-keys", 1<<20, "keys with a local view at most")
	fs.DurationVar(&o.newKeyWait, "new-key-wait", 0, "how long a request waits for the shared count of a key new to this edge (0: the store timeout; negative: never)")
	fs.IntVar(&o.blockEntries, "block-cache-entries", 1<<20, "blocked keys remembered at most")
	fs.StringVar(&o.brokers, "brokers", "", "Kafka brokers host:port,... for decision events (default: none)")
	fs.StringVar(&o.topic, "topic", "poplimit.decisions", "Kafka topic of decision events")
	fs.Float64Var(&o.sample, "sample", 1, "fraction of keys whose events are sent (0-1]")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.clockSkew, "clock-skew", 0, "add this to the clock (for fault tests only)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "time to finish requests and flush on SIGTERM")
	fs.BoolVar(&o.pprof, "pprof", false, "serve /debug/pprof/ on the admin listener")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("edge: unexpected arguments %q", fs.Args())
	}
	o.edge.Mode = edge.Mode(*mode)
	o.edge.Forwarding = edge.Forwarding(*fwd)
	var err error
	if o.edge.TrustedProxies, err = edge.ParsePrefixes(o.trusted); err != nil {
		return nil, err
	}
	return o, nil
}

// parseServers parses "host:port[:weight],...".
func parseServers(s string) ([]shardproxy.Server, error) {
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
				return nil, fmt.Errorf("edge: -memcache %q: weight: %w", f, err)
			}
			srv.Addr, srv.Weight = parts[0]+":"+parts[1], w
		}
		out = append(out, srv)
	}
	return out, nil
}

// run builds the edge from args, serves until ctx ends, then stops the parts
// in reverse order. ready, when not nil, receives the listeners' addresses.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- [2]string) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("edge: -log-level %q: %w", o.logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	rules, err := edge.LoadFiles(o.edge.RulesFile, o.edge.OverridesFile)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The store: memcached shards, or memory for a lone edge.
	var store window.Store
	var healthy func() bool
	if o.memcache != "" {
		servers, err := parseServers(o.memcache)
		if err != nil {
			return err
		}
		mc, err := shardproxy.New(shardproxy.Config{Servers: servers, Hash: shardproxy.Hash(o.hash), Timeout: o.storeTimeout}, reg)
		if err != nil {
			return err
		}
		defer mc.Close()
		ms := &edge.MemcacheStore{Client: mc}
		store, healthy = ms, ms.Healthy
	} else {
		store = window.NewMemStore(nil)
	}
	lim, err := window.New(window.Config{FlushInterval: o.flushInterval, StoreTimeout: o.storeTimeout, MaxKeys: o.maxKeys, NewKeyWait: o.newKeyWait, Registerer: reg}, store)
	if err != nil {
		return err
	}
	lim.Start() // stopped by the edge's Shutdown, with a last flush
	slots := window.NewSlots(window.SlotsConfig{StoreTimeout: o.storeTimeout}, store)
	slots.Start(0, nil)
	defer slots.Close()
	blocks, err := blockcache.New(blockcache.Config{MaxEntries: int64(o.blockEntries)}, reg)
	if err != nil {
		return err
	}
	defer blocks.Close()
	var events edge.Emitter
	if o.brokers != "" {
		pc := pipeline.DefaultProducerConfig()
		pc.Brokers = strings.Split(o.brokers, ",")
		pc.Topic = o.topic
		pc.SampleRate = o.sample
		prod, err := pipeline.NewProducer(pc, reg)
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
			defer cancel()
			if err := prod.Close(cctx); err != nil {
				log.Warn("edge: closing the event producer", "err", err)
			}
		}()
		events = prod
	}
	srv, err := edge.New(o.edge, rules, edge.Deps{Limiter: lim, Blocks: blocks, Slots: slots, Events: events,
		StoreHealthy: healthy, Logger: log, Registerer: reg, ClockSkew: o.clockSkew})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("edge: -listen: %w", err)
	}
	aln, err := net.Listen("tcp", o.admin)
	if err != nil {
		ln.Close()
		return fmt.Errorf("edge: -admin: %w", err)
	}
	adminMux := http.NewServeMux()
	adminMux.Handle("/", srv.AdminHandler(reg))
	if o.pprof {
		adminMux.HandleFunc("/debug/pprof/", pprof.Index)
		adminMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	admin := &http.Server{Handler: adminMux, ReadHeaderTimeout: 5 * time.Second}
	go admin.Serve(aln)
	defer admin.Close()

	store0 := "memory (single edge; pass -memcache to share counters)"
	if o.memcache != "" {
		store0 = "memcached " + o.memcache
	}
	events0 := "off (pass -brokers)"
	if o.brokers != "" {
		events0 = o.brokers + " topic " + o.topic
	}
	log.Info("edge: started", "listen", ln.Addr().String(), "admin", aln.Addr().String(), "mode", string(o.edge.Mode),
		"rules", nameOr(o.edge.RulesFile, "built-in: default-per-client, 100 per 1m per client IP"),
		"store", store0, "events", events0, "flush_interval", o.flushInterval, "store_timeout", o.storeTimeout,
		"edge_id", o.edge.EdgeID)
	if ready != nil {
		ready <- [2]string{ln.Addr().String(), aln.Addr().String()}
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	if o.edge.RulesFile != "" || o.edge.OverridesFile != "" {
		go srv.WatchFiles(wctx, hup)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("edge: serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("edge: shutting down: finishing requests and flushing counters")
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("edge: shutdown: %w", err)
	}
	log.Info("edge: stopped")
	return nil
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
