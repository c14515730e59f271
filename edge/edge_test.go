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

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
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
	store                    store.Store
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
