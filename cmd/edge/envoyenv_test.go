package main

import (
	"bufio"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/rls"
)

// The table holds every variable of envoyproxy/ratelimit's settings.go,
// with its default, once; and docs/CONFIGURATION.md lists each.
func TestEnvoyVarsMatchRatelimit(t *testing.T) {
	f, err := os.Open("testdata/ratelimit-settings.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			name, def, _ := strings.Cut(l, "\t")
			want[name] = def
		}
	}
	seen := map[string]bool{}
	for _, v := range envoyVars {
		if seen[v.name] {
			t.Errorf("%s twice in envoyVars", v.name)
		}
		seen[v.name] = true
		def, ok := want[v.name]
		switch {
		case !ok:
			t.Errorf("%s: not a variable of envoyproxy/ratelimit's settings", v.name)
		case def != v.def:
			t.Errorf("%s: default %q, envoyproxy/ratelimit's is %q", v.name, v.def, def)
		}
		if v.how == envMapped && len(v.flags) == 0 || v.how != envMapped && v.why == "" {
			t.Errorf("%s: a mapped variable names its flags, another says why", v.name)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s: in envoyproxy/ratelimit's settings, not in envoyVars", name)
		}
	}
	doc, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(t), "docs", "CONFIGURATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range envoyVars {
		if !regexp.MustCompile("(?m)^\\| `" + v.name + "` \\|").Match(doc) {
			t.Errorf("docs/CONFIGURATION.md has no row for %s", v.name)
		}
	}
}

// istioEnv is the environment of Istio's samples/ratelimit Deployment of
// envoyproxy/ratelimit, with REDIS_URL and RUNTIME_ROOT pointing where the
// test put them and HOST, GRPC_HOST the loopback "::1" for its "::".
func istioEnv(redisAddr, root string) []string {
	return []string{
		"LOG_LEVEL=debug",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisAddr,
		"USE_STATSD=false",
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"HOST=::1",
		"GRPC_HOST=::1",
	}
}

// runtimeDir makes root/ratelimit/config holding files, laid out as a
// Kubernetes ConfigMap volume (each file a symlink through ..data to a
// timestamped directory).
func runtimeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	ts := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const oneRule = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"

