package main

// -envoy-env: envoyproxy/ratelimit's environment variables, read as its
// src/settings/settings.go reads them (names, defaults, parsing), each
// mapped to the flag that does the same in poplimit, or refused at start
// with a message naming it when poplimit cannot do what it asks, or logged
// once when it changes nothing poplimit answers. Explicit flags win over
// the environment. docs/CONFIGURATION.md, "envoyproxy/ratelimit's
// environment", lists every variable.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/rls"
)

// envHow is what -envoy-env does with a variable.
type envHow int

const (
	// envMapped: the value sets the flags named (unless given explicitly).
	envMapped envHow = iota
	// envDefaultOnly: poplimit does what the default says and nothing else;
	// another value ends start-up with the reason.
	envDefaultOnly
	// envLogged: the variable changes nothing poplimit answers (statistics
	// sinks, pools, timings of reconnection); when set it is logged once.
	envLogged
	// envFalseOnly: a boolean poplimit honours as false only; set to true
	// it ends start-up with the reason (unset, its default applies
	// silently: USE_STATSD's default true sends to no one when no statsd
	// listens).
	envFalseOnly
)

// envoyVar is one variable of envoyproxy/ratelimit's settings.
type envoyVar struct {
	name  string
	def   string   // envoyproxy/ratelimit's default ("" for none)
	how   envHow   //
	flags []string // the poplimit flags it maps to (an explicit one wins)
	why   string   // envDefaultOnly: why another value is refused; envLogged: what poplimit does instead
}

