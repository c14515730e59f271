package edge_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
)

// testEdge is one running edge on a loopback port.
type testEdge struct {
	*edge.Edge
	srv    *httpedge.Server
	lim    *window.Limiter
	blocks *blockcache.Cache
	addr   string
	reg    edge.Registry
}

type edgeOpts struct {
	cfg httpedge.Config
	// Rule files to watch (rules, below, writes one of its own).
	rulesFile, overridesFile string
	reloadPoll               time.Duration
	rules                    string
	memcache                 []string // empty: in-memory store
	store                    window.Store
	flush                    time.Duration
}

// startEdge starts an edge through the one test harness, with the store
// settings these tests use: 2ms flushes, a 50ms store timeout and a shard
// ejected after two failures for 200ms.
func startEdge(t *testing.T, o edgeOpts) *testEdge {
	t.Helper()
	opts := edge.Options{Server: o.cfg, Store: o.store, RulesFile: o.rulesFile, OverridesFile: o.overridesFile, ReloadPoll: o.reloadPoll}
	opts.Limiter.FlushInterval = cmp.Or(o.flush, 2*time.Millisecond)
	opts.Limiter.StoreTimeout = 50 * time.Millisecond
	for _, a := range o.memcache {
		opts.Memcache.Servers = append(opts.Memcache.Servers, shardproxy.Server{Addr: a})
	}
	opts.Memcache.FailureLimit, opts.Memcache.RetryTimeout = 2, 200*time.Millisecond
	opts.BlockCache.MaxEntries = 1 << 14
	e := edgetest.Start(t, o.rules, opts)
	return &testEdge{Edge: e, srv: e.Server, lim: e.Limiter, blocks: e.Blocks, addr: e.Addr(), reg: e.Registry}
}

func (te *testEdge) shutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	te.Close(ctx)
}

func metricSum(t *testing.T, e *testEdge, name string, labels ...string) float64 {
	t.Helper()
	return testenv.MetricSum(t, e.reg, name, labels...)
}

var client = &http.Client{Timeout: 5 * time.Second}

func get(t *testing.T, addr, path string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// sfItem parses one structured-field list item `"name";k=v;k=v` as the
// RateLimit fields use it.
func sfItem(t *testing.T, v string) (string, map[string]int64) {
	t.Helper()
	parts := strings.Split(v, ";")
	name, err := strconv.Unquote(parts[0])
	if err != nil {
		t.Fatalf("%q: the policy name is not an sf-string: %v", v, err)
	}
	params := map[string]int64{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if !ok || err != nil {
			t.Fatalf("%q: parameter %q is not key=integer", v, p)
		}
		params[k] = n
	}
	return name, params
}

const threePerMinute = `
rules:
  - name: api
    limit: 3
    window: 1m
`

func TestRefusalContract(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute})
	first := time.Now()
	for i := 0; i < 3; i++ {
		resp := get(t, e.addr, "/check/v1/x")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d, want 200", i, resp.StatusCode)
		}
		name, p := sfItem(t, resp.Header.Get("RateLimit"))
		if name != "api" || p["r"] != int64(2-i) {
			t.Errorf("request %d: RateLimit %q, want r=%d", i, resp.Header.Get("RateLimit"), 2-i)
		}
	}
	before := time.Now()
	req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/v1/x", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("4th of 3 per minute: status %d, want 429", resp.StatusCode)
	}
	h := resp.Header
	name, pol := sfItem(t, h.Get("RateLimit-Policy"))
	if name != "api" || pol["q"] != 3 || pol["w"] != 60 {
		t.Errorf("RateLimit-Policy %q, want \"api\";q=3;w=60", h.Get("RateLimit-Policy"))
	}
	_, rl := sfItem(t, h.Get("RateLimit"))
	if rl["r"] != 0 || rl["t"] < 1 || rl["t"] > 120 {
		t.Errorf("RateLimit %q, want r=0 and 1 ≤ t ≤ 120", h.Get("RateLimit"))
	}
	// 3 admitted within a moment: released when the first of them leaves
	// the trailing minute (the edge records a hot key's window shape, so
	// it does not take them as spread over their window). Retry-After
	// must not come before that.
	release := first.Add(time.Minute)
	ra, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || before.Add(time.Duration(ra)*time.Second).Before(release.Add(-time.Second)) {
		t.Errorf("Retry-After %q: before the release time %v (now %v)", h.Get("Retry-After"), release, before)
	}
	if h.Get("X-RateLimit-Limit") != "3" || h.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("X-RateLimit-Limit %q Remaining %q, want 3 and 0", h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"))
	}
	if reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64); reset < before.Unix() || reset > release.Unix()+1 {
		t.Errorf("X-RateLimit-Reset %q, want a Unix time up to the release %d", h.Get("X-RateLimit-Reset"), release.Unix())
	}
	if ct := h.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var prob struct {
		Type, Title, Detail, Policy string
		Status                      int
		RetryAfter                  int `json:"retry_after"`
	}
	if err := json.Unmarshal(body, &prob); err != nil {
		t.Fatalf("problem body %q: %v", body, err)
	}
	if prob.Status != 429 || prob.Title != "Too Many Requests" || prob.Policy != "api" || prob.Type == "" || prob.RetryAfter != ra {
		t.Errorf("problem %+v", prob)
	}
	// The next request is answered from the block cache (once ristretto has
	// applied the buffered set: it does so asynchronously).
	e.blocks.Wait()
	get(t, e.addr, "/check/v1/x")
	if n := testenv.MetricSum(t, e.reg, "poplimit_edge_requests_total", "rule", "api", "decision", "limited", "source", "blockcache"); n != 1 {
		t.Errorf("blockcache refusals = %v, want 1", n)
	}
}