// Each variable sets the flags it maps to, with envoyproxy/ratelimit's
// defaults where unset.
func TestEnvoyEnvMapping(t *testing.T) {
	root := runtimeDir(t, map[string]string{"config.yaml": oneRule})
	base := istioEnv("127.0.0.1:6379", root)
	tests := []struct {
		name  string
		env   []string
		args  []string
		check func(t *testing.T, o optionsView)
	}{
		{"istio's sample", nil, nil, func(t *testing.T, o optionsView) {
			o.want(t, "admin", o.Admin, "0.0.0.0:6070")
			o.want(t, "rls-listen", o.RLSListen, "[::1]:8081")
			o.want(t, "rls-http-listen", o.RLSHTTPListen, "[::1]:8080")
			o.want(t, "rules", o.RulesFile, filepath.Join(root, "ratelimit", "config"))
			o.want(t, "redis", strings.Join(o.Redis.Addrs, ","), "127.0.0.1:6379")
			o.want(t, "redis-mode", string(o.Redis.Mode), string(redisstore.TopologyStandalone))
			o.want(t, "rls-headers", o.RLS.Headers, rls.HeadersNone)
			o.want(t, "log-level", o.logLevel, "debug")
			o.want(t, "rls-max-conn-age", o.RLS.MaxConnectionAge.String(), "24h0m0s")
			o.want(t, "rls-max-conn-age-grace", o.RLS.MaxConnectionAgeGrace.String(), "1h0m0s")
			o.want(t, "store-timeout", o.Limiter.StoreTimeout.String(), "100ms")
		}},
		{"ports, auth with a user, cluster, headers, modes", []string{"PORT=1", "GRPC_PORT=2", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=3",
			"REDIS_AUTH=alice:s3cret:x", "REDIS_TYPE=cluster", "REDIS_URL=127.0.0.1:7000,127.0.0.1:7001",
			"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left", "SHADOW_MODE=true", "QUOTA_MODE=1",
			"LOG_LEVEL=WARN", "LOG_FORMAT=json", "REDIS_TIMEOUT=250ms", "LOCAL_CACHE_SIZE_IN_BYTES=1048576"}, nil, func(t *testing.T, o optionsView) {
			o.want(t, "admin", o.Admin, "127.0.0.1:3")
			o.want(t, "rls-listen", o.RLSListen, "[::1]:2")
			o.want(t, "rls-http-listen", o.RLSHTTPListen, "[::1]:1")
			o.want(t, "redis-user", o.Redis.Username, "alice")
			o.want(t, "redis password", o.Redis.Password, "s3cret:x")
			o.want(t, "redis-mode", string(o.Redis.Mode), string(redisstore.TopologyCluster))
			o.want(t, "redis", strings.Join(o.Redis.Addrs, ","), "127.0.0.1:7000,127.0.0.1:7001")
			o.want(t, "rls-headers", o.RLS.Headers, rls.HeadersRatelimit)
			o.want(t, "rls-limit-header", o.RLS.LimitHeader, "RateLimit-Limit")
			o.want(t, "rls-remaining-header", o.RLS.RemainingHeader, "X-Left")
			o.wantBool(t, "rls-shadow-mode", o.RLS.ShadowMode, true)
			o.wantBool(t, "rls-quota-mode", o.RLS.QuotaMode, true)
			o.want(t, "log-level", o.logLevel, "warn")
			o.want(t, "log-format", o.logFormat, "json")
			o.want(t, "store-timeout", o.Limiter.StoreTimeout.String(), "250ms")
			o.want(t, "block-cache-entries", itoa(o.BlockCache.MaxEntries), "4096")
		}},
		{"a password alone, a small local cache", []string{"REDIS_AUTH=password123", "LOCAL_CACHE_SIZE_IN_BYTES=1000"}, nil, func(t *testing.T, o optionsView) {
			o.want(t, "redis-user", o.Redis.Username, "")
			o.want(t, "redis password", o.Redis.Password, "password123")
			o.want(t, "block-cache-entries", itoa(o.BlockCache.MaxEntries), "2048") // freecache's 512 KiB at least
		}},
		{"memcached", []string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=127.0.0.1:11211,127.0.0.1:11212"}, nil, func(t *testing.T, o optionsView) {
			o.want(t, "memcache", o.Memcache.Servers[0].Addr+","+o.Memcache.Servers[1].Addr, "127.0.0.1:11211,127.0.0.1:11212")
			o.want(t, "redis", strings.Join(o.Redis.Addrs, ","), "")
		}},
		{"prometheus", []string{"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:9090"}, nil, func(t *testing.T, o optionsView) {
			o.want(t, "admin", o.Admin, "127.0.0.1:9090")
		}},
		{"explicit flags win", []string{"GRPC_PORT=2", "REDIS_URL=127.0.0.1:1", "LOG_LEVEL=debug"},
			[]string{"-rls-listen", "127.0.0.1:5", "-redis", "127.0.0.1:6", "-log-level", "error", "-rules", filepath.Join(root, "ratelimit", "config", "config.yaml")}, func(t *testing.T, o optionsView) {
				o.want(t, "rls-listen", o.RLSListen, "127.0.0.1:5")
				o.want(t, "redis", strings.Join(o.Redis.Addrs, ","), "127.0.0.1:6")
				o.want(t, "log-level", o.logLevel, "error")
				o.want(t, "rules", o.RulesFile, filepath.Join(root, "ratelimit", "config", "config.yaml"))
				o.want(t, "redis-mode", string(o.Redis.Mode), "") // -redis given: REDIS_TYPE not used either
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append(append([]string{}, base...), tt.env...)
			o, ex, err := parseFlagsEnv(append([]string{"-envoy-env"}, tt.args...), io.Discard, env)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, optionsView{o, ex})
		})
	}
	// Without -envoy-env the environment is not read.
	o, _, err := parseFlagsEnv(nil, io.Discard, base)
	if err != nil || o.RLSListen != "" || o.RulesFile != "" || len(o.Redis.Addrs) != 0 {
		t.Errorf("without -envoy-env: RLSListen %q RulesFile %q Redis %v, %v; want nothing read", o.RLSListen, o.RulesFile, o.Redis.Addrs, err)
	}
}

type optionsView struct {
	edgeOptions
	flagExtras
}

