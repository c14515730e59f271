package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/kafkaauth"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rls/xds"
	"github.com/poplimit/poplimit/shardproxy"
)

// parseFlags turns the command line into edge.Options, with -envoy-env
// reading the process's environment.
func parseFlags(args []string, stderr io.Writer) (edge.Options, string, error) {
	o, ex, err := parseFlagsEnv(args, stderr, os.Environ())
	return o, ex.logLevel, err
}

// flagExtras are the settings of the command line that are not
// edge.Options: the log's, -envoy-env's, and files read once parsed.
type flagExtras struct {
	logLevel, logFormat string
	envoyEnv            bool
	envNotes            []string // -envoy-env's lines to log at start
	rlsTLS              rlsTLSFlags
	redisTLS            redisTLSFlags
}

// parseFlagsEnv turns the command line into edge.Options; with
// -envoy-env, env (NAME=value lines) sets what no flag given does.
func parseFlagsEnv(args []string, stderr io.Writer, env []string) (edge.Options, flagExtras, error) {
	var ex flagExtras
	o := edge.DefaultOptions()
	var ka kafkaauth.Flags
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &o.Server
	fs.StringVar(&o.Listen, "listen", o.Listen, "address for rate-limited traffic")
	fs.StringVar(&o.Admin, "admin", o.Admin, "address for /metrics, /healthz and /readyz")
	fs.StringVar(&o.RLSListen, "rls-listen", "", "address for Envoy's rate limit service (gRPC; rules from envoyproxy/ratelimit files: -rules FILE or DIR); default off")
	fs.StringVar(&o.RLS.Headers, "rls-headers", rls.HeadersDraft, `response_headers_to_add of the rate limit service: "draft" (RateLimit-Policy, RateLimit, Retry-After), "ratelimit" (envoyproxy/ratelimit's RateLimit-Limit/-Remaining/-Reset) or "none"`)
	fs.BoolVar(&o.RLS.Reflection, "rls-reflection", false, "serve gRPC reflection on the rate limit service")
	fs.Var(textVar[httpedge.Role]{&c.Mode}, "mode", `"decision" (answer 200/429, Envoy ext_authz) or "proxy" (forward allowed requests to -upstream)`)
	fs.StringVar(&c.Upstream, "upstream", c.Upstream, "upstream host:port in proxy mode, or several comma-separated (round-robin among the healthy ones)")
	fs.DurationVar(&c.UpstreamTimeout, "upstream-timeout", c.UpstreamTimeout, "bound of a proxied request's whole upstream exchange, streamed response body included (504 past it)")
	fs.IntVar(&c.UpstreamConns, "upstream-conns", c.UpstreamConns, "connections to each upstream at most")
	fs.DurationVar(&c.UpstreamDialTimeout, "upstream-dial-timeout", c.UpstreamDialTimeout, "time to connect to an upstream")
	fs.StringVar(&c.UpstreamHealthPath, "upstream-health-path", "", "path each upstream must answer 2xx/3xx to with GET (e.g. /healthz); turns on active health checks (default off)")
	fs.DurationVar(&c.UpstreamHealthInterval, "upstream-health-interval", c.UpstreamHealthInterval, "time between health checks of an upstream")
	fs.DurationVar(&c.UpstreamHealthTimeout, "upstream-health-timeout", c.UpstreamHealthTimeout, "time a health check may take")
	fs.IntVar(&c.UpstreamHealthThreshold, "upstream-health-threshold", c.UpstreamHealthThreshold, "failed health checks in a row that make an upstream skipped (one pass brings it back)")
	fs.IntVar(&c.UpstreamRetries, "upstream-retries", c.UpstreamRetries, "times an idempotent request is sent again, to the next upstream, after a connection error (-1: never)")
	fs.StringVar(&c.UpstreamIdempotencyHeader, "upstream-idempotency-header", c.UpstreamIdempotencyHeader, `header that makes a POST or PATCH retryable ("-": none)`)
	// Rate limit configuration over xDS (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW).
	x := &o.XDS
	fs.StringVar(&x.Server, "rls-xds", "", "xDS management server host:port (gRPC): take the rate limit configuration from it (state of the world, RateLimitConfig resources) instead of -rules; default off")
	fs.StringVar(&x.NodeID, "rls-xds-node-id", xds.DefaultNodeID, "node id sent to the xDS management server")
	fs.Func("rls-xds-node-metadata", "node metadata sent to the xDS management server: key=value,key=value", func(s string) (err error) {
		x.NodeMetadata, err = xds.ParseMetadata(s)
		return err
	})
	fs.BoolVar(&x.ForceStart, "rls-xds-force-start", false, "serve before the first configuration from the xDS management server (default: start-up waits for it)")
	fs.BoolVar(&x.TLS, "rls-xds-tls", false, "talk TLS to the xDS management server (system CAs, or -rls-xds-tls-ca)")
	fs.StringVar(&x.CAFile, "rls-xds-tls-ca", "", "PEM CA of the xDS management server's certificate (implies -rls-xds-tls)")
	fs.StringVar(&x.CertFile, "rls-xds-tls-cert", "", "PEM client certificate for the xDS management server (with -rls-xds-tls-key; implies -rls-xds-tls)")
	fs.StringVar(&x.KeyFile, "rls-xds-tls-key", "", "PEM private key of -rls-xds-tls-cert")
	fs.StringVar(&x.ServerName, "rls-xds-tls-server-name", "", "name the xDS management server's certificate must carry (default: the host of -rls-xds; implies -rls-xds-tls)")
	fs.DurationVar(&x.BackoffInitial, "rls-xds-backoff-initial", xds.DefaultBackoffInitial, "first wait before a new stream to the xDS management server after one failed (doubling, jittered)")
	fs.DurationVar(&x.BackoffMax, "rls-xds-backoff-max", xds.DefaultBackoffMax, "longest wait between streams to the xDS management server")
	fs.StringVar(&o.RulesFile, "rules", "", "rules YAML file (or envoyproxy/ratelimit files: one, or a directory of them), reloaded on change and SIGHUP (default: the built-in rule)")
	fs.StringVar(&o.OverridesFile, "overrides", "", "key → tier overrides YAML file")
	fs.DurationVar(&o.ReloadSettle, "reload-settle", o.ReloadSettle, "apply changed rules files only once their contents stayed the same this long (read twice this far apart), on change and on SIGHUP; negative: at once")
	fs.Int64Var(&o.RulesMaxBytes, "rules-max-bytes", o.RulesMaxBytes, "largest rules file, overrides file and envoyproxy/ratelimit file; a larger one is refused unread")
	fs.IntVar(&o.EdgeID, "edge-id", o.EdgeID, "this edge's id in decision events (0-65535); default: derived from the host name, -listen and -pop (1-65535)")
	fs.Func("trusted-proxies", "comma-separated CIDRs whose forwarding headers are believed", func(s string) (err error) {
		c.TrustedProxies, err = clientaddr.ParsePrefixes(s)
		return err
	})
	fs.Var(textVar[clientaddr.Forwarding]{&c.Forwarding}, "forwarded-header", `header trusted proxies append client hops to: "x-forwarded-for" or "forwarded" (RFC 7239); every line counts`)
	fs.StringVar(&c.ForwardedMethodHeader, "forwarded-method-header", "", "header a trusted proxy sets to the request's method in decision mode (e.g. X-Forwarded-Method, for Caddy's forward_auth)")
	fs.StringVar(&c.ClientIPHeader, "client-ip-header", "", "header a trusted proxy sets to the client IP (e.g. CF-Connecting-IP)")
	fs.StringVar(&c.CheckPrefix, "check-prefix", c.CheckPrefix, "path prefix stripped from checks in decision mode")
	fs.IntVar(&c.MaxHeaderSize, "max-header-bytes", c.MaxHeaderSize, "largest request head; larger gets 431")
	fs.IntVar(&c.MaxDecisionBody, "max-decision-body-bytes", c.MaxDecisionBody, "largest request body in decision mode (checks and /_poplimit/decide); larger gets 413 before any of it is read")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "connections served at once, one file descriptor each; beyond, 503")
	fs.IntVar(&c.MaxConnsPerClient, "max-conns-per-client", c.MaxConnsPerClient, "connections one client IP (IPv6: its /64) holds open at most, -trusted-proxies exempt; beyond, closed (429 on plain HTTP); -1: no cap")
	fs.IntVar(&o.BodyKeyBytes, "body-key-bytes", o.BodyKeyBytes, "most of a request body read for rules keyed by a form field or JSON member (form:, json:), only for requests such a rule matches; a longer body falls back as the rule's missing_key says")
	fs.DurationVar(&o.RetryJitter, "retry-jitter", o.RetryJitter, "most random time added to a refusal's Retry-After, by every front end (HTTP, decision endpoint, rate limit service); negative: none")
	// Counting rules (count:) in decision mode: reservations wait for
	// POST /_poplimit/settle.
	fs.DurationVar(&o.SettleTimeout, "settle-timeout", o.SettleTimeout, "how long a decision-mode reservation of a counting rule waits for its settle call; one never settled keeps its units (at most 24h)")
	fs.IntVar(&o.MaxReservations, "max-reservations", o.MaxReservations, "decision-mode reservations held for their settle call at most, in the order issued; past it a new one keeps its units at once")
	fs.IntVar(&c.MaxConns, "max-conns", c.MaxConns, "traffic connections open at most (0: the open-file limit less the admin listener's, upstream pools' and a reserve of 256 descriptors, at least half of it, at most -concurrency); from 3/4 of it idle connections are closed longest-idle first and per-client caps tighten; -1: no cap")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "how long a kept-alive traffic connection may wait for its next request")
	fs.IntVar(&o.AdminMaxConns, "admin-max-conns", o.AdminMaxConns, "admin listener connections open at most, its descriptors kept out of -max-conns")
	fs.Func("memcache", "memcached shards host:port[:weight],... (default: in-memory store, single edge)", func(s string) (err error) {
		o.Memcache.Servers, err = edge.ParseServers(s)
		return err
	})
	fs.Var(textVar[shardproxy.Hash]{&o.Memcache.Hash}, "hash", "key hash of the ketama ring, as nutcracker's hash:")
	fs.Var(textVar[shardproxy.Protocol]{&o.Memcache.Protocol}, "memcache-protocol", `"text", or "meta" (memcached ≥ 1.6's ma: one round trip for a new counter; not through nutcracker)`)
	fs.Func("redis", "Redis host:port,... (a server, or Redis Cluster nodes) as the shared store instead of -memcache", func(s string) error {
		o.Redis.Addrs = strings.Split(s, ",")
		return nil
	})
	fs.Var(textVar[redisstore.Topology]{&o.Redis.Mode}, "redis-mode", `"" (ask the servers), "standalone", "cluster" or "sentinel" (-redis names the sentinels)`)
	fs.StringVar(&o.Redis.Username, "redis-user", "", "Redis ACL user")
	fs.Func("redis-password-file", "file holding the Redis password", func(f string) (err error) {
		o.Redis.Password, err = readToken(f)
		return err
	})
	fs.Func("redis-tls-ca", "PEM CA file: talk to Redis over TLS, verifying its certificate with this CA", func(f string) error {
		pem, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("no certificate in %s", f)
		}
		o.Redis.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		return nil
	})
	// Redis Sentinel: with -redis-mode sentinel, -redis names the sentinels.
	fs.StringVar(&o.Redis.SentinelMaster, "redis-sentinel-master", "", "with -redis-mode sentinel: the master set's name the sentinels watch (their sentinel monitor NAME)")
	fs.StringVar(&o.Redis.SentinelUsername, "redis-sentinel-user", "", "ACL user of the sentinels (-redis-user is the master's)")
	fs.Func("redis-sentinel-password-file", "file holding the sentinels' password (-redis-password-file is the master's)", func(f string) (err error) {
		o.Redis.SentinelPassword, err = readToken(f)
		return err
	})
	fs.DurationVar(&o.Limiter.StoreTimeout, "store-timeout", o.Limiter.StoreTimeout, "timeout of one store operation")
	fs.DurationVar(&o.Limiter.FlushInterval, "flush-interval", o.Limiter.FlushInterval, "how often coalesced increments go to the store")
	fs.DurationVar(&o.Limiter.MaxDefer, "max-defer", 0, "let a key held by this edge alone and far from its limit keep its increments unsent this long at most (a sixteenth of its window at most, never past its end), so one increment carries many requests; a key dealt over several edges goes at every flush (0: 1s; negative: every key at every flush)")
	fs.BoolVar(&o.Limiter.GuessPeers, "guess-peers", o.Limiter.GuessPeers, "with -async-near-limit: count the units other edges likely admitted on a key since this edge's last reply, at their recent rate: fewer over-admissions when clients are dealt over every edge, some refusals within the limit")
	fs.BoolVar(&o.Limiter.AsyncNearLimit, "async-near-limit", o.Limiter.AsyncNearLimit, "keep every async decision local, even of a key dealt over several edges near its limit (by default such a decision, when what the other edges may have admitted unseen could fill the key's room, takes one store round trip)")
	fs.IntVar(&o.Limiter.MaxKeys, "max-keys", o.Limiter.MaxKeys, "keys with a local view at most")
	fs.DurationVar(&o.Limiter.NewKeyWait, "new-key-wait", 0, "how long a request waits for the shared count of a key new to this edge (0: the store timeout; negative: never)")
	fs.Int64Var(&o.BlockCache.MaxEntries, "block-cache-entries", o.BlockCache.MaxEntries, "blocked keys remembered at most")
	fs.Func("brokers", "Kafka brokers host:port,... for decision events (default: none)", func(s string) error {
		o.Brokers = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&o.Topic, "topic", o.Topic, "Kafka topic of decision events")
	fs.BoolVar(&ka.TLS, "kafka-tls", false, "talk TLS to the brokers (system CAs, or -kafka-tls-ca)")
	fs.StringVar(&ka.CAFile, "kafka-tls-ca", "", "PEM CA of the brokers' certificates (implies -kafka-tls)")
	fs.StringVar(&ka.Mechanism, "kafka-sasl", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512")
	fs.StringVar(&ka.User, "kafka-user", "", "SASL user")
	fs.StringVar(&ka.PasswordFile, "kafka-password-file", "", "file holding the SASL password")
	fs.Func("events-key-file", "file holding the key that signs decision events (at least 32 bytes, the aggregator's -events-key-file); default: unsigned", func(f string) (err error) {
		o.EventsKey, err = pipeline.ReadKeyFile(f)
		return err
	})
	fs.Float64Var(&o.Sample, "sample", o.Sample, "fraction of keys whose events are sent (0-1]")
	fs.StringVar(&o.Pop, "pop", o.Pop, "this edge's PoP, named in its events (at most 32 bytes); with -brokers, rules of scope global hold across PoPs")
	fs.StringVar(&o.GlobalTopic, "global-topic", o.GlobalTopic, "Kafka topic of the other PoPs' counts, published by the aggregator (one partition)")
	fs.DurationVar(&o.GlobalStale, "global-stale", o.GlobalStale, "without the publisher's heartbeat this long, the edge is cut off from the other PoPs and holds global rules to -global-share")
	fs.Float64Var(&o.GlobalShare, "global-share", o.GlobalShare, "part of a global rule's limit this PoP admits while cut off from the other PoPs' counts (0-1]")
	fs.StringVar(&o.GlobalKeyFile, "global-key-file", o.GlobalKeyFile, "file of the secret (at least 32 bytes) the aggregators sign the global topic with; messages not signed with it are dropped (default: unsigned taken, with a warning; production needs it)")
	fs.DurationVar(&o.GlobalMaxSkew, "global-max-skew", o.GlobalMaxSkew, "global topic messages stamped, or counts dated, further ahead of this edge's clock are dropped")
	fs.IntVar(&o.GlobalMaxKeys, "global-max-keys", o.GlobalMaxKeys, "most keys of the other PoPs' counts held (about 200 B each); a key the full table cannot hold is held to -global-share")
	fs.StringVar(&ex.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.ClockSkew, "clock-skew", 0, "add this to the clock: a fault-test hook, at most ±1m")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate of the traffic listener (with -tls-key): TLS 1.2+, reloaded on change")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key of -tls-cert")
	fs.Func("decide-token-file", "file holding the bearer token that turns on POST /_poplimit/decide (decision mode; off without it)", func(f string) (err error) {
		c.DecideToken, err = readToken(f)
		return err
	})
	fs.Func("pprof-token-file", "file holding the bearer token /debug/pprof/ requires", func(f string) (err error) {
		o.PprofToken, err = readToken(f)
		return err
	})
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "time to finish requests and flush on SIGTERM")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof/ on the admin listener")
	envoyFlags(fs, &o, &ex) // envoyproxy/ratelimit's settings (envoyflags.go)
	if err := fs.Parse(args); err != nil {
		return o, ex, err
	}
	var err error
	if o.KafkaTLS, o.KafkaSASL, err = ka.Build(); err != nil {
		return o, ex, fmt.Errorf("edge: %w", err)
	}
	if fs.NArg() > 0 {
		return o, ex, fmt.Errorf("edge: unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if ex.envoyEnv {
		if ex.envNotes, err = applyEnvoyEnv(env, fs, given, &o, &ex); err != nil {
			return o, ex, err
		}
	}
	if err := ex.build(&o); err != nil {
		return o, ex, err
	}
	if !given["edge-id"] {
		host, _ := os.Hostname()
		o.EdgeID, o.EdgeIDDerived = defaultEdgeID(host, o.Listen, o.Pop, os.Getpid()), true
	}
	return o, ex, nil
}

// defaultEdgeID is an edge's id when -edge-id is not given: 1 to 65535,
// from a hash of the host name, the listen address and the PoP. Edges on
// different hosts, or on one host at different addresses, get different
// ids (but for a collision of the hash: about n²/131,070 for n edges, so
// 0.2 % for ten, 2 % for fifty; set -edge-id where the figures must never
// merge), and an edge restarted with the same flags on the same host keeps
// its id. With -listen on port 0 the port is chosen at start, so the
// process id is mixed in too and the id changes with each start.
func defaultEdgeID(host, listen, pop string, pid int) int {
	s := host + "\x00" + listen + "\x00" + pop
	if _, port, err := net.SplitHostPort(listen); err != nil || port == "0" {
		s += "\x00" + strconv.Itoa(pid)
	}
	return 1 + int(xxhash.Sum64String(s)%65535)
}

// readToken reads a secret from a file, so that it is not on the command
// line for every process listing to see.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	return strings.TrimSpace(string(b)), err
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
