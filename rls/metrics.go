package rls

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// rlsMetrics are the service's, namespace poplimit, subsystem rls.
type rlsMetrics struct {
	respOK, respOver                              prometheus.Counter
	descOK, descOver, descNone, descUnlimited     prometheus.Counter
	descReplaced                                  prometheus.Counter
	errEmptyDomain, errNoDescriptors, errNoConfig prometheus.Counter
	errTooMany, errBadOverride, errPanic          prometheus.Counter
	unknownDomain, globalShadow                   prometheus.Counter
	uncountedHits, uncountedZero                  prometheus.Counter
	duration                                      prometheus.Histogram
	http                                          *prometheus.CounterVec // path, code
	tlsReloads                                    *prometheus.CounterVec // result: applied, rejected
}

// httpAnswer counts an answer of HTTPHandler (path and code are bounded:
// two paths, five codes).
func (m *rlsMetrics) httpAnswer(path string, code int) {
	m.http.WithLabelValues(path, strconv.Itoa(code)).Inc()
}

func newRLSMetrics(reg prometheus.Registerer) (*rlsMetrics, error) {
	const ns, sub = "poplimit", "rls"
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "ShouldRateLimit answers, by overall code (ok, over_limit)."}, []string{"code"})
	descs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "descriptors_total",
		Help: "Descriptor statuses, by result (ok, over_limit: under a limit, over_limit including uncounted_total's; " +
			"no_limit, unlimited, replaced: not counted)."}, []string{"result"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "errors_total",
		Help: "ShouldRateLimit calls answered with a gRPC error, by reason."}, []string{"reason"})
	uncounted := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "uncounted_total",
		Help: "Descriptors answered over their limit without counting anything, by reason (hits_above_limit: one call's hits " +
			"above what the limit admits in a window, or above a bucket's capacity; zero_limit: a limit of 0, which refuses every hit)."},
		[]string{"reason"})
	m := &rlsMetrics{
		http: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "http_requests_total",
			Help: "Answers of envoyproxy/ratelimit's HTTP port, by path (json, healthcheck) and status code."}, []string{"path", "code"}),
		respOK: reqs.WithLabelValues("ok"), respOver: reqs.WithLabelValues("over_limit"),
		descOK: descs.WithLabelValues("ok"), descOver: descs.WithLabelValues("over_limit"),
		descNone: descs.WithLabelValues("no_limit"), descUnlimited: descs.WithLabelValues("unlimited"),
		descReplaced:   descs.WithLabelValues("replaced"),
		errEmptyDomain: errs.WithLabelValues("empty_domain"), errNoDescriptors: errs.WithLabelValues("no_descriptors"),
		errNoConfig: errs.WithLabelValues("no_config"), errTooMany: errs.WithLabelValues("too_many_descriptors"),
		errBadOverride: errs.WithLabelValues("bad_override"), errPanic: errs.WithLabelValues("panic"),
		uncountedHits: uncounted.WithLabelValues("hits_above_limit"), uncountedZero: uncounted.WithLabelValues("zero_limit"),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "unknown_domain_total",
			Help: "Requests to a domain no file names, answered OK (ratelimit's domain_not_found)."}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "global_shadow_mode_total",
			Help: "OVER_LIMIT answers turned OK by the global shadow mode."}),
		tlsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tls_reloads_total",
			Help: "Reloads of the service's TLS certificate (Config.TLSCert), by result (applied, rejected)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help:    "Time to decide a ShouldRateLimit call, from its arrival in the handler to its answer, in seconds.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}}),
	}
	m.tlsReloads.WithLabelValues("applied")
	m.tlsReloads.WithLabelValues("rejected")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{reqs, descs, errs, uncounted, m.unknownDomain, m.globalShadow, m.duration, m.http, m.tlsReloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: metrics: %w", err)
		}
	}
	return m, nil
}