func TestRetryAfterJitterNeverEarly(t *testing.T) {
	now := time.Now().UnixNano()
	release := now + int64(1500*time.Millisecond)
	seen := map[int64]bool{}
	for i := 0; i < 1000; i++ {
		ra := decision.RetryAfter(release, now, 3*time.Second)
		if ra < 2 || ra > 5 {
			t.Fatalf("Retry-After %d for a release 1.5 s away with 3 s jitter, want 2..5", ra)
		}
		seen[ra] = true
	}
	if len(seen) < 3 {
		t.Errorf("jitter produced only %v", seen)
	}
}

func TestKeysAndMissingKeys(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
match: all
rules:
  - name: by-api-key
    path_prefix: /api
    key: ["header:X-API-Key"]
    missing_key: deny
    limit: 2
    window: 1m
  - name: by-user
    path_prefix: /q
    key: ["query:user", "cookie:sid"]
    missing_key: skip
    limit: 1
    window: 1m
  - name: fallback-ip
    path_prefix: /f
    key: ["header:X-Token"]
    limit: 1
    window: 1m
`})
	if s := get(t, e.addr, "/api/x").StatusCode; s != 400 {
		t.Errorf("no API key under missing_key: deny: status %d, want 400", s)
	}
	for i, want := range []int{200, 200, 429} {
		if s := get(t, e.addr, "/api/x", "X-API-Key", "k1").StatusCode; s != want {
			t.Errorf("key k1 request %d: %d, want %d", i, s, want)
		}
	}
	if s := get(t, e.addr, "/api/x", "X-API-Key", "k2").StatusCode; s != 200 {
		t.Errorf("another key: %d, want 200", s)
	}
	// Both parts needed; with one missing the rule is skipped.
	for i := 0; i < 3; i++ {
		if s := get(t, e.addr, "/q?user=a").StatusCode; s != 200 {
			t.Errorf("skipped rule refused: %d", s)
		}
	}
	if s := get(t, e.addr, "/q?user=a", "Cookie", "sid=1").StatusCode; s != 200 {
		t.Errorf("first composite: %d", s)
	}
	if s := get(t, e.addr, "/q?user=a", "Cookie", "sid=1").StatusCode; s != 429 {
		t.Errorf("second composite: %d, want 429", s)
	}
	// Missing token falls back to the client IP, not to one shared bucket.
	if s := get(t, e.addr, "/f").StatusCode; s != 200 {
		t.Errorf("fallback first: %d", s)
	}
	if s := get(t, e.addr, "/f").StatusCode; s != 429 {
		t.Errorf("fallback second from the same IP: %d, want 429", s)
	}
	if s := get(t, e.addr, "/f", "X-Token", "t").StatusCode; s != 200 {
		t.Errorf("with a token after the IP fallback was used: %d, want 200", s)
	}
}

func TestShadowRuleNeverRefuses(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: s, limit: 1, window: 1m, shadow: true}]"})
	for i := 0; i < 5; i++ {
		if s := get(t, e.addr, "/").StatusCode; s != 200 {
			t.Fatalf("shadow rule answered %d", s)
		}
	}
	if n := testenv.MetricSum(t, e.reg, "poplimit_edge_requests_total", "rule", "s", "decision", "shadow_limited", "source", "limiter"); n != 4 {
		t.Errorf("shadow refusals counted %v, want 4", n)
	}
}

func TestTwoEdgesShareMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	rules := "rules: [{name: shared, limit: 20, window: 1m}]"
	a := startEdge(t, edgeOpts{rules: rules, memcache: addrs})
	b := startEdge(t, edgeOpts{rules: rules, memcache: addrs})
	allowed := 0
	for i := 0; i < 60; i++ {
		e := a
		if i%2 == 1 {
			e = b
		}
		if get(t, e.addr, "/").StatusCode == 200 {
			allowed++
		}
		time.Sleep(5 * time.Millisecond) // let flushes land, as client think time would
	}
	if allowed < 20 || allowed > 22 {
		t.Errorf("two edges admitted %d for one client under 20 per minute, want 20 (at most one more per edge)", allowed)
	}
}

func TestShutdownFlushesCounters(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	rules := "rules: [{name: flushme, limit: 1000, window: 1m}]"
	// A long flush interval: nothing is flushed unless shutdown does it.
	e := startEdge(t, edgeOpts{rules: rules, memcache: addrs, flush: time.Minute})
	for i := 0; i < 37; i++ {
		get(t, e.addr, "/")
	}
	e.shutdown(t)
	mc, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: addrs[0]}, {Addr: addrs[1]}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	r := e.srv.Rules().Rules[0]
	key := r.Hash([]byte("127.0.0.1"))
	start := time.Now().Truncate(time.Minute).UnixMilli()
	got, err := mc.Get(context.Background(), key, start)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 37 {
		t.Errorf("memcached counter after shutdown = %d, want the 37 admitted", got[0])
	}
}

func TestStoreDownFailOpenAndClosed(t *testing.T) {
	shards, addrs := testenv.Shards(t, 1)
	e := startEdge(t, edgeOpts{memcache: addrs, rules: `
rules:
  - name: open
    path_prefix: /open
    limit: 100
    window: 1m
  - name: closed
    path_prefix: /closed
    limit: 100
    window: 1m
    fail: closed
  - name: closed-sync
    path_prefix: /login
    limit: 100
    window: 1m
    mode: sync
    fail: closed
`})
	for _, p := range []string{"/open", "/closed", "/login"} {
		if s := get(t, e.addr, p).StatusCode; s != 200 {
			t.Fatalf("%s with memcached up: %d", p, s)
		}
	}
	shards[0].Kill()
	// The edge learns that the store died from its own traffic: the
	// flushes of these fail, and the shard is ejected.
	deadline := time.Now().Add(3 * time.Second)
	for e.Ready() && time.Now().Before(deadline) {
		get(t, e.addr, "/open")
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		path string
		want int
	}{{"/open", 200}, {"/closed", 429}, {"/login", 429}} {
		start := time.Now()
		s := get(t, e.addr, tc.path).StatusCode
		if s != tc.want {
			t.Errorf("%s with memcached down: %d, want %d", tc.path, s, tc.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s took %v with the store down", tc.path, d)
		}
	}
	if e.Ready() {
		t.Error("ready with the store down and fail-closed rules")
	}
}

func TestReloadGoodAndBadFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	os.WriteFile(path, []byte("rules: [{name: one, limit: 1, window: 1m}]"), 0o644)
	rs, err := decision.LoadFiles(path, "")
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeOpts{rulesFile: path})
	_ = rs
	get(t, e.addr, "/")
	if s := get(t, e.addr, "/").StatusCode; s != 429 {
		t.Fatalf("second of 1: %d", s)
	}
	// A good file raises the limit and drops cached blocks.
	os.WriteFile(path, []byte("rules: [{name: one, limit: 5, window: 1m}]"), 0o644)
	if err := e.Reload(); err != nil {
		t.Fatal(err)
	}
	if s := get(t, e.addr, "/").StatusCode; s != 200 {
		t.Errorf("after raising the limit: %d, want 200", s)
	}
	// A bad file is rejected with every error, and the rules stay.
	os.WriteFile(path, []byte("rules: [{name: one, limit: -1, window: 1m, mode: fast}]"), 0o644)
	err = e.Reload()
	if err == nil || !strings.Contains(err.Error(), "rules[0].limit") || !strings.Contains(err.Error(), "rules[0].mode") {
		t.Errorf("bad reload: %v, want both errors", err)
	}
	if got := e.srv.Rules().Rules[0].Limit; got != 5 {
		t.Errorf("limit after a rejected reload = %d, want 5", got)
	}
	if n := testenv.MetricSum(t, e.reg, "poplimit_edge_rule_reloads_total", "result", "rejected"); n != 1 {
		t.Errorf("rejected reloads counted %v, want 1", n)
	}
}

func TestProxyMode(t *testing.T) {
	// A real upstream.
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			time.Sleep(500 * time.Millisecond)
		}
		ctx.Response.Header.Set("X-Origin", "yes")
		fmt.Fprintf(ctx, "origin saw %s", ctx.Path())
	}}
	go up.Serve(uln)
	defer up.Shutdown()
	e := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 2, window: 1m}]",
		cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: uln.Addr().String(), UpstreamTimeout: 200 * time.Millisecond}})
	resp, err := client.Get("http://" + e.addr + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "origin saw /hello" || resp.Header.Get("X-Origin") != "yes" || resp.Header.Get("RateLimit") == "" {
		t.Errorf("proxied: %d %q origin=%q ratelimit=%q", resp.StatusCode, body, resp.Header.Get("X-Origin"), resp.Header.Get("RateLimit"))
	}
	if s := get(t, e.addr, "/slow").StatusCode; s != 504 {
		t.Errorf("slow upstream: %d, want 504", s)
	}
	if s := get(t, e.addr, "/x").StatusCode; s != 429 {
		t.Errorf("third of 2: %d, want 429", s)
	}
	up.Shutdown()
	uln.Close()
	e2 := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 2, window: 1m}]",
		cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: uln.Addr().String(), UpstreamTimeout: 200 * time.Millisecond}})
	if s := get(t, e2.addr, "/x").StatusCode; s != 502 {
		t.Errorf("upstream down: %d, want 502", s)
	}
}

const decideToken = "s3cret-token-of-sixteen"

// postDecide posts body to the JSON decision endpoint with the token.
func postDecide(t *testing.T, addr, token, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/_poplimit/decide", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestDecideJSON(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{DecideToken: decideToken}})
	post := func(body string) (int, httpedge.DecideResponse) {
		resp := postDecide(t, e.addr, decideToken, body)
		defer resp.Body.Close()
		var d httpedge.DecideResponse
		json.NewDecoder(resp.Body).Decode(&d)
		return resp.StatusCode, d
	}
	if s, d := post(`{"rule":"api","key":"k","cost":2}`); s != 200 || !d.Allowed || d.Remaining != 1 {
		t.Errorf("cost 2 of 3: %d %+v", s, d)
	}
	if s, d := post(`{"rule":"api","key":"k","cost":2}`); s != 429 || d.Allowed || d.RetryMillis <= 0 {
		t.Errorf("cost 2 more: %d %+v", s, d)
	}
	if s, _ := post(`{"rule":"nope","key":"k"}`); s != 404 {
		t.Errorf("unknown rule: %d", s)
	}
	if s, _ := post(`{not json`); s != 400 {
		t.Errorf("bad json: %d", s)
	}
}

// The JSON endpoint spends any key's quota, so it needs its token: a
// caller without it (or with another) gets 401 and spends nothing; with no
// token configured the endpoint is off and the path is a check like any.
func TestDecideJSONNeedsItsToken(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1, window: 1m}]", cfg: httpedge.Config{DecideToken: decideToken}})
	for _, tok := range []string{"", "wrong-token-of-sixteen!", decideToken + "x"} {
		resp := postDecide(t, e.addr, tok, `{"rule":"api","key":"victim"}`)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("token %q: %d %v, want 401 with WWW-Authenticate", tok, resp.StatusCode, resp.Header)
		}
	}
	resp := postDecide(t, e.addr, decideToken, `{"rule":"api","key":"victim"}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the victim's first decision after the refused callers: %d, want 200 (nothing spent)", resp.StatusCode)
	}

	off := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1, window: 1m}]"})
	for i, want := range []int{200, 429} { // a check of the path, keyed by the caller's address
		resp := postDecide(t, off.addr, decideToken, `{"rule":"api","key":"victim"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || strings.Contains(string(body), `"allowed"`) {
			t.Errorf("endpoint off, request %d: %d %s, want %d as a check", i+1, resp.StatusCode, body, want)
		}
	}
}

// The JSON endpoint decides rate rules only: a concurrency or shed rule
// depends on live requests, and saying "allowed" for it would be a guess.
func TestDecideJSONRefusesLiveKinds(t *testing.T) {
	e := startEdge(t, edgeOpts{cfg: httpedge.Config{DecideToken: decideToken}, rules: `
rules:
  - {name: uploads, kind: concurrency, limit: 1}
  - {name: reports, kind: shed, path_prefix: /reports, priority: low}
  - {name: api, limit: 3, window: 1m}
`})
	for _, rule := range []string{"uploads", "reports"} {
		resp := postDecide(t, e.addr, decideToken, `{"rule":"`+rule+`","key":"k"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "cannot be decided for a key") {
			t.Errorf("%s: %d %s %s, want 422 problem+json saying it cannot be decided", rule, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
}

func TestMetricsLint(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute})
	get(t, e.addr, "/")
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

// TestHostileHeaders sends a request head over the limit and checks it is
// refused with 431 and the edge keeps serving.
func TestHostileHeaders(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{MaxHeaderSize: 4096}})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 10000))
	status, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(status, "431") {
		t.Errorf("oversized head answered %q, want 431", status)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); get(t, e.addr, "/") }()
	wg.Wait()
}