// envoyVars is every variable of envoyproxy/ratelimit's
// src/settings/settings.go, in its order, with its default.
var envoyVars = []envoyVar{
	// Listeners.
	{"HOST", "0.0.0.0", envMapped, []string{"rls-http-listen"}, ""},
	{"PORT", "8080", envMapped, []string{"rls-http-listen"}, ""},
	{"DEBUG_HOST", "0.0.0.0", envMapped, []string{"admin"}, ""},
	{"DEBUG_PORT", "6070", envMapped, []string{"admin"}, ""},
	{"GRPC_UDS", "", envDefaultOnly, nil, "poplimit serves gRPC on TCP only (GRPC_HOST, GRPC_PORT)"},
	{"GRPC_HOST", "0.0.0.0", envMapped, []string{"rls-listen"}, ""},
	{"GRPC_PORT", "8081", envMapped, []string{"rls-listen"}, ""},
	{"GRPC_MAX_CONNECTION_AGE", "24h", envMapped, []string{"rls-max-conn-age"}, ""},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", envMapped, []string{"rls-max-conn-age-grace"}, ""},
	{"GRPC_SERVER_USE_TLS", "false", envMapped, []string{"rls-tls-cert", "rls-tls-key"}, ""},
	{"GRPC_SERVER_TLS_CERT", "", envMapped, []string{"rls-tls-cert"}, ""},
	{"GRPC_SERVER_TLS_KEY", "", envMapped, []string{"rls-tls-key"}, ""},
	{"GRPC_CLIENT_TLS_CACERT", "", envMapped, []string{"rls-tls-client-ca"}, ""},
	{"GRPC_CLIENT_TLS_SAN", "", envMapped, []string{"rls-tls-client-san"}, ""},
	{"LOG_LEVEL", "WARN", envMapped, []string{"log-level"}, ""},
	{"LOG_FORMAT", "text", envMapped, []string{"log-format"}, ""},

	// Where the configuration comes from.
	{"CONFIG_TYPE", "FILE", envMapped, []string{"rules", "rls-xds"}, ""},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", envMapped, []string{"rls-xds-force-start"}, ""},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", envMapped, []string{"rls-xds-node-id"}, ""},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", envMapped, []string{"rls-xds-node-metadata"}, ""},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", envMapped, []string{"rls-xds"}, ""},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", envLogged, nil, "the xDS client reconnects with its own backoff"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", envDefaultOnly, nil, "poplimit's xDS client sends no extra headers"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", envMapped, []string{"rls-xds-tls"}, ""},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", envMapped, []string{"rls-xds-tls-cert"}, ""},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", envMapped, []string{"rls-xds-tls-key"}, ""},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", envMapped, []string{"rls-xds-tls-ca"}, ""},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", envMapped, []string{"rls-xds-tls-server-name"}, ""},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", envMapped, []string{"rls-xds-backoff-initial"}, ""},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", envMapped, []string{"rls-xds-backoff-max"}, ""},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", envLogged, nil, "the xDS client doubles its wait, jittered"},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", envLogged, nil, "the xDS client always jitters its wait"},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", envLogged, nil, "the xDS client takes gRPC's default message size"},

	// Statistics.
	{"USE_DOG_STATSD", "false", envDefaultOnly, nil, "poplimit exports Prometheus metrics only, at /metrics on the debug port (DEBUG_HOST:DEBUG_PORT, -admin)"},
	{"USE_DOG_STATSD_MOGRIFIERS", "", envLogged, nil, "no DogStatsD: Prometheus metrics at /metrics on -admin"},
	{"USE_STATSD", "true", envFalseOnly, nil, "poplimit exports no statsd: its metrics are Prometheus's, at /metrics on the debug port (DEBUG_HOST:DEBUG_PORT, -admin); set USE_STATSD=false"},
	{"STATSD_HOST", "localhost", envLogged, nil, "no statsd: Prometheus metrics at /metrics on -admin"},
	{"STATSD_PORT", "8125", envLogged, nil, "no statsd: Prometheus metrics at /metrics on -admin"},
	{"EXTRA_TAGS", "", envLogged, nil, "metrics carry poplimit's own labels"},
	{"STATS_FLUSH_INTERVAL", "10s", envLogged, nil, "Prometheus metrics are read when scraped"},
	{"DISABLE_STATS", "false", envLogged, nil, "Prometheus metrics are served on -admin all the same"},
	{"USE_PROMETHEUS", "false", envMapped, []string{"admin"}, ""},
	{"PROMETHEUS_ADDR", ":9090", envMapped, []string{"admin"}, ""},
	{"PROMETHEUS_PATH", "/metrics", envDefaultOnly, nil, "poplimit serves its metrics at /metrics"},
	{"PROMETHEUS_MAPPER_YAML", "", envLogged, nil, "metrics carry poplimit's own names (docs/CONFIGURATION.md, Metrics)"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false", envLogged, nil, "poplimit_rls_request_duration_seconds is in seconds"},

	// The runtime directory.
	{"RUNTIME_ROOT", "/srv/runtime_data/current", envMapped, []string{"rules"}, ""},
	{"RUNTIME_SUBDIRECTORY", "", envMapped, []string{"rules"}, ""},
	{"RUNTIME_APPDIRECTORY", "config", envMapped, []string{"rules"}, ""},
	{"RUNTIME_IGNOREDOTFILES", "false", envMapped, []string{"rules"}, ""},
	{"RUNTIME_WATCH_ROOT", "true", envMapped, []string{"rules"}, ""},

	// Every backend.
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", envLogged, nil, "poplimit's counters expire with their window"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", envMapped, []string{"block-cache-entries"}, ""},
	{"NEAR_LIMIT_RATIO", "0.8", envLogged, nil, "it only names ratelimit's near_limit statistic; poplimit counts ok and over_limit"},
	{"CACHE_KEY_PREFIX", "", envDefaultOnly, nil, "poplimit names its counters by a hash of the domain and descriptor and cannot keep deployments apart by a prefix: give each its own Redis or memcached"},
	{"BACKEND_TYPE", "redis", envMapped, []string{"redis", "memcache"}, ""},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", envDefaultOnly, nil, "poplimit counts each descriptor on its own; for limits that count only admitted hits set action: throttle in the files' poplimit block"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", envMapped, []string{"rls-headers"}, ""},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", envMapped, []string{"rls-limit-header"}, ""},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", envMapped, []string{"rls-remaining-header"}, ""},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", envMapped, []string{"rls-reset-header"}, ""},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", envLogged, nil, "poplimit starts only once a configuration loaded, so it is never healthy without one"},

	// Redis.
	{"REDIS_SOCKET_TYPE", "unix", envMapped, []string{"redis"}, ""},
	{"REDIS_TYPE", "SINGLE", envMapped, []string{"redis-mode"}, ""},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", envMapped, []string{"redis"}, ""},
	{"REDIS_POOL_SIZE", "10", envLogged, nil, "poplimit pipelines every call over a few connections per node"},
	{"REDIS_AUTH", "", envMapped, []string{"redis-user", "redis-password-file"}, ""},
	{"REDIS_TLS", "false", envMapped, []string{"redis-tls"}, ""},
	{"REDIS_TLS_CLIENT_CERT", "", envMapped, []string{"redis-tls-cert"}, ""},
	{"REDIS_TLS_CLIENT_KEY", "", envMapped, []string{"redis-tls-key"}, ""},
	{"REDIS_TLS_CACERT", "", envMapped, []string{"redis-tls-ca"}, ""},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", envMapped, []string{"redis-tls-skip-hostname-verification"}, ""},
	{"REDIS_PIPELINE_WINDOW", "0", envDefaultOnly, nil, "poplimit pipelines every Redis call itself and has no write window to set; unset it"},
	{"REDIS_PIPELINE_LIMIT", "0", envLogged, nil, "unused by envoyproxy/ratelimit too"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", envLogged, nil, "poplimit sends every node's calls at once"},
	{"REDIS_PERSECOND", "false", envDefaultOnly, nil, "poplimit keeps every limit in one store: point REDIS_URL at it and unset REDIS_PERSECOND"},
	{"REDIS_PERSECOND_SOCKET_TYPE", "unix", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_TYPE", "SINGLE", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_POOL_SIZE", "10", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_AUTH", "", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_TLS", "false", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_SENTINEL_AUTH", "", envMapped, []string{"redis-sentinel-user", "redis-sentinel-password-file"}, ""},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "0", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", envDefaultOnly, nil, "poplimit reports unready for a down store only while a rule fails closed (fail: closed in the files' poplimit block), and keeps answering from the failure policy otherwise"},
	{"REDIS_TIMEOUT", "10s", envMapped, []string{"store-timeout"}, ""},
	{"REDIS_PERSECOND_TIMEOUT", "10s", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", envLogged, nil, "poplimit pipelines every call and never runs out of connections"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", envLogged, nil, "used only with REDIS_PERSECOND=true, which poplimit refuses"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "1s", envLogged, nil, "poplimit starts without waiting for Redis, answers by each limit's failure policy until it connects, and tries again every second"},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s", envLogged, nil, "poplimit tries to connect again every second"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "0", envLogged, nil, "poplimit never gives up connecting"},

	// memcached.
	{"MEMCACHE_HOST_PORT", "", envMapped, []string{"memcache"}, ""},
	{"MEMCACHE_MAX_IDLE_CONNS", "2", envLogged, nil, "poplimit pipelines its calls over its own connections per shard"},
	{"MEMCACHE_SRV", "", envMapped, []string{"memcache"}, ""},
	{"MEMCACHE_SRV_REFRESH", "0", envDefaultOnly, nil, "poplimit resolves MEMCACHE_SRV once, at start; restart it to take new servers"},
	{"MEMCACHE_TLS", "false", envDefaultOnly, nil, "poplimit talks to memcached in plain text only"},
	{"MEMCACHE_TLS_CLIENT_CERT", "", envLogged, nil, "used only with MEMCACHE_TLS=true, which poplimit refuses"},
	{"MEMCACHE_TLS_CLIENT_KEY", "", envLogged, nil, "used only with MEMCACHE_TLS=true, which poplimit refuses"},
	{"MEMCACHE_TLS_CACERT", "", envLogged, nil, "used only with MEMCACHE_TLS=true, which poplimit refuses"},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", envLogged, nil, "used only with MEMCACHE_TLS=true, which poplimit refuses"},

	// Modes.
	{"SHADOW_MODE", "false", envMapped, []string{"rls-shadow-mode"}, ""},
	{"QUOTA_MODE", "false", envMapped, []string{"rls-quota-mode"}, ""},
	{"RESPONSE_DYNAMIC_METADATA", "false", envDefaultOnly, nil, "poplimit's rate limit service returns no dynamic metadata"},
	{"MERGE_DOMAIN_CONFIG", "false", envDefaultOnly, nil, "poplimit refuses two files of one domain; merge them into one file"},

	// Tracing.
	{"TRACING_ENABLED", "false", envLogged, nil, "poplimit exports no traces"},
	{"TRACING_SERVICE_NAME", "RateLimit", envLogged, nil, "poplimit exports no traces"},
	{"TRACING_SERVICE_NAMESPACE", "", envLogged, nil, "poplimit exports no traces"},
	{"TRACING_SERVICE_INSTANCE_ID", "", envLogged, nil, "poplimit exports no traces"},
	{"TRACING_EXPORTER_PROTOCOL", "http", envLogged, nil, "poplimit exports no traces"},
	{"TRACING_SAMPLING_RATE", "1", envLogged, nil, "poplimit exports no traces"},
}

// envoyScope names the variables ratelimit reads only in some
// configurations: refused there, logged elsewhere (REDIS_PIPELINE_WINDOW
// changes nothing with BACKEND_TYPE=memcache).
var envoyScope = map[string]string{
	"REDIS_PIPELINE_WINDOW":                     "redis",
	"REDIS_PERSECOND":                           "redis",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION":      "redis",
	"MEMCACHE_TLS":                              "memcache",
	"MEMCACHE_SRV_REFRESH":                      "memcache",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "xds",
	"PROMETHEUS_PATH":                           "prometheus",
	"USE_STATSD":                                "stats",
	"USE_DOG_STATSD":                            "stats",
}

// inScope says whether ratelimit reads the variable in this environment,
// and if not, why.
func (e *envoyEnv) inScope(name string) (bool, string) {
	b := func(v string) bool { x, _ := strconv.ParseBool(e.get(v)); return x }
	switch envoyScope[name] {
	case "redis":
		return e.get("BACKEND_TYPE") == "redis" || e.get("BACKEND_TYPE") == "", "BACKEND_TYPE is not redis"
	case "memcache":
		return e.get("BACKEND_TYPE") == "memcache", "BACKEND_TYPE is not memcache"
	case "xds":
		return strings.EqualFold(e.get("CONFIG_TYPE"), "GRPC_XDS_SOTW"), "CONFIG_TYPE is not GRPC_XDS_SOTW"
	case "prometheus":
		return b("USE_PROMETHEUS"), "USE_PROMETHEUS is not true"
	case "stats":
		return !b("DISABLE_STATS"), "DISABLE_STATS is true"
	}
	return true, ""
}

// envoyPrefixes are the prefixes of envoyproxy/ratelimit's variables: a
// variable with one of them that is none of envoyVars is logged once by
// name (Kubernetes, for one, sets REDIS_PORT and REDIS_SERVICE_HOST for a
// Service named redis), never read.
var envoyPrefixes = []string{"REDIS_", "MEMCACHE_", "RUNTIME_", "GRPC_", "CONFIG_", "XDS_", "LIMIT_", "STATSD_",
	"PROMETHEUS_", "TRACING_", "LOG_", "USE_", "DEBUG_", "OTEL_"}

// envoyEnv is -envoy-env at work: the environment, the flags given
// explicitly, and what it found.
type envoyEnv struct {
	env      map[string]string // the environment's variables
	fs       *flag.FlagSet
	explicit map[string]bool // flags given on the command line
	o        *edge.Options
	ex       *flagExtras
	errs     []error  // refusals, each naming its variable
	notes    []string // logged at start, once each
}

func (e *envoyEnv) lookup(name string) (envoyVar, bool) {
	for _, v := range envoyVars {
		if v.name == name {
			return v, true
		}
	}
	return envoyVar{}, false
}

// set says whether the variable is in the environment with a value (an
// empty value counts as unset, its default applying).
func (e *envoyEnv) set(name string) bool { return e.env[name] != "" }

// get is the variable's value, or its default.
func (e *envoyEnv) get(name string) string {
	v, ok := e.lookup(name)
	if !ok {
		panic("envoyenv: " + name + " is not in envoyVars")
	}
	if s := e.env[name]; s != "" {
		return s
	}
	return v.def
}

// refuse records why the variable's value ends start-up, once.
func (e *envoyEnv) refuse(name, format string, args ...any) {
	err := fmt.Errorf("edge: -envoy-env: %s=%q: %s", name, e.get(name), fmt.Sprintf(format, args...))
	for _, r := range e.errs {
		if r.Error() == err.Error() {
			return
		}
	}
	e.errs = append(e.errs, err)
}

func (e *envoyEnv) bool(name string) bool {
	b, err := strconv.ParseBool(e.get(name))
	if err != nil {
		e.refuse(name, "not a boolean (true or false)")
	}
	return b
}

func (e *envoyEnv) int(name string) int {
	n, err := strconv.Atoi(e.get(name))
	if err != nil {
		e.refuse(name, "not a whole number")
	}
	return n
}

func (e *envoyEnv) duration(name string) time.Duration {
	d, err := time.ParseDuration(e.get(name)) // as envconfig reads a time.Duration
	if err != nil {
		e.refuse(name, "not a duration (such as 150us, 10s, 1h)")
	}
	return d
}

// given says whether one of the flags was given explicitly, logging that
// it wins over vars.
func (e *envoyEnv) given(flags []string, vars ...string) bool {
	for _, f := range flags {
		if e.explicit[f] {
			for _, v := range vars {
				if e.set(v) {
					e.notes = append(e.notes, fmt.Sprintf("-%s given: %s not used", f, v))
				}
			}
			return true
		}
	}
	return false
}

// flag sets flag name to value (through the flag's own parsing) unless it
// was given explicitly; an error names the variables it came from.
func (e *envoyEnv) flag(name, value string, vars ...string) {
	if e.given([]string{name}, vars...) {
		return
	}
	if e.fs.Lookup(name) == nil {
		e.errs = append(e.errs, fmt.Errorf("edge: -envoy-env: %s: needs -%s, which this build of poplimit does not have", strings.Join(vars, ", "), name))
		return
	}
	if err := e.fs.Set(name, value); err != nil {
		e.errs = append(e.errs, fmt.Errorf("edge: -envoy-env: %s: -%s %q: %w", strings.Join(vars, ", "), name, value, err))
	}
}

// applyEnvoyEnv reads env (NAME=value lines, as os.Environ) into o, ex
// and the flag set's flags, leaving alone every flag in explicit. It
// returns the lines to log at start and every refusal, joined.
func applyEnvoyEnv(env []string, fs *flag.FlagSet, explicit map[string]bool, o *edge.Options, ex *flagExtras) ([]string, error) {
	e := &envoyEnv{env: map[string]string{}, fs: fs, explicit: explicit, o: o, ex: ex}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			e.env[k] = v
		}
	}
	// Variables poplimit does not read: refused unless at their default,
	// or logged.
	for _, v := range envoyVars {
		if !e.set(v.name) {
			continue
		}
		if in, why := e.inScope(v.name); !in {
			e.notes = append(e.notes, fmt.Sprintf("%s set: not read (%s)", v.name, why))
			continue
		}
		switch v.how {
		case envDefaultOnly:
			if !sameSetting(e.get(v.name), v.def) {
				e.refuse(v.name, "%s (default %q)", v.why, v.def)
			}
		case envLogged:
			e.notes = append(e.notes, fmt.Sprintf("%s set: not read (%s)", v.name, v.why))
		case envFalseOnly:
			if e.bool(v.name) {
				e.refuse(v.name, "%s; the endpoint: http://%s/metrics", v.why, e.metricsAddr())
			}
		}
	}
	var unknown []string
	for k := range e.env {
		if _, ok := e.lookup(k); !ok && slices.ContainsFunc(envoyPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		e.notes = append(e.notes, fmt.Sprintf("%s set: not a setting of envoyproxy/ratelimit, ignored", k))
	}
	e.listeners()
	e.logging()
	e.config()
	e.backend()
	e.service()
	return e.notes, errors.Join(e.errs...)
}

