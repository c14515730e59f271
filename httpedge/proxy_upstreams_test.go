package httpedge_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// countingOrigin is a real HTTP server that counts its requests, answers
// /health with health (200 unless set), and everything else with status.
type countingOrigin struct {
	addr   string
	hits   atomic.Int64
	checks atomic.Int64 // health checks
	health atomic.Int32
	status atomic.Int32
}

func startCountingOrigin(t *testing.T) *countingOrigin {
	t.Helper()
	o := &countingOrigin{}
	o.health.Store(200)
	o.status.Store(200)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			o.checks.Add(1)
			w.WriteHeader(int(o.health.Load()))
			return
		}
		o.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(int(o.status.Load()))
		io.WriteString(w, o.addr)
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// TestProxyRoundRobinAndHealthChecks spreads requests over three
// upstreams, skips the one failing its health checks, and takes it back
// once it passes.
func TestProxyRoundRobinAndHealthChecks(t *testing.T) {
	ups := []*countingOrigin{startCountingOrigin(t), startCountingOrigin(t), startCountingOrigin(t)}
	e := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 1000000, window: 1m}]", cfg: httpedge.Config{Mode: httpedge.Proxy,
		Upstream:           ups[0].addr + ", " + ups[1].addr + "," + ups[2].addr,
		UpstreamHealthPath: "/health", UpstreamHealthInterval: 30 * time.Millisecond, UpstreamHealthTimeout: 30 * time.Millisecond,
		UpstreamHealthThreshold: 2}})
	healthy := func(o *countingOrigin) float64 {
		return metricSum(t, e, "poplimit_edge_upstream_healthy", "upstream", o.addr)
	}
	round := func(n int) []int64 {
		t.Helper()
		var before []int64
		for _, o := range ups {
			before = append(before, o.hits.Load())
		}
		for i := 0; i < n; i++ {
			if s := get(t, e.addr, "/x").StatusCode; s != 200 {
				t.Fatalf("request %d: status %d", i, s)
			}
		}
		var got []int64
		for i, o := range ups {
			got = append(got, o.hits.Load()-before[i])
		}
		return got
	}
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests over 3 healthy upstreams: %v, want [10 10 10]", got)
	}
	ups[1].health.Store(503)
	testenv.WaitFor(t, 5*time.Second, "the failing upstream marked unhealthy", func() bool { return healthy(ups[1]) == 0 })
	if got := round(30); fmt.Sprint(got) != "[15 0 15]" {
		t.Errorf("30 requests with the second upstream failing its checks: %v, want [15 0 15]", got)
	}
	ups[1].health.Store(200)
	testenv.WaitFor(t, 5*time.Second, "the upstream back", func() bool { return healthy(ups[1]) == 1 })
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests after it passed again: %v, want [10 10 10]", got)
	}
	// All failing: requests still go to all of them rather than none.
	for _, o := range ups {
		o.health.Store(500)
	}
	testenv.WaitFor(t, 5*time.Second, "all upstreams unhealthy", func() bool {
		return healthy(ups[0])+healthy(ups[1])+healthy(ups[2]) == 0
	})
	if got := round(30); fmt.Sprint(got) != "[10 10 10]" {
		t.Errorf("30 requests with every upstream failing its checks: %v, want [10 10 10]", got)
	}
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	// The checks stop with the server: Serve returns once every check
	// loop has (the signal shutdown waits for), so no goroutine is left
	// that could check again. No test of this package runs in parallel,
	// so a loop alive now is this server's.
	e.shutdown(t)
	buf := make([]byte, 1<<22)
	if st := buf[:runtime.Stack(buf, true)]; bytes.Contains(st, []byte("(*upstreamPool).checkLoop")) {
		t.Errorf("a health-check loop still runs after Serve returned:\n%s", st)
	}
}

