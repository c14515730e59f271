package edge

import (
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Ready reports whether the edge should receive traffic: not while a rule
// in force fails closed and the shared store says it cannot answer.
func (e *Edge) Ready() bool {
	return e.Core == nil || !e.Core.FailsClosed() || e.store.Healthy()
}

// registerReady registers poplimit_edge_ready on reg.
func (e *Edge) registerReady(reg prometheus.Registerer) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "ready", Help: "1 when the edge is ready for traffic."}, func() float64 {
		if e.Ready() {
			return 1
		}
		return 0
	}))
}

// adminHandler serves the admin listener: /metrics from the edge's
// registry, /healthz (the process is up) and /readyz (Ready).
func (e *Edge) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(e.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !e.Ready() {
			http.Error(w, "not ready: the store is unreachable and a rule fails closed", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// adminIdleTimeout is how long an admin connection may wait for its next
// request: a scraper comes back every few seconds, and an idle
// connection holds one of AdminMaxConns.
const adminIdleTimeout = 30 * time.Second

func newAdminMetrics(reg prometheus.Registerer) (prometheus.Counter, error) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
		Name: "admin_conns_refused_total",
		Help: "Admin listener connections closed when accepted because AdminMaxConns were open."})
	return c, reg.Register(c)
}

// capListener returns ln holding at most max connections open: one
// beyond is closed when accepted, counted by refused. The admin listener
// has its own descriptors this way: the traffic listener's cap leaves
// them out, and its own clients cannot take more.
func capListener(ln net.Listener, max int, refused prometheus.Counter) net.Listener {
	return &cappedListener{Listener: ln, max: int64(max), refused: refused}
}

type cappedListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			if l.refused != nil {
				l.refused.Inc()
			}
			c.Close()
			continue
		}
		return &cappedConn{Conn: c, l: l}, nil
	}
}

type cappedConn struct {
	net.Conn
	l      *cappedListener
	closed atomic.Bool
}

func (c *cappedConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.l.open.Add(-1)
	return c.Conn.Close()
}