// slowUpstream is a real upstream whose /slow answers after d.
func slowUpstream(t *testing.T, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if strings.HasPrefix(string(ctx.Path()), "/slow") {
			time.Sleep(d)
		}
	}}
	go up.Serve(ln)
	t.Cleanup(func() { up.Shutdown() })
	return ln.Addr().String()
}

// concurrently sends n requests at once and returns their statuses.
func concurrently(t *testing.T, n int, addr, path string) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + addr + path)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			got[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got
}

func TestConcurrencyLimit(t *testing.T) {
	_, addrs := testenv.Shards(t, 1)
	up := slowUpstream(t, 300*time.Millisecond)
	rules := "rules: [{name: inflight, kind: concurrency, limit: 2, lease: 5s}]"
	cfg := httpedge.Config{Mode: httpedge.Proxy, Upstream: up, UpstreamTimeout: 2 * time.Second}
	a := startEdge(t, edgeOpts{rules: rules, memcache: addrs, cfg: cfg})
	b := startEdge(t, edgeOpts{rules: rules, memcache: addrs, cfg: cfg})
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for _, e := range []*testEdge{a, b, a, b, a} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + e.addr + "/slow")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			got[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if got[200] != 2 || got[429] != 3 {
		t.Errorf("5 concurrent requests across two edges under 2 in flight: %v, want 2×200 and 3×429", got)
	}
	// The slots came back when the responses completed.
	if got := concurrently(t, 2, a.addr, "/slow"); got[200] != 2 {
		t.Errorf("after completion: %v, want 2×200", got)
	}
}

