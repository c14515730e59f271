package httpedge_test

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// These tests drive the fasthttp front end alone: an httpedge.Server over
// a decision.Core, its limiter on the in-memory store (or the store a
// test gives), served on a loopback port. What the edge's assembly adds
// (edge.Build: stores, reloads, events) is tested in package edge.

// testEdge is one running front end on a loopback port.
type testEdge struct {
	srv    *httpedge.Server
	core   *decision.Core
	lim    *window.Limiter
	blocks *blockcache.Cache
	addr   string
	reg    *prometheus.Registry
	stop   func(*testing.T) // startEdge's: Shutdown, then wait for Serve to return
}

type edgeOpts struct {
	cfg   httpedge.Config
	rules string      // empty: decision.DefaultRules
	store store.Store // nil: the in-memory store
	flush time.Duration
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// startEdge starts a front end with the settings these tests use: 2ms
// flushes, a 50ms store timeout, no Retry-After jitter, a silent logger.
// It is stopped at the test's cleanup.
func startEdge(t *testing.T, o edgeOpts) *testEdge {
	t.Helper()
	e := newEdge(t, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ln) }()
	var once sync.Once
	e.stop = func(t *testing.T) {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			e.srv.Shutdown(ctx)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("httpedge: the server did not stop within 10 s")
			}
		})
	}
	t.Cleanup(func() { e.stop(t) })
	e.addr = ln.Addr().String()
	return e
}

// shutdown stops the server and returns once its Serve has returned.
func (e *testEdge) shutdown(t *testing.T) { e.stop(t) }

// newEdge builds a front end as startEdge does, without listening, for
// driving its Handler directly.
func newEdge(t testing.TB, o edgeOpts) *testEdge {
	t.Helper()
	rs, err := rules.ParseRules([]byte(cmp.Or(o.rules, decision.DefaultRules)))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	backend := o.store
	if backend == nil {
		backend = store.NewMemStore(nil)
	}
	reg := prometheus.NewRegistry()
	lim, err := window.New(window.Config{FlushInterval: cmp.Or(o.flush, 2*time.Millisecond), StoreTimeout: 50 * time.Millisecond, Registerer: reg}, backend)
	if err != nil {
		t.Fatal(err)
	}
	lim.Start()
	t.Cleanup(func() { lim.Close(context.Background()) })
	sl := slots.New(slots.Config{StoreTimeout: 50 * time.Millisecond}, backend)
	sl.Start(0, nil)
	t.Cleanup(sl.Close)
	blocks, err := blockcache.New(blockcache.Config{MaxEntries: 1 << 14}, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(blocks.Close)
	core, err := decision.NewCore(decision.CoreConfig{Upstream: o.cfg.Mode == httpedge.Proxy, RetryJitter: -1}, rs,
		decision.CoreDeps{Limiter: lim, Blocks: blocks, Slots: sl, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpedge.NewServer(o.cfg, core, httpedge.Deps{Logger: discard, Registerer: reg})
	if err != nil {
		t.Fatalf("httpedge.NewServer: %v", err)
	}
	return &testEdge{srv: srv, core: core, lim: lim, blocks: blocks, reg: reg}
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

const threePerMinute = `
rules:
  - name: api
    limit: 3
    window: 1m
`
