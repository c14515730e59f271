package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/poplimit/poplimit/internal/testenv"
)

// envoyEdge is cmd/edge run with -envoy-env and an environment, serving
// in the test process.
type envoyEdge struct {
	out        *testenv.LockedBuffer
	grpcAddr   string
	httpAddr   string
	debugAddr  string
	client     rlspb.RateLimitServiceClient
	cancel     context.CancelFunc
	done       chan error
	stopped    bool
	stopResult error
}

// loopbackPorts are the ports the tests give PORT, GRPC_PORT and
// DEBUG_PORT: free ones, for envoyproxy/ratelimit's fixed 8080, 8081, 6070.
func loopbackPorts(t *testing.T) []string {
	return []string{"PORT=" + strconv.Itoa(testenv.FreePort(t)), "GRPC_PORT=" + strconv.Itoa(testenv.FreePort(t)),
		"DEBUG_PORT=" + strconv.Itoa(testenv.FreePort(t))}
}

// startEnvoyEnv runs the edge with -envoy-env over env until the test
// ends, and returns it once its gRPC port accepts.
func startEnvoyEnv(t *testing.T, env []string, args ...string) *envoyEdge {
	t.Helper()
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	host := func(k string) string {
		if h := vars[k]; h != "" {
			return h
		}
		return "0.0.0.0"
	}
	e := &envoyEdge{out: &testenv.LockedBuffer{}, done: make(chan error, 1),
		grpcAddr:  net.JoinHostPort(host("GRPC_HOST"), vars["GRPC_PORT"]),
		httpAddr:  net.JoinHostPort(host("HOST"), vars["PORT"]),
		debugAddr: net.JoinHostPort(host("DEBUG_HOST"), vars["DEBUG_PORT"])}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	args = append([]string{"-envoy-env", "-listen", "127.0.0.1:0"}, args...)
	go func() { e.done <- runEnv(ctx, args, e.out, env) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", e.grpcAddr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-e.done:
			t.Fatalf("the edge ended: %v\n%s", err, e.out.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("gRPC %s not accepting within 15 s:\n%s", e.grpcAddr, e.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient(e.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.client = rlspb.NewRateLimitServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		e.stop()
	})
	return e
}

func (e *envoyEdge) stop() error {
	if !e.stopped {
		e.stopped = true
		e.cancel()
		select {
		case e.stopResult = <-e.done:
		case <-time.After(15 * time.Second):
			e.stopResult = fmt.Errorf("run did not return within 15 s")
		}
	}
	return e.stopResult
}

// request builds a RateLimitRequest as envoyproxy/ratelimit's tests do
// (test/common NewRateLimitRequest): descriptors of key, value entries.
func request(domain string, hits uint32, descriptors ...[]string) *rlspb.RateLimitRequest {
	r := &rlspb.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, kv := range descriptors {
		d := &rlcommon.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

func (e *envoyEdge) ask(t *testing.T, r *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v\n%s", r, err, e.out.String())
	}
	return resp
}

// status is a descriptor status as envoyproxy/ratelimit's integration
// tests build it (newDescriptorStatus): the duration until reset is the
// one answered, in whole seconds.
func status(code rlspb.RateLimitResponse_Code, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32, got *rlspb.RateLimitResponse_DescriptorStatus) *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining:     remaining,
		DurationUntilReset: &durationpb.Duration{Seconds: got.GetDurationUntilReset().GetSeconds()},
	}
}

func wantResp(t *testing.T, what string, got *rlspb.RateLimitResponse, overall rlspb.RateLimitResponse_Code, statuses ...*rlspb.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	want := &rlspb.RateLimitResponse{OverallCode: overall, Statuses: statuses}
	if !proto.Equal(want, got) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
	// The duration until reset, copied above as ratelimit's tests copy
	// it, is the time to the end of the window aligned on the Unix epoch,
	// in whole seconds (one second of slack for the call).
	for i, s := range got.Statuses {
		unit := map[rlspb.RateLimitResponse_RateLimit_Unit]time.Duration{rlspb.RateLimitResponse_RateLimit_SECOND: time.Second,
			rlspb.RateLimitResponse_RateLimit_MINUTE: time.Minute, rlspb.RateLimitResponse_RateLimit_HOUR: time.Hour,
			rlspb.RateLimitResponse_RateLimit_DAY: 24 * time.Hour}[s.GetCurrentLimit().GetUnit()]
		if unit == 0 {
			continue
		}
		left := unit - time.Duration(time.Now().UnixNano())%unit
		if d := s.GetDurationUntilReset().AsDuration(); d > left+time.Second || d < left-2*time.Second {
			t.Fatalf("%s: status %d: duration until reset %v, the window ends in %v", what, i, d, left)
		}
	}
}

// awayFromEdge waits, when a window of length w ends within the next 3 s,
// until it has begun again: a run of calls that crossed it would count in
// two windows.
func awayFromEdge(w time.Duration) {
	if left := w - time.Duration(time.Now().UnixNano())%w; left < 3*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// basicBaseConfig replays envoyproxy/ratelimit's integration test of its
// runtime files (test/integration, testBasicBaseConfig) against an edge
// started from the same environment: the same requests, the same answers
// compared whole.
func basicBaseConfig(t *testing.T, e *envoyEdge, localCache bool) {
	key := func(k string) string {
		if localCache {
			return k + "_local"
		}
		return k
	}
	const (
		ok   = rlspb.RateLimitResponse_OK
		over = rlspb.RateLimitResponse_OVER_LIMIT
	)
	resp := e.ask(t, request("foo", 1, []string{key("hello"), "world"}))
	wantResp(t, "unknown domain", resp, ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok})

	awayFromEdge(time.Second)
	resp = e.ask(t, request("basic", 1, []string{key("key1"), "foo"}))
	wantResp(t, "basic key1", resp, ok, status(ok, 50, rlspb.RateLimitResponse_RateLimit_SECOND, 49, resp.Statuses[0]))

	awayFromEdge(time.Minute)
	r := strconv.Itoa(rand.Int())
	for i := 0; i < 25; i++ {
		resp = e.ask(t, request("another", 1, []string{key("key2"), r}))
		code, remaining := ok, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = over, 0
		}
		wantResp(t, fmt.Sprintf("key2 call %d", i+1), resp, code, status(code, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, remaining, resp.Statuses[0]))
	}

	awayFromEdge(time.Minute)
	r = strconv.Itoa(rand.Int())
	for i := 0; i < 15; i++ {
		resp = e.ask(t, request("another", 1, []string{key("key2"), r}, []string{key("key3"), r}))
		code, rem1, rem2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, rem2 = over, 0
		}
		wantResp(t, fmt.Sprintf("key2, key3 call %d", i+1), resp, code,
			status(ok, 20, rlspb.RateLimitResponse_RateLimit_MINUTE, rem1, resp.Statuses[0]),
			status(code, 10, rlspb.RateLimitResponse_RateLimit_HOUR, rem2, resp.Statuses[1]))
	}

	resp1 := e.ask(t, request("another", 1, []string{key("key4"), "durTest"}))
	time.Sleep(2 * time.Second)
	resp2 := e.ask(t, request("another", 1, []string{key("key4"), "durTest"}))
	if a, b := resp1.Statuses[0].GetDurationUntilReset().GetSeconds(), resp2.Statuses[0].GetDurationUntilReset().GetSeconds(); b >= a {
		t.Fatalf("duration until reset %d s, then %d s two seconds later: want it shorter", a, b)
	}
}

