package faults

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/rules"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
)

// full reports whether the full versions run (POPLIMIT_FULL=1).
func full() bool { return os.Getenv("POPLIMIT_FULL") == "1" }

// pick returns short in the normal suite and long in the full version.
func pick[T any](short, long T) T {
	if full() {
		return long
	}
	return short
}

// loopback is whose X-Forwarded-For the edges believe: the replayer's.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// edgeSpec describes an in-process edge. The zero value of each field is
// cmd/edge's default.
type edgeSpec struct {
	id      int
	rules   string
	servers []shardproxy.Server // empty: an in-memory store of its own
	// Store settings, as cmd/edge sets them (flags) or shardproxy defaults.
	storeTimeout time.Duration // default 100ms
	flush        time.Duration // default 5ms
	retryTimeout time.Duration // default 5s (shardproxy's, not a flag)
	maxKeys      int
	skew         time.Duration
	cfg          httpedge.Config // TrustedProxies default loopback, RetryJitter 1ns
	events       decision.Emitter
	reg          *prometheus.Registry // default a new one
	// pop, brokers and kafkaDial make the edge one of a PoP that reads
	// the other PoPs' counts (edge.Options.Pop, Brokers, KafkaDial).
	pop       string
	brokers   []string
	kafkaDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// inEdge is an edge built in-process by the one test harness (edgetest),
// as cmd/edge builds it.
type inEdge struct {
	*edge.Edge
	srv    *httpedge.Server
	lim    *window.Limiter
	mc     *shardproxy.Client // nil with an in-memory store
	blocks *blockcache.Cache
	reg    edge.Registry
	rules  *rules.Rules
}

// newEdge builds an edge as cmd/edge does, without listening; it is stopped
// at cleanup (stop is idempotent).
func newEdge(t testing.TB, s edgeSpec) *inEdge {
	t.Helper()
	o := edge.Options{Server: s.cfg, Events: s.events, ClockSkew: s.skew, Logger: discardLogger}
	if s.reg != nil {
		o.Registry = s.reg
	}
	o.EdgeID = s.id
	o.Pop, o.Brokers, o.KafkaDial = s.pop, s.brokers, s.kafkaDial
	if o.Server.TrustedProxies == nil {
		o.Server.TrustedProxies = loopback
	}
	o.Limiter.FlushInterval, o.Limiter.StoreTimeout, o.Limiter.MaxKeys = s.flush, s.storeTimeout, s.maxKeys
	o.Memcache.Servers, o.Memcache.RetryTimeout = s.servers, s.retryTimeout
	o.BlockCache.MaxEntries = 1 << 16
	e := edgetest.New(t, s.rules, o)
	return &inEdge{Edge: e, srv: e.Server, lim: e.Limiter, mc: e.Memcache(), blocks: e.Blocks, reg: e.Registry, rules: e.Rules()}
}

// stop shuts the edge down as SIGTERM does: it stops serving, flushes its
// pending increments, and closes the store client and the block cache.
func (e *inEdge) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.Close(ctx)
}

// front is a listener whose requests go to whichever edge is current, so an
// edge can be replaced under load without closing the clients' connections,
// as a rolling restart behind a load balancer looks to its clients.
//
// It also times the edge's handler, the service time of each request on
// the server, which a client on this shared machine cannot see apart from
// its own scheduling delays.
type front struct {
	addr string
	cur  atomic.Pointer[inEdge]
	srv  *fasthttp.Server
	// gate is held for reading by each request for as long as it is in
	// an edge's handler, and for writing by swap: the previous edge stops
	// only once the requests it was serving have returned, as an edge's
	// own listener drains before it closes the store and the block cache.
	gate sync.RWMutex

	mu      sync.Mutex
	handled []handled
}

// handled is one request as the front saw it.
type handled struct {
	path  string
	start time.Time
	took  time.Duration
}

// serve starts a front for e on a free loopback port, stopped at cleanup.
func serve(t testing.TB, e *inEdge) *front {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{addr: ln.Addr().String()}
	f.cur.Store(e)
	f.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			start := time.Now()
			f.gate.RLock()
			f.cur.Load().srv.Handler()(ctx)
			f.gate.RUnlock()
			h := handled{path: string(ctx.Path()), start: start, took: time.Since(start)}
			f.mu.Lock()
			f.handled = append(f.handled, h)
			f.mu.Unlock()
		},
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           60 * time.Second,
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
	}
	go f.srv.Serve(ln)
	t.Cleanup(func() {
		f.srv.Shutdown()
		f.cur.Load().stop()
	})
	return f
}

// served returns the requests handled so far.
func (f *front) served() []handled {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.handled)
}

// swap makes next the current edge and stops the previous one (its last
// flush included), as an edge restarted with a new configuration.
func (f *front) swap(next *inEdge) {
	f.gate.Lock()
	prev := f.cur.Swap(next)
	f.gate.Unlock()
	prev.stop()
}

var discardLogger = newDiscardLogger()

// shardsNamed returns servers for addrs named shard-0, shard-1, …: two edges
// that reach the same shards through different addresses (relays) build the
// same ring from the names.
func shardsNamed(addrs ...string) []shardproxy.Server {
	out := make([]shardproxy.Server, len(addrs))
	for i, a := range addrs {
		out[i] = shardproxy.Server{Addr: a, Name: fmt.Sprintf("shard-%d", i)}
	}
	return out
}

// placement places keys on servers as every edge does (ketama, fnv1a_64,
// hash tag "{}").
type placement struct{ ring *shardproxy.Ring }

func placementOf(t testing.TB, servers []shardproxy.Server) placement {
	t.Helper()
	ring, err := shardproxy.NewRing(servers, shardproxy.HashFNV1a64, "{}")
	if err != nil {
		t.Fatal(err)
	}
	return placement{ring}
}

// home returns the index of the shard that holds key's counters.
func (p placement) home(key uint64) int {
	var b [shardproxy.MaxCounterKeyLen]byte
	return p.ring.Lookup(shardproxy.AppendCounterKey(b[:0], key, 0))
}

// homeShard returns the index of the shard that holds key's counters.
func homeShard(t testing.TB, servers []shardproxy.Server, key uint64) int {
	t.Helper()
	return placementOf(t, servers).home(key)
}

func newDiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
