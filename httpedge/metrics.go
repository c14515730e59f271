package httpedge

import (
	"github.com/prometheus/client_golang/prometheus"
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
	for _, c := range []prometheus.Collector{m.panics, upstream, m.tlsReloads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
