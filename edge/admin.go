package edge

import (
	"net/http"

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