func (optionsView) want(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func (optionsView) wantBool(t *testing.T, what string, got, want bool) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// A variable poplimit cannot honour ends start-up (through run) with a
// message naming it; the defaults of envoyproxy/ratelimit that poplimit
// cannot honour (a unix socket to Redis) are named the same way.
func TestEnvoyEnvRefusals(t *testing.T) {
	root := runtimeDir(t, map[string]string{"config.yaml": oneRule})
	// Loopback, any port: an edge that starts where it should not binds
	// nothing beyond.
	base := append(istioEnv("127.0.0.1:1", root), "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0")
	tests := []struct {
		env  []string
		want string
	}{
		{[]string{"REDIS_PIPELINE_WINDOW=150us"}, `REDIS_PIPELINE_WINDOW="150us": poplimit pipelines every Redis call itself`},
		{[]string{"REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=127.0.0.1:2"}, `REDIS_PERSECOND="true": poplimit keeps every limit in one store`},
		{[]string{"USE_STATSD=true"}, `USE_STATSD="true": poplimit exports no statsd: its metrics are Prometheus's, at /metrics on the debug port (DEBUG_HOST:DEBUG_PORT, -admin); set USE_STATSD=false; the endpoint: http://127.0.0.1:0/metrics`},
		{[]string{"USE_DOG_STATSD=true"}, `USE_DOG_STATSD="true"`},
		{[]string{"CACHE_KEY_PREFIX=prefix:"}, `CACHE_KEY_PREFIX="prefix:"`},
		{[]string{"GRPC_UDS=/tmp/rl.sock"}, `GRPC_UDS="/tmp/rl.sock": poplimit serves gRPC on TCP only`},
		{[]string{"MERGE_DOMAIN_CONFIG=true"}, `MERGE_DOMAIN_CONFIG="true"`},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT="true"`},
		{[]string{"RESPONSE_DYNAMIC_METADATA=true"}, `RESPONSE_DYNAMIC_METADATA="true"`},
		{[]string{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true"}, `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true"`},
		{[]string{"MEMCACHE_TLS=true", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=127.0.0.1:1"}, `MEMCACHE_TLS="true"`},
		{[]string{"MEMCACHE_SRV_REFRESH=10s", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=127.0.0.1:1"}, `MEMCACHE_SRV_REFRESH="10s"`},
		{[]string{"PROMETHEUS_PATH=/stats", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0"}, `PROMETHEUS_PATH="/stats"`},
		{[]string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/var/run/nutcracker/ratelimit.sock"}, `REDIS_SOCKET_TYPE="unix": poplimit talks to Redis over TCP only`},
		{[]string{"REDIS_SOCKET_TYPE="}, `REDIS_SOCKET_TYPE="unix"`}, // the default
		{[]string{"BACKEND_TYPE=dynamodb"}, `BACKEND_TYPE="dynamodb": must be redis or memcache`},
		{[]string{"REDIS_TYPE=ring"}, `REDIS_TYPE="ring": must be single, cluster or sentinel`},
		{[]string{"REDIS_TYPE=sentinel", "REDIS_URL=127.0.0.1:1"}, `REDIS_URL="127.0.0.1:1": with REDIS_TYPE=sentinel`},
		{[]string{"CONFIG_TYPE=GRPC"}, `CONFIG_TYPE="GRPC": must be FILE or GRPC_XDS_SOTW`},
		{[]string{"LOG_LEVEL=loud"}, `LOG_LEVEL="loud": not a level`},
		{[]string{"SHADOW_MODE=yes"}, `SHADOW_MODE="yes": not a boolean`},
		{[]string{"GRPC_MAX_CONNECTION_AGE=a day"}, `GRPC_MAX_CONNECTION_AGE="a day": not a duration`},
		{[]string{"GRPC_SERVER_USE_TLS=true"}, `GRPC_SERVER_USE_TLS="true": needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY`},
		{[]string{"RUNTIME_SUBDIRECTORY=nowhere"}, `the runtime directory ` + filepath.Join(root, "nowhere", "config")},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			env := append(append([]string{}, base...), tt.env...)
			out := &testenv.LockedBuffer{}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := runEnv(ctx, []string{"-envoy-env", "-listen", "127.0.0.1:0"}, out, env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run: %v\nwant an error containing %s", err, tt.want)
			}
		})
	}
}

// A variable ratelimit reads only in some configurations is refused only
// there: REDIS_PIPELINE_WINDOW with Redis, not with memcached.
func TestEnvoyEnvScope(t *testing.T) {
	root := runtimeDir(t, map[string]string{"config.yaml": oneRule})
	base := istioEnv("127.0.0.1:1", root)
	for _, tt := range []struct {
		env     []string
		refused string // "": started, the variable logged
	}{
		{[]string{"REDIS_PIPELINE_WINDOW=150us"}, "REDIS_PIPELINE_WINDOW"},
		{[]string{"REDIS_PIPELINE_WINDOW=150us", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=127.0.0.1:1"}, ""},
		{[]string{"MEMCACHE_TLS=true"}, ""},
		{[]string{"PROMETHEUS_PATH=/stats"}, ""},
		{[]string{"PROMETHEUS_PATH=/stats", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:9090"}, "PROMETHEUS_PATH"},
		{[]string{"USE_STATSD=true", "DISABLE_STATS=true"}, ""},
		{[]string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=a:b"}, ""},
	} {
		env := append(append([]string{}, base...), tt.env...)
		_, ex, err := parseFlagsEnv([]string{"-envoy-env"}, io.Discard, env)
		name, _, _ := strings.Cut(tt.env[0], "=")
		switch {
		case tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused+"=")):
			t.Errorf("%v: %v, want %s refused", tt.env, err, tt.refused)
		case tt.refused == "" && err != nil:
			t.Errorf("%v: %v, want it started", tt.env, err)
		case tt.refused == "" && !strings.Contains(strings.Join(ex.envNotes, "\n"), name+" set: not read"):
			t.Errorf("%v: notes %q, want %s logged", tt.env, ex.envNotes, name)
		}
	}
}

// What ratelimit would read in the runtime directory and poplimit would
// not ends start-up naming it; other files are logged.
func TestEnvoyEnvRuntimeDir(t *testing.T) {
	root := runtimeDir(t, map[string]string{"config.yaml": oneRule})
	dir := filepath.Join(root, "ratelimit", "config")
	env := istioEnv("127.0.0.1:1", root)
	if err := os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte(oneRule), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseFlagsEnv([]string{"-envoy-env"}, io.Discard, env); err != nil {
		t.Fatalf("RUNTIME_IGNOREDOTFILES=true with a dot file: %v", err)
	}
	noIgnore := append(append([]string{}, env...), "RUNTIME_IGNOREDOTFILES=false")
	if _, _, err := parseFlagsEnv([]string{"-envoy-env"}, io.Discard, noIgnore); err == nil || !strings.Contains(err.Error(), "RUNTIME_IGNOREDOTFILES") || !strings.Contains(err.Error(), ".hidden.yaml") {
		t.Fatalf("RUNTIME_IGNOREDOTFILES=false with a dot file: %v, want a refusal naming both", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "more"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseFlagsEnv([]string{"-envoy-env"}, io.Discard, env); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "more")+" is a directory") {
		t.Fatalf("a subdirectory: %v, want a refusal naming it", err)
	}
	os.Remove(filepath.Join(dir, "more"))
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, ex, err := parseFlagsEnv([]string{"-envoy-env"}, io.Discard, env)
	if err != nil || !strings.Contains(strings.Join(ex.envNotes, "\n"), "README not read") {
		t.Fatalf("a file not *.yaml: %v, notes %q; want it logged", err, ex.envNotes)
	}
}

type edgeOptions = edge.Options

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The xDS and Sentinel variables set the flags of -rls-xds and -redis-mode
// sentinel, by name, with ratelimit's defaults; a build without those
// flags refuses the variables, naming them.
func TestEnvoyEnvXDSAndSentinelFlags(t *testing.T) {
	root := runtimeDir(t, map[string]string{"config.yaml": oneRule})
	base := istioEnv("127.0.0.1:1", root)
	names := []string{"rls-xds", "rls-xds-node-id", "rls-xds-node-metadata", "rls-xds-force-start", "rls-xds-tls", "rls-xds-tls-ca",
		"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-server-name", "rls-xds-backoff-initial", "rls-xds-backoff-max",
		"redis-mode", "redis", "redis-sentinel-master", "redis-sentinel-user", "redis-sentinel-password-file"}
	tests := []struct {
		env  []string
		want map[string]string
	}{
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW"}, map[string]string{"rls-xds": "localhost:18000", "rls-xds-node-id": "default",
			"rls-xds-backoff-initial": "10s", "rls-xds-backoff-max": "1m0s", "redis-mode": "standalone", "redis": "127.0.0.1:1"}},
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:18001", "CONFIG_GRPC_XDS_NODE_ID=ratelimit-1",
			"CONFIG_GRPC_XDS_NODE_METADATA=a=1,b:2,c=3", "FORCE_START_WITHOUT_INITIAL_CONFIG=true", "CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/ca.pem", "CONFIG_GRPC_XDS_SERVER_TLS_SAN=xds.example", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=1s"},
			map[string]string{"rls-xds": "127.0.0.1:18001", "rls-xds-node-id": "ratelimit-1", "rls-xds-node-metadata": "a=1,c=3",
				"rls-xds-force-start": "true", "rls-xds-tls": "true", "rls-xds-tls-ca": "/ca.pem", "rls-xds-tls-server-name": "xds.example",
				"rls-xds-backoff-initial": "1s", "rls-xds-backoff-max": "1m0s", "redis-mode": "standalone", "redis": "127.0.0.1:1"}},
		{[]string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster,127.0.0.1:26394,127.0.0.1:26395", "REDIS_AUTH=password123"},
			map[string]string{"redis-mode": "sentinel", "redis-sentinel-master": "mymaster", "redis": "127.0.0.1:26394,127.0.0.1:26395"}},
		{[]string{"REDIS_TYPE=sentinel", "REDIS_URL=m,127.0.0.1:26394", "REDIS_SENTINEL_AUTH=sam:s3cret"},
			map[string]string{"redis-mode": "sentinel", "redis-sentinel-master": "m", "redis": "127.0.0.1:26394", "redis-sentinel-user": "sam",
				"redis-sentinel-password-file": "(a file holding s3cret)"}},
	}
	for _, tt := range tests {
		env := append(append([]string{}, base...), tt.env...)
		// A flag set with those flags, recording what they are set to.
		fs := flag.NewFlagSet("edge", flag.ContinueOnError)
		got := map[string]string{}
		for _, n := range names {
			fs.Func(n, "", func(v string) error {
				if n == "redis-sentinel-password-file" { // read now: the file goes once read
					b, err := os.ReadFile(v)
					v = "(a file holding " + string(b) + ")"
					if err != nil {
						return err
					}
				}
				got[n] = v
				return nil
			})
		}
		envoyFlags(fs, &edge.Options{}, &flagExtras{})
		for _, n := range []string{"admin", "rls-listen", "log-level", "rules", "store-timeout", "block-cache-entries", "rls-headers"} {
			fs.String(n, "", "")
		}
		o := edge.Options{}
		if _, err := applyEnvoyEnv(env, fs, map[string]bool{}, &o, &flagExtras{}); err != nil {
			t.Fatalf("%v: %v", tt.env, err)
		}
		for _, n := range names {
			if got[n] != tt.want[n] {
				t.Errorf("%v: -%s %q, want %q", tt.env, n, got[n], tt.want[n])
			}
		}
		if strings.Contains(strings.Join(tt.env, " "), "REDIS_AUTH=password123") && o.Redis.Password != "password123" {
			t.Errorf("%v: the master's password %q, want REDIS_AUTH's", tt.env, o.Redis.Password)
		}
		if strings.Contains(strings.Join(tt.env, " "), "b:2") {
			// The entry without "=" is logged.
			notes, _ := applyEnvoyEnv(env, fs, map[string]bool{}, &o, &flagExtras{})
			if !strings.Contains(strings.Join(notes, "\n"), `entry "b:2" has no '='`) {
				t.Errorf("notes %q: want the skipped entry logged", notes)
			}
		}
	}
	// Without the flags, the variables are refused by name.
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	envoyFlags(fs, &edge.Options{}, &flagExtras{})
	for _, n := range []string{"admin", "rls-listen", "log-level", "rules", "store-timeout", "block-cache-entries", "rls-headers", "redis", "redis-mode"} {
		fs.String(n, "", "")
	}
	for env, want := range map[string]string{
		"CONFIG_TYPE=GRPC_XDS_SOTW": "CONFIG_TYPE, CONFIG_GRPC_XDS_SERVER_URL: needs -rls-xds",
		"REDIS_TYPE=sentinel":       `REDIS_TYPE="sentinel": Redis Sentinel needs -redis-mode sentinel and -redis-sentinel-master`,
	} {
		e := append(append([]string{}, base...), env, "REDIS_URL=m,127.0.0.1:1")
		if _, err := applyEnvoyEnv(e, fs, map[string]bool{}, &edge.Options{}, &flagExtras{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s without the flags: %v, want %q", env, err, want)
		}
	}
}
