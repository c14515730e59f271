package edge_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

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
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = addr
	}
	return concurrentlyTo(t, addrs, path)
}

// concurrentlyTo sends one request to each of addrs at once and returns
// their statuses.
func concurrentlyTo(t *testing.T, addrs []string, path string) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for _, addr := range addrs {
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
	got := concurrentlyTo(t, []string{a.addr, b.addr, a.addr, b.addr, a.addr}, "/slow")
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