// ratelimitEnv is the environment of envoyproxy/ratelimit's integration
// tests (test/integration defaultSettings and makeSimpleRedisSettings),
// the runtime directory where the test copied it, the ports free ones and
// the hosts the loopback address, where ratelimit binds 0.0.0.0.
func ratelimitEnv(t *testing.T) []string {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("testdata/ratelimit-runtime")); err != nil {
		t.Fatal(err)
	}
	return append([]string{
		"USE_STATSD=false",
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config",
		"REDIS_PERSECOND_SOCKET_TYPE=tcp",
		"REDIS_SOCKET_TYPE=tcp",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
	}, loopbackPorts(t)...)
}

// envoyproxy/ratelimit's own integration environment starts poplimit
// with Redis and memcached, which answers its integration test's requests
// as ratelimit does.
func TestEnvoyEnvRatelimitIntegration(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		rd := testenv.Redis(t)
		env := append(ratelimitEnv(t), "BACKEND_TYPE=redis", "REDIS_URL="+rd.Addr, "REDIS_PERSECOND_URL=127.0.0.1:1",
			"REDIS_PERSECOND=false", "LOCAL_CACHE_SIZE_IN_BYTES=0")
		basicBaseConfig(t, startEnvoyEnv(t, env), false)
	})
	t.Run("redis with auth and local cache", func(t *testing.T) {
		rd := testenv.Redis(t, "--requirepass", "password123")
		env := append(ratelimitEnv(t), "BACKEND_TYPE=redis", "REDIS_URL="+rd.Addr, "REDIS_AUTH=password123",
			"REDIS_PERSECOND_AUTH=password123", "LOCAL_CACHE_SIZE_IN_BYTES=1000")
		basicBaseConfig(t, startEnvoyEnv(t, env), true)
	})
	t.Run("memcache", func(t *testing.T) {
		mc := testenv.Memcached(t)
		env := append(ratelimitEnv(t), "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT="+mc.Addr, "LOCAL_CACHE_SIZE_IN_BYTES=0")
		basicBaseConfig(t, startEnvoyEnv(t, env), false)
	})
}