func TestLoadShedding(t *testing.T) {
	up := slowUpstream(t, 400*time.Millisecond)
	e := startEdge(t, edgeOpts{cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: up, UpstreamTimeout: 2 * time.Second}, rules: `
shedding:
  max_in_flight: 4
  reserved: 0.25
rules:
  - {name: reports, kind: shed, path_prefix: /reports, priority: low}
  - {name: pay, kind: shed, path_prefix: /pay, priority: critical}
  - {name: per-client, limit: 1000, window: 1m}
`})
	// Three slow requests in flight: load 0.75, past low's 0.45 and
	// normal's 0.6, short of critical's 1.
	done := make(chan map[int]int)
	go func() { done <- concurrently(t, 3, e.addr, "/slow") }()
	time.Sleep(150 * time.Millisecond)
	if s := get(t, e.addr, "/reports/x").StatusCode; s != 503 {
		t.Errorf("low priority under load: %d, want 503", s)
	}
	if s := get(t, e.addr, "/other").StatusCode; s != 503 {
		t.Errorf("normal priority at 75%% load: %d, want 503", s)
	}
	if s := get(t, e.addr, "/pay/x").StatusCode; s != 200 {
		t.Errorf("critical under load: %d, want 200", s)
	}
	if got := <-done; got[200] != 3 {
		t.Errorf("the slow requests: %v", got)
	}
	if s := get(t, e.addr, "/reports/x").StatusCode; s != 200 {
		t.Errorf("low priority after the load passed: %d, want 200", s)
	}
	if n := testenv.MetricSum(t, e.reg, "poplimit_edge_shed_total", "priority", "low"); n != 1 {
		t.Errorf("shed low counted %v, want 1", n)
	}
}