// sameSetting compares a value with a default as envconfig would read
// both: booleans and durations by meaning, the rest without case.
func sameSetting(v, def string) bool {
	if a, err := strconv.ParseBool(v); err == nil {
		b, err := strconv.ParseBool(def)
		return err == nil && a == b
	}
	if a, err := time.ParseDuration(v); err == nil {
		b, err := time.ParseDuration(def)
		return err == nil && a == b
	}
	return strings.EqualFold(v, def)
}

// metricsAddr is where the environment puts /metrics.
func (e *envoyEnv) metricsAddr() string {
	if b, _ := strconv.ParseBool(e.get("USE_PROMETHEUS")); b {
		return e.get("PROMETHEUS_ADDR")
	}
	return hostPort(e.get("DEBUG_HOST"), e.get("DEBUG_PORT"))
}

func (e *envoyEnv) listeners() {
	if e.bool("USE_PROMETHEUS") {
		addr := e.get("PROMETHEUS_ADDR")
		if h, _, err := net.SplitHostPort(addr); err == nil && h == "" {
			addr = "0.0.0.0" + addr
		}
		e.flag("admin", addr, "USE_PROMETHEUS", "PROMETHEUS_ADDR")
		e.notes = append(e.notes, "USE_PROMETHEUS=true: /metrics, /healthz and /readyz on PROMETHEUS_ADDR "+addr+"; DEBUG_HOST, DEBUG_PORT not used")
	} else {
		e.flag("admin", hostPort(e.get("DEBUG_HOST"), e.get("DEBUG_PORT")), "DEBUG_HOST", "DEBUG_PORT")
	}
	e.flag("rls-listen", hostPort(e.get("GRPC_HOST"), e.get("GRPC_PORT")), "GRPC_HOST", "GRPC_PORT")
	e.flag("rls-http-listen", hostPort(e.get("HOST"), e.get("PORT")), "HOST", "PORT")
	e.flag("rls-max-conn-age", e.duration("GRPC_MAX_CONNECTION_AGE").String(), "GRPC_MAX_CONNECTION_AGE")
	e.flag("rls-max-conn-age-grace", e.duration("GRPC_MAX_CONNECTION_AGE_GRACE").String(), "GRPC_MAX_CONNECTION_AGE_GRACE")
	if e.bool("GRPC_SERVER_USE_TLS") {
		if !e.set("GRPC_SERVER_TLS_CERT") || !e.set("GRPC_SERVER_TLS_KEY") {
			e.refuse("GRPC_SERVER_USE_TLS", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
			return
		}
		e.flag("rls-tls-cert", e.get("GRPC_SERVER_TLS_CERT"), "GRPC_SERVER_TLS_CERT")
		e.flag("rls-tls-key", e.get("GRPC_SERVER_TLS_KEY"), "GRPC_SERVER_TLS_KEY")
		if e.set("GRPC_CLIENT_TLS_CACERT") {
			e.flag("rls-tls-client-ca", e.get("GRPC_CLIENT_TLS_CACERT"), "GRPC_CLIENT_TLS_CACERT")
		}
		if e.set("GRPC_CLIENT_TLS_SAN") {
			e.flag("rls-tls-client-san", e.get("GRPC_CLIENT_TLS_SAN"), "GRPC_CLIENT_TLS_SAN")
		}
	}
}

// hostPort joins a host and a port as Go's net.JoinHostPort does
// ("::" becomes "[::]:8080").
func hostPort(host, port string) string { return net.JoinHostPort(host, port) }

func (e *envoyEnv) logging() {
	level := strings.ToLower(e.get("LOG_LEVEL"))
	switch level {
	case "trace", "debug":
		level = "debug"
	case "info":
	case "warn", "warning":
		level = "warn"
	case "error", "fatal", "panic":
		level = "error"
	default:
		e.refuse("LOG_LEVEL", "not a level (trace, debug, info, warn, error, fatal, panic)")
		level = ""
	}
	if level != "" {
		e.flag("log-level", level, "LOG_LEVEL")
	}
	format := "text"
	if strings.EqualFold(e.get("LOG_FORMAT"), "json") {
		format = "json"
	}
	e.flag("log-format", format, "LOG_FORMAT")
}

func (e *envoyEnv) config() {
	switch strings.ToUpper(e.get("CONFIG_TYPE")) {
	case "FILE":
		if e.given([]string{"rules"}, "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY") {
			return
		}
		e.runtimeDir()
	case "GRPC_XDS_SOTW":
		xds := []string{"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"}
		e.flag("rls-xds", e.get("CONFIG_GRPC_XDS_SERVER_URL"), xds...)
		e.flag("rls-xds-node-id", e.get("CONFIG_GRPC_XDS_NODE_ID"), "CONFIG_GRPC_XDS_NODE_ID")
		if e.set("CONFIG_GRPC_XDS_NODE_METADATA") {
			// key=value entries, comma-separated; ratelimit skips an entry
			// without "=", and so does this, logging it.
			var kept []string
			for _, entry := range strings.Split(e.get("CONFIG_GRPC_XDS_NODE_METADATA"), ",") {
				if strings.Contains(entry, "=") {
					kept = append(kept, entry)
				} else {
					e.notes = append(e.notes, fmt.Sprintf("CONFIG_GRPC_XDS_NODE_METADATA: entry %q has no '=': skipped, as envoyproxy/ratelimit skips it", entry))
				}
			}
			e.flag("rls-xds-node-metadata", strings.Join(kept, ","), "CONFIG_GRPC_XDS_NODE_METADATA")
		}
		e.flag("rls-xds-backoff-initial", e.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL").String(), "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
		e.flag("rls-xds-backoff-max", e.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL").String(), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
		if e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG") {
			e.flag("rls-xds-force-start", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG")
		}
		if e.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
			e.flag("rls-xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
			for _, m := range [][2]string{{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "rls-xds-tls-ca"}, {"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "rls-xds-tls-cert"},
				{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "rls-xds-tls-key"}, {"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "rls-xds-tls-server-name"}} {
				if e.set(m[0]) {
					e.flag(m[1], e.get(m[0]), m[0])
				}
			}
		}
	default:
		e.refuse("CONFIG_TYPE", "must be FILE or GRPC_XDS_SOTW")
	}
}

// runtimeDir maps the runtime directory to -rules: envoyproxy/ratelimit
// reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, with
// RUNTIME_WATCH_ROOT or without (poplimit reads the files' contents every
// 2 s, so a symlink swapped at the root and a file written in place are
// both seen). What ratelimit would read there and poplimit would not
// (subdirectories; names starting with a dot, without
// RUNTIME_IGNOREDOTFILES) ends start-up naming it.
func (e *envoyEnv) runtimeDir() {
	e.bool("RUNTIME_WATCH_ROOT") // read for its validity: both ways reload
	dir := filepath.Join(e.get("RUNTIME_ROOT"), e.get("RUNTIME_SUBDIRECTORY"), e.get("RUNTIME_APPDIRECTORY"))
	ignoreDot := e.bool("RUNTIME_IGNOREDOTFILES")
	ents, err := os.ReadDir(dir)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("edge: -envoy-env: RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY: the runtime directory %s: %w", dir, err))
		return
	}
	for _, d := range ents {
		name := d.Name()
		if strings.HasPrefix(name, "..") {
			// A Kubernetes volume's own (..data, ..2026_01_01_...): the
			// same files again. ratelimit reads the timestamped directory
			// too without RUNTIME_IGNOREDOTFILES, and then refuses the
			// domains it finds twice; poplimit reads the files once.
			continue
		}
		dot := strings.HasPrefix(name, ".")
		if dot && ignoreDot {
			continue
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		switch {
		case st.IsDir():
			e.refuse("RUNTIME_APPDIRECTORY", "%s is a directory: envoyproxy/ratelimit reads the files under it, poplimit reads only the files of %s; move them up", p, dir)
		case dot && isYAMLName(name):
			e.refuse("RUNTIME_IGNOREDOTFILES", "%s starts with a dot: envoyproxy/ratelimit reads it, poplimit never does; rename it or set RUNTIME_IGNOREDOTFILES=true", p)
		case !isYAMLName(name):
			e.notes = append(e.notes, fmt.Sprintf("runtime directory: %s not read (poplimit reads *.yaml and *.yml)", p))
		}
	}
	e.flag("rules", dir, "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
}

func isYAMLName(n string) bool { return strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml") }

func (e *envoyEnv) backend() {
	if n := e.int("LOCAL_CACHE_SIZE_IN_BYTES"); n > 0 {
		// ratelimit's cache (freecache) takes 512 KiB at least; a blocked
		// key takes about 180 to 260 bytes of the block cache.
		e.flag("block-cache-entries", strconv.Itoa(max(n, 512<<10)/256), "LOCAL_CACHE_SIZE_IN_BYTES")
	} else if n < 0 {
		e.refuse("LOCAL_CACHE_SIZE_IN_BYTES", "must not be negative")
	}
	if _, err := strconv.ParseFloat(e.get("NEAR_LIMIT_RATIO"), 32); err != nil {
		e.refuse("NEAR_LIMIT_RATIO", "not a number")
	}
	switch e.get("BACKEND_TYPE") {
	case "redis", "":
		if e.given([]string{"redis", "memcache"}, "REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE") {
			e.redisSecurity()
			return
		}
		e.redis()
	case "memcache":
		if e.given([]string{"memcache", "redis"}, "MEMCACHE_HOST_PORT", "MEMCACHE_SRV") {
			return
		}
		e.memcache()
	default:
		e.refuse("BACKEND_TYPE", "must be redis or memcache")
	}
}

func (e *envoyEnv) redis() {
	if e.bool("REDIS_PERSECOND") {
		return // refused above
	}
	if st := strings.ToLower(e.get("REDIS_SOCKET_TYPE")); st != "tcp" {
		e.refuse("REDIS_SOCKET_TYPE", "poplimit talks to Redis over TCP only: set REDIS_SOCKET_TYPE=tcp and REDIS_URL to host:port (the default is a unix socket)")
		return
	}
	url := e.get("REDIS_URL")
	switch strings.ToLower(e.get("REDIS_TYPE")) {
	case "single":
		e.flag("redis-mode", "standalone", "REDIS_TYPE")
		e.flag("redis", url, "REDIS_URL")
	case "cluster":
		e.flag("redis-mode", "cluster", "REDIS_TYPE")
		e.flag("redis", url, "REDIS_URL")
	case "sentinel":
		master, sentinels, ok := strings.Cut(url, ",")
		if !ok || master == "" || sentinels == "" {
			e.refuse("REDIS_URL", "with REDIS_TYPE=sentinel: the master's name and the sentinels, as master,host:port,host:port")
			return
		}
		if e.fs.Lookup("redis-sentinel-master") == nil {
			e.refuse("REDIS_TYPE", "Redis Sentinel needs -redis-mode sentinel and -redis-sentinel-master, which this build of poplimit does not have")
			return
		}
		e.flag("redis-mode", "sentinel", "REDIS_TYPE")
		e.flag("redis-sentinel-master", master, "REDIS_URL")
		e.flag("redis", sentinels, "REDIS_URL")
		if e.set("REDIS_SENTINEL_AUTH") && !e.given([]string{"redis-sentinel-user", "redis-sentinel-password-file"}, "REDIS_SENTINEL_AUTH") {
			e.sentinelAuth()
		}
	default:
		e.refuse("REDIS_TYPE", "must be single, cluster or sentinel")
		return
	}
	if e.set("REDIS_TIMEOUT") {
		e.flag("store-timeout", e.duration("REDIS_TIMEOUT").String(), "REDIS_TIMEOUT")
	}
	e.redisSecurity()
}

// sentinelAuth hands REDIS_SENTINEL_AUTH, "user:password" or a password
// alone as ratelimit reads it, to -redis-sentinel-user and
// -redis-sentinel-password-file, the password through a file only this
// process can read, removed once read.
func (e *envoyEnv) sentinelAuth() {
	pass := e.get("REDIS_SENTINEL_AUTH")
	if user, p, ok := strings.Cut(pass, ":"); ok {
		e.flag("redis-sentinel-user", user, "REDIS_SENTINEL_AUTH")
		pass = p
	}
	f, err := os.CreateTemp("", "poplimit-sentinel-auth-")
	if err != nil {
		e.refuse("REDIS_SENTINEL_AUTH", "%v", err)
		return
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(pass)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		e.refuse("REDIS_SENTINEL_AUTH", "%v", err)
		return
	}
	e.flag("redis-sentinel-password-file", f.Name(), "REDIS_SENTINEL_AUTH")
}

// redisSecurity maps REDIS_AUTH and the REDIS_TLS variables.
func (e *envoyEnv) redisSecurity() {
	if auth := e.get("REDIS_AUTH"); auth != "" && !e.given([]string{"redis-user", "redis-password-file"}, "REDIS_AUTH") {
		// "user:password" or a password alone, as ratelimit reads it.
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			e.o.Redis.Username, e.o.Redis.Password = user, pass
		} else {
			e.o.Redis.Password = auth
		}
	}
	if !e.bool("REDIS_TLS") {
		return
	}
	e.flag("redis-tls", "true", "REDIS_TLS")
	for _, m := range [][2]string{{"REDIS_TLS_CACERT", "redis-tls-ca"}, {"REDIS_TLS_CLIENT_CERT", "redis-tls-cert"}, {"REDIS_TLS_CLIENT_KEY", "redis-tls-key"}} {
		if e.set(m[0]) {
			e.flag(m[1], e.get(m[0]), m[0])
		}
	}
	if e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") {
		e.flag("redis-tls-skip-hostname-verification", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	}
}

func (e *envoyEnv) memcache() {
	hosts := e.get("MEMCACHE_HOST_PORT")
	srv := e.get("MEMCACHE_SRV")
	switch {
	case hosts != "" && srv != "":
		e.refuse("MEMCACHE_SRV", "set MEMCACHE_HOST_PORT or MEMCACHE_SRV, not both")
	case srv != "":
		servers, err := lookupMemcacheSRV(context.Background(), memcacheResolver, srv)
		if err != nil {
			e.refuse("MEMCACHE_SRV", "%v", err)
			return
		}
		e.notes = append(e.notes, fmt.Sprintf("MEMCACHE_SRV %s: memcached servers %s", srv, servers))
		e.flag("memcache", servers, "MEMCACHE_SRV")
	case hosts != "":
		e.flag("memcache", hosts, "MEMCACHE_HOST_PORT")
	default:
		e.refuse("BACKEND_TYPE", "memcache needs MEMCACHE_HOST_PORT or MEMCACHE_SRV")
	}
}

// memcacheResolver resolves MEMCACHE_SRV: the system's resolver, a test's
// own DNS server.
var memcacheResolver = net.DefaultResolver

// lookupMemcacheSRV resolves an SRV name ("_memcache._tcp.example.com", or
// any name, looked up as is) to host:port,... in the order DNS gives them
// (by priority, then randomly by weight).
func lookupMemcacheSRV(ctx context.Context, r *net.Resolver, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, addrs, err := r.LookupSRV(ctx, "", "", name)
	if err != nil {
		return "", err
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("SRV %s: no records", name)
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = net.JoinHostPort(strings.TrimSuffix(a.Target, "."), strconv.Itoa(int(a.Port)))
	}
	return strings.Join(out, ","), nil
}

func (e *envoyEnv) service() {
	if e.bool("LIMIT_RESPONSE_HEADERS_ENABLED") {
		e.flag("rls-headers", rls.HeadersRatelimit, "LIMIT_RESPONSE_HEADERS_ENABLED")
	} else {
		e.flag("rls-headers", rls.HeadersNone, "LIMIT_RESPONSE_HEADERS_ENABLED")
	}
	e.flag("rls-limit-header", e.get("LIMIT_LIMIT_HEADER"), "LIMIT_LIMIT_HEADER")
	e.flag("rls-remaining-header", e.get("LIMIT_REMAINING_HEADER"), "LIMIT_REMAINING_HEADER")
	e.flag("rls-reset-header", e.get("LIMIT_RESET_HEADER"), "LIMIT_RESET_HEADER")
	e.flag("rls-shadow-mode", strconv.FormatBool(e.bool("SHADOW_MODE")), "SHADOW_MODE")
	e.flag("rls-quota-mode", strconv.FormatBool(e.bool("QUOTA_MODE")), "QUOTA_MODE")
}
