// Command edge is one poplimit edge server: it decides every request against
// the rate-limit rules, from a local view of counters shared through a
// sharded memcached pool, and streams its decisions to Kafka.
//
// With no flags it starts a working edge on 127.0.0.1:7070 (decision mode,
// in-memory store, the built-in rule of 100 requests per minute per client
// IP) with metrics on 127.0.0.1:7071, and logs every default it took. The
// flags set the fields of edge.Options, whose defaults they show.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/shardproxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// parseFlags turns the command line into edge.Options.
func parseFlags(args []string, stderr io.Writer) (edge.Options, string, error) {
	o := edge.DefaultOptions()
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &o.Server
	fs.StringVar(&o.Listen, "listen", o.Listen, "address for rate-limited traffic")
	fs.StringVar(&o.Admin, "admin", o.Admin, "address for /metrics, /healthz and /readyz")
	fs.Var(textVar[edge.Mode]{&c.Mode}, "mode", `"decision" (answer 200/429, Envoy ext_authz) or "proxy" (forward allowed requests to -upstream)`)
	fs.StringVar(&c.Upstream, "upstream", c.Upstream, "upstream host:port in proxy mode")
	fs.DurationVar(&c.UpstreamTimeout, "upstream-timeout", c.UpstreamTimeout, "upstream timeout (504 past it)")
	fs.StringVar(&c.RulesFile, "rules", "", "rules YAML file, reloaded on change and SIGHUP (default: the built-in rule)")
	fs.StringVar(&c.OverridesFile, "overrides", "", "key → tier overrides YAML file")
	fs.IntVar(&c.EdgeID, "edge-id", c.EdgeID, "this edge's id in decision events (0-65535)")
	fs.Func("trusted-proxies", "comma-separated CIDRs whose forwarding headers are believed", func(s string) (err error) {
		c.TrustedProxies, err = edge.ParsePrefixes(s)
		return err
	})
	fs.Var(textVar[edge.Forwarding]{&c.Forwarding}, "forwarded-header", `header trusted proxies append client hops to: "x-forwarded-for" or "forwarded" (RFC 7239); every line counts`)
	fs.StringVar(&c.ForwardedMethodHeader, "forwarded-method-header", "", "header a trusted proxy sets to the request's method in decision mode (e.g. X-Forwarded-Method, for Caddy's forward_auth)")
	fs.StringVar(&c.ClientIPHeader, "client-ip-header", "", "header a trusted proxy sets to the client IP (e.g. CF-Connecting-IP)")
	fs.StringVar(&c.CheckPrefix, "check-prefix", c.CheckPrefix, "path prefix stripped from checks in decision mode")
	fs.IntVar(&c.MaxHeaderSize, "max-header-bytes", c.MaxHeaderSize, "largest request head; larger gets 431")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "requests in flight at most; beyond, 503")
	fs.DurationVar(&c.RetryJitter, "retry-jitter", c.RetryJitter, "most jitter added to Retry-After")
	fs.Func("memcache", "memcached shards host:port[:weight],... (default: in-memory store, single edge)", func(s string) (err error) {
		o.Memcache.Servers, err = edge.ParseServers(s)
		return err
	})
	fs.Var(textVar[shardproxy.Hash]{&o.Memcache.Hash}, "hash", "key hash of the ketama ring, as nutcracker's hash:")
	fs.Var(textVar[shardproxy.Protocol]{&o.Memcache.Protocol}, "memcache-protocol", `"text", or "meta" (memcached ≥ 1.6's ma: one round trip for a new counter; not through nutcracker)`)
	fs.DurationVar(&o.Limiter.StoreTimeout, "store-timeout", o.Limiter.StoreTimeout, "timeout of one store operation")
	fs.DurationVar(&o.Limiter.FlushInterval, "flush-interval", o.Limiter.FlushInterval, "how often coalesced increments go to the store")
	fs.IntVar(&o.Limiter.MaxKeys, "max-keys", o.Limiter.MaxKeys, "keys with a local view at most")
	fs.DurationVar(&o.Limiter.NewKeyWait, "new-key-wait", 0, "how long a request waits for the shared count of a key new to this edge (0: the store timeout; negative: never)")
	fs.Int64Var(&o.BlockCache.MaxEntries, "block-cache-entries", o.BlockCache.MaxEntries, "blocked keys remembered at most")
	fs.Func("brokers", "Kafka brokers host:port,... for decision events (default: none)", func(s string) error {
		o.Brokers = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&o.Topic, "topic", o.Topic, "Kafka topic of decision events")
	fs.Float64Var(&o.Sample, "sample", o.Sample, "fraction of keys whose events are sent (0-1]")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.ClockSkew, "clock-skew", 0, "add this to the clock (for fault tests only)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "time to finish requests and flush on SIGTERM")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof/ on the admin listener")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	if fs.NArg() > 0 {
		return o, "", fmt.Errorf("edge: unexpected arguments %q", fs.Args())
	}
	return o, *logLevel, nil
}

// textVar is a flag.Value over a string type.
type textVar[T ~string] struct{ p *T }

func (v textVar[T]) String() string {
	if v.p == nil {
		return ""
	}
	return string(*v.p)
}
func (v textVar[T]) Set(s string) error { *v.p = T(s); return nil }

// run builds the edge from args and serves until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, logLevel, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("edge: -log-level %q: %w", logLevel, err)
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	e, err := edge.Build(o)
	if err != nil {
		return err
	}
	if err := e.Listen(); err != nil {
		e.Close(context.Background())
		return err
	}
	e.LogStart()
	return e.Serve(ctx)
}
