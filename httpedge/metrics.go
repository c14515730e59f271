package httpedge

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace, subsystem = "poplimit", "edge"

// serverMetrics are the fasthttp front end's.
type serverMetrics struct {
	panics          prometheus.Counter
	upstreamTimeout prometheus.Counter
	upstreamError   prometheus.Counter
	tlsReloads      *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer, s *Server) (*serverMetrics, error) {
	upstream := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "upstream_errors_total", Help: "Proxied requests the upstream failed, by kind (timeout: 504, error: 502)."}, []string{"kind"})
	m := &serverMetrics{
		panics: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "panics_total", Help: "Requests whose handling panicked and were answered 500."}),
		upstreamTimeout: upstream.WithLabelValues("timeout"),
		upstreamError:   upstream.WithLabelValues("error"),
		tlsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "tls_reloads_total", Help: "Reloads of the traffic listener's TLS certificate, by result (applied, rejected)."}, []string{"result"}),
	}
	m.tlsReloads.WithLabelValues("applied")
	m.tlsReloads.WithLabelValues("rejected")
	if reg == nil {
		return m, nil
	}
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "ready", Help: "1 when the edge is ready for traffic."}, func() float64 {
		if s.Ready() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{m.panics, upstream, m.tlsReloads, ready} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// AdminHandler serves /metrics from gatherer, /healthz (the process is up)
// and /readyz (Ready) for the admin listener.
func (s *Server) AdminHandler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "not ready: the store is unreachable and a rule fails closed", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}