// istioConfig is the ConfigMap Istio's samples/ratelimit mounts.
const istioConfig = `domain: echo-ratelimit
descriptors:
  - key: PATH
    value: "/"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// Istio's sample environment starts poplimit over a ConfigMap volume and
// Redis: gRPC, /json and /healthcheck answer as envoyproxy/ratelimit's,
// /metrics is on the debug port, and SIGTERM's shutdown turns the health
// check to 500 before the port closes.
func TestEnvoyEnvIstioSample(t *testing.T) {
	rd := testenv.Redis(t)
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	env := append(istioEnv(rd.Addr, root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1", "REDIS_SERVICE_HOST=10.0.0.1", "REDIS_PORT=tcp://10.0.0.1:6379") // Kubernetes' service variables
	e := startEnvoyEnv(t, env)
	const ok, over = rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT
	awayFromEdge(time.Minute)
	resp := e.ask(t, request("echo-ratelimit", 1, []string{"PATH", "/"}))
	wantResp(t, "first /", resp, ok, status(ok, 1, rlspb.RateLimitResponse_RateLimit_MINUTE, 0, resp.Statuses[0]))
	resp = e.ask(t, request("echo-ratelimit", 1, []string{"PATH", "/"}))
	wantResp(t, "second /", resp, over, status(over, 1, rlspb.RateLimitResponse_RateLimit_MINUTE, 0, resp.Statuses[0]))
	resp = e.ask(t, request("echo-ratelimit", 1, []string{"PATH", "/other"}))
	wantResp(t, "/other", resp, ok, status(ok, 100, rlspb.RateLimitResponse_RateLimit_MINUTE, 99, resp.Statuses[0]))
	if len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("headers %v: LIMIT_RESPONSE_HEADERS_ENABLED is false, want none", resp.ResponseHeadersToAdd)
	}

	// POST /json, as ratelimit's README shows it with curl.
	post := func(body string) (int, *rlspb.RateLimitResponse) {
		t.Helper()
		res, err := http.Post("http://"+e.httpAddr+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode == http.StatusBadRequest {
			return res.StatusCode, nil
		}
		var r rlspb.RateLimitResponse
		if err := protojson.Unmarshal(b, &r); err != nil {
			t.Fatalf("/json answered %d %q: %v", res.StatusCode, b, err)
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("/json Content-Type %q", ct)
		}
		return res.StatusCode, &r
	}
	code, r := post(`{"domain": "echo-ratelimit", "descriptors": [{"entries": [{"key": "PATH", "value": "/"}]}]}`)
	if code != http.StatusTooManyRequests {
		t.Fatalf("/json over the limit: %d, want 429", code)
	}
	wantResp(t, "/json over the limit", r, over, status(over, 1, rlspb.RateLimitResponse_RateLimit_MINUTE, 0, r.Statuses[0]))
	code, r = post(`{"domain": "echo-ratelimit", "descriptors": [{"entries": [{"key": "PATH", "value": "/other"}]}]}`)
	if code != http.StatusOK {
		t.Fatalf("/json under the limit: %d, want 200", code)
	}
	wantResp(t, "/json under the limit", r, ok, status(ok, 100, rlspb.RateLimitResponse_RateLimit_MINUTE, 98, r.Statuses[0]))
	for _, bad := range []string{`{"domain": `, `{"domain": "echo-ratelimit"}`, `{"domain": "", "descriptors": [{"entries": [{"key": "PATH"}]}]}`, `{"nope": 1}`} {
		if code, _ := post(bad); code != http.StatusBadRequest {
			t.Errorf("/json %s: %d, want 400", bad, code)
		}
	}

	get := func(url string) (int, string) {
		t.Helper()
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("http://" + e.httpAddr + "/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("/healthcheck: %d %q, want 200 OK", code, body)
	}
	code, body := get("http://" + e.debugAddr + "/metrics")
	if code != 200 || !strings.Contains(body, `poplimit_rls_http_requests_total{code="429",path="json"} 1`) ||
		!strings.Contains(body, `poplimit_rls_http_requests_total{code="400",path="json"} 4`) {
		t.Errorf("/metrics on the debug port: %d, want the /json answers counted:\n%s", code, grepLines(body, "poplimit_rls_http"))
	}
	log := e.out.String()
	for _, v := range []string{"REDIS_SERVICE_HOST", "REDIS_PORT"} {
		if n := strings.Count(log, v+" set: not a setting of envoyproxy/ratelimit, ignored"); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", v, n, log)
		}
	}
	if err := e.stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, e.out.String())
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The descriptors of rules/envoyconf's basic.yaml (the shapes
// envoyproxy/ratelimit's config tests load), asked of an edge started
// from the environment and of one started from flags (-rules DIR
// -rls-listen -redis) over the same file, each on its own Redis: every
// answer is the same, three times over.
func TestEnvoyEnvAnswersAsFiles(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(t), "rules", "envoyconf", "testdata", "ratelimit", "basic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "basic.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	rdEnv, rdFlags := testenv.Redis(t), testenv.Redis(t)
	env := append([]string{"USE_STATSD=false", "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + rdEnv.Addr, "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1"}, loopbackPorts(t)...)
	byEnv := startEnvoyEnv(t, env)
	grpcPort := strconv.Itoa(testenv.FreePort(t))
	byFlags := startRun(t, "", "-rules", dir, "-rls-listen", "127.0.0.1:"+grpcPort, "-redis", rdFlags.Addr, "-rls-headers", "none")
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	files := &envoyEdge{client: rlspb.NewRateLimitServiceClient(conn), out: byFlags.out}
	cases := [][]string{
		{"key1", "value1", "subkey1", "x"}, {}, {"key1", "something"}, {"key1", "value1"}, {"key2", "value2", "subkey", "subvalue"},
		{"key5", "value5", "subkey5", "subvalue"}, {"key1", "value1", "subkey1", "something"}, {"key1", "value1", "subkey1", "subvalue1"},
		{"key2", "something"}, {"key2", "value2"}, {"key2", "value3"}, {"key3", "foo"}, {"key4", "foo"}, {"key5", "value5"},
		{"key5", "value5", "subkey5", "subvalue5"}, {"key6", "foo"}, {"key7", "unspecified_value"}, {"key7", "another_value"},
	}
	awayFromEdge(time.Second)
	n := 0
	for round := 0; round < 3; round++ {
		for i, kv := range cases {
			domain := "test-domain"
			if i == 0 {
				domain = "foo_domain"
			}
			req := request(domain, 1, kv)
			if len(kv) == 0 {
				req.Descriptors = []*rlcommon.RateLimitDescriptor{{}}
			}
			a, bb := byEnv.ask(t, req), files.ask(t, req)
			for _, r := range []*rlspb.RateLimitResponse{a, bb} {
				for _, s := range r.Statuses {
					s.DurationUntilReset = nil // the two edges may read the clock a second apart
				}
			}
			if !proto.Equal(a, bb) {
				t.Errorf("round %d, %s %v:\n env   %v\n files %v", round, domain, kv, a, bb)
			}
			n++
		}
	}
	if n != 54 {
		t.Fatalf("%d requests, want 54", n)
	}
}

// With Redis not yet up, Istio's environment starts poplimit all the
// same (envoyproxy/ratelimit waits for Redis before it serves): calls are
// answered by the limits' failure policy (open) within the store timeout,
// /healthcheck says OK, and counting starts once Redis is up.
func TestEnvoyEnvRedisDownAtStart(t *testing.T) {
	port := testenv.FreePort(t)
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	env := append(istioEnv("127.0.0.1:"+strconv.Itoa(port), root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1")
	e := startEnvoyEnv(t, env)
	const ok = rlspb.RateLimitResponse_OK
	for i := 0; i < 3; i++ {
		start := time.Now()
		resp := e.ask(t, request("echo-ratelimit", 1, []string{"PATH", "/"}))
		if took := time.Since(start); resp.OverallCode != ok || took > 2*time.Second {
			t.Fatalf("call %d with Redis down: %v after %v, want OK (fail open) within the store timeout", i, resp, took)
		}
		t.Logf("call %d with Redis down: %v in %v", i, resp.OverallCode, time.Since(start))
	}
	res, err := http.Get("http://" + e.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("/healthcheck with Redis down: %d, want 200", res.StatusCode)
	}
	rd := &testenv.Proc{Name: testenv.LookBinary(t, "redis-server", "redis-server"), Addr: "127.0.0.1:" + strconv.Itoa(port),
		Args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}}
	if err := rd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rd.Kill)
	// Once connected (the store tries again every second), the limit of
	// one a minute holds: some call within 10 s is refused.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := e.ask(t, request("echo-ratelimit", 1, []string{"PATH", "/"}))
		if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
			t.Logf("refused %v after Redis started", time.Since(deadline.Add(-10*time.Second)))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis up for 10 s, a limit of 1 a minute still admits: %v\n%s", resp, e.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