// Two edges sharing one Redis limit a client once, as with memcached.
func TestTwoEdgesShareRedis(t *testing.T) {
	r := testenv.Redis(t)
	rules := "rules: [{name: login, path_prefix: /login, limit: 3, window: 1m, mode: sync}, {name: shared, limit: 20, window: 1m}]"
	start := func() *testEdge {
		opts := edge.Options{}
		opts.Redis.Addrs = []string{r.Addr}
		opts.Limiter.FlushInterval = 2 * time.Millisecond
		e := edgetest.Start(t, rules, opts)
		return &testEdge{Edge: e, srv: e.Server, lim: e.Limiter, blocks: e.Blocks, addr: e.Addr(), reg: e.Registry}
	}
	a, b := start(), start()
	allowed := 0
	for i := 0; i < 60; i++ {
		e := a
		if i%2 == 1 {
			e = b
		}
		if get(t, e.addr, "/").StatusCode == 200 {
			allowed++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if allowed < 20 || allowed > 22 {
		t.Errorf("two edges on one Redis admitted %d for one client under 20 per minute, want 20 (at most one more per edge)", allowed)
	}
	sync := 0
	for i := 0; i < 8; i++ {
		e := a
		if i%2 == 1 {
			e = b
		}
		if get(t, e.addr, "/login").StatusCode == 200 {
			sync++
		}
	}
	if sync != 3 {
		t.Errorf("sync rule through two edges on one Redis admitted %d, want exactly 3", sync)
	}
	if n := testenv.MetricSum(t, a.reg, "poplimit_redis_ops_total"); n == 0 {
		t.Error("no Redis operation counted")
	}
}
