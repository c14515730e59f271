package xds

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// maxVersionLabel bounds the version shown in poplimit_xds_config_info:
// a management server chooses it.
const maxVersionLabel = 64

type metrics struct {
	accepted, rejected prometheus.Counter
	connected          prometheus.Gauge
	streamErrors       prometheus.Counter
	appliedAt          prometheus.Gauge
	info               *prometheus.GaugeVec // one series: the version in force
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "poplimit", "xds"
	configs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "configs_total", Help: "Rate limit configurations received from the xDS management server, by result: accepted (ACKed and in force), rejected (NACKed, the running one stays)."}, []string{"result"})
	m := &metrics{
		accepted: configs.WithLabelValues("accepted"),
		rejected: configs.WithLabelValues("rejected"),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "connected", Help: "1 while a stream to the xDS management server is open."}),
		streamErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "stream_errors_total", Help: "Streams to the xDS management server that failed or ended, each followed by a backoff and a new one; the configuration in force stays."}),
		appliedAt: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "config_applied_timestamp_seconds", Help: "When the configuration in force was applied (Unix seconds); 0 before the first."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "config_info", Help: "1, labelled with the version_info of the configuration in force (cut to 64 bytes); no series before the first."}, []string{"version"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{configs, m.connected, m.streamErrors, m.appliedAt, m.info} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// setVersion makes v the one version labelled.
func (m *metrics) setVersion(v string) {
	if len(v) > maxVersionLabel {
		v = v[:maxVersionLabel]
	}
	v = strings.ToValidUTF8(v, "?")
	m.info.Reset()
	m.info.WithLabelValues(v).Set(1)
}