// closingOrigin accepts connections and closes each at once: every
// request sent to it fails with a connection error.
func closingOrigin(t *testing.T) *rawOrigin {
	return startRawOrigin(t, func(*wireMsg) []byte { return nil })
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func send(t *testing.T, addr, method, path string, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader("payload"))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestProxyRetries(t *testing.T) {
	const rules = "rules: [{name: p, limit: 1000000, window: 1m}]"
	t.Run("idempotent requests go to the next upstream", func(t *testing.T) {
		good := startCountingOrigin(t)
		e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: deadAddr(t) + "," + good.addr}})
		for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"} {
			for i := 0; i < 2; i++ { // one of the two picks the dead upstream first
				if s := send(t, e.addr, m, "/r"); s != 200 {
					t.Errorf("%s %d with one upstream refusing connections: %d, want 200", m, i, s)
				}
			}
		}
		if n := metricSum(t, e, "poplimit_edge_upstream_retries_total"); n != 6 {
			t.Errorf("retries counted %v, want 6", n)
		}
		codes := map[int]int{}
		for i := 0; i < 4; i++ {
			codes[send(t, e.addr, "POST", "/r")]++
		}
		if codes[200] != 2 || codes[502] != 2 {
			t.Errorf("4 POSTs without an idempotency key: %v, want 2×200 and 2×502 (never retried)", codes)
		}
		codes = map[int]int{}
		for i := 0; i < 4; i++ {
			codes[send(t, e.addr, "PATCH", "/r", "Idempotency-Key", "k"+strconv.Itoa(i))]++
		}
		if codes[200] != 4 {
			t.Errorf("4 PATCHes with Idempotency-Key: %v, want 4×200", codes)
		}
	})
	t.Run("at most the configured retries", func(t *testing.T) {
		for _, tc := range []struct {
			retries, attempts int
		}{{-1, 1}, {0, 2}, {2, 3}} {
			closers := []*rawOrigin{closingOrigin(t), closingOrigin(t), closingOrigin(t), closingOrigin(t)}
			var list []string
			for _, c := range closers {
				list = append(list, c.addr)
			}
			e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: strings.Join(list, ","),
				UpstreamRetries: tc.retries}})
			if s := send(t, e.addr, "GET", "/r"); s != 502 {
				t.Errorf("retries %d: GET to upstreams that all close: %d, want 502", tc.retries, s)
			}
			var attempts int32
			for _, c := range closers {
				attempts += c.accepts.Load()
			}
			if attempts != int32(tc.attempts) {
				t.Errorf("UpstreamRetries %d: %d attempts, want %d", tc.retries, attempts, tc.attempts)
			}
		}
	})
	t.Run("never after a response or a timeout", func(t *testing.T) {
		a, b := startCountingOrigin(t), startCountingOrigin(t)
		a.status.Store(503)
		b.status.Store(503)
		e := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: a.addr + "," + b.addr,
			UpstreamTimeout: 300 * time.Millisecond}})
		if s := send(t, e.addr, "GET", "/r"); s != 503 {
			t.Errorf("upstream answering 503: %d, want its 503", s)
		}
		if n := a.hits.Load() + b.hits.Load(); n != 1 {
			t.Errorf("a 503 was sent %d times, want 1", n)
		}
		slow := startRawOrigin(t, func(*wireMsg) []byte { time.Sleep(time.Second); return okResponse("late") })
		e2 := startEdge(t, edgeOpts{rules: rules, cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: slow.addr,
			UpstreamTimeout: 300 * time.Millisecond}})
		if s := send(t, e2.addr, "GET", "/slow"); s != 504 {
			t.Errorf("slow upstream: %d, want 504", s)
		}
		if n := len(slow.requests()); n != 1 {
			t.Errorf("the slow upstream got the request %d times, want 1: a timeout is not retried", n)
		}
		if n := metricSum(t, e2, "poplimit_edge_upstream_errors_total", "kind", "timeout"); n != 1 {
			t.Errorf("timeouts counted %v, want 1", n)
		}
	})
}
