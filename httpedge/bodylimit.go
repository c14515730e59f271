package httpedge

import (
	"errors"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// readMetrics count the requests answered before any decision because
// the HTTP reader refused them.
type readMetrics struct {
	bodyTooLarge, headTooLarge, timeout, malformed prometheus.Counter
}

func newReadMetrics(reg prometheus.Registerer) (*readMetrics, error) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "unreadable_requests_total",
		Help: "Requests answered before any decision because the HTTP reader refused them, by reason " +
			"(body_too_large: 413, over MaxDecisionBody in decision mode; head_too_large: 431; read_timeout: 408; malformed: 400)."},
		[]string{"reason"})
	m := &readMetrics{bodyTooLarge: v.WithLabelValues("body_too_large"), headTooLarge: v.WithLabelValues("head_too_large"),
		timeout: v.WithLabelValues("read_timeout"), malformed: v.WithLabelValues("malformed")}
	if reg != nil {
		if err := reg.Register(v); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// maxRequestBody is the fasthttp server's MaxRequestBodySize. Decision
// mode reads bodies whole, so the bound is MaxDecisionBody: fasthttp
// refuses a larger Content-Length or chunk size before allocating for it
// (ErrBodyTooLarge, answered by readRefusal). Proxy mode streams
// (StreamRequestBody), where the bound only sizes the prefix read before
// the handler; 0 keeps fasthttp's default there.
func (c *Config) maxRequestBody() int {
	if c.Mode == Proxy {
		return 0
	}
	return c.MaxDecisionBody
}

// readRefusal is the fasthttp server's ErrorHandler: it answers a request
// the reader refused, and counts it. A decision-mode body over
// MaxDecisionBody is answered 413 in RFC 9457 problem+json; the rest as
// fasthttp answers them, in text/plain (431 for a head over
// MaxHeaderSize, 408 for a read timeout, 400 otherwise). fasthttp closes
// the connection after this answer.
func (s *Server) readRefusal(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		s.bodyTooLarge(ctx)
	case errors.As(err, &small):
		s.rm.headTooLarge.Inc()
		ctx.Error("Too big request header", fasthttp.StatusRequestHeaderFieldsTooLarge)
	case errors.As(err, &ne) && ne.Timeout():
		s.rm.timeout.Inc()
		ctx.Error("Request timeout", fasthttp.StatusRequestTimeout)
	default:
		s.rm.malformed.Inc()
		ctx.Error("Error when parsing request", fasthttp.StatusBadRequest)
	}
}

// bodyTooLarge answers 413 for a decision-mode request whose body is over
// MaxDecisionBody, and counts it.
func (s *Server) bodyTooLarge(ctx *fasthttp.RequestCtx) {
	s.rm.bodyTooLarge.Inc()
	writeProblem(ctx, fasthttp.StatusRequestEntityTooLarge, "the request body is larger than "+strconv.Itoa(s.cfg.MaxDecisionBody)+" bytes, the most a decision reads")
}
