package httpedge

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// MaxUpstreams is the most upstreams Config.Upstream may list.
const MaxUpstreams = 64

// ParseUpstreams parses Config.Upstream: one host:port, or several
// separated by commas (spaces around them are ignored), at most
// MaxUpstreams, each once. It reports every bad entry with its value.
func ParseUpstreams(s string) ([]string, error) {
	var out []string
	var errs []error
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		host, port, err := net.SplitHostPort(f)
		switch n, perr := strconv.Atoi(port); {
		case f == "":
			errs = append(errs, errors.New("edge: upstream: empty entry"))
		case err != nil || host == "" || strings.ContainsAny(f, "/?#@ \t"):
			errs = append(errs, fmt.Errorf("edge: upstream %q: must be host:port", f))
		case perr != nil || n < 1 || n > 65535:
			errs = append(errs, fmt.Errorf("edge: upstream %q: port must be 1 to 65535", f))
		case seen[f]:
			errs = append(errs, fmt.Errorf("edge: upstream %q: listed twice", f))
		default:
			seen[f] = true
			out = append(out, f)
		}
	}
	if len(out) > MaxUpstreams {
		errs = append(errs, fmt.Errorf("edge: upstream: %d listed, at most %d", len(out), MaxUpstreams))
	}
	return out, errors.Join(errs...)
}

// upstreamPool is proxy mode's origin: one fasthttp.HostClient per
// configured address, picked round-robin among those passing their health
// checks, with the proxy's metrics. A Server has one in proxy mode only.
// Its methods are safe for concurrent use; the health checks run while
// Server.Serve runs (startChecks).
type upstreamPool struct {
	ups  []*upstream
	next atomic.Uint32 // round-robin position

	retries         int    // retries of a request at most
	idempotencyHdr  string // "" when POST and PATCH are never retried
	healthPath      string // "" when there are no health checks
	healthInterval  time.Duration
	healthTimeout   time.Duration
	healthThreshold int
	log             *slog.Logger

	retried prometheus.Counter
	framing [numFramingReasons]prometheus.Counter

	mu      sync.Mutex
	serving int           // Serve calls running
	stop    chan struct{} // closed to stop the checkers
	wg      sync.WaitGroup
}

// upstream is one origin address.
type upstream struct {
	addr    string
	client  *fasthttp.HostClient // proxied requests: streaming, no retries of its own
	check   *fasthttp.HostClient // health checks: small buffered bodies
	healthy atomic.Bool
	gauge   prometheus.Gauge
	fails   int // consecutive failed checks; the checker's only
}

// dialError marks an error of dialing the upstream: nothing was sent.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dialer returns a fasthttp dial function that bounds each dial by limit
// and marks its errors as dialError.
func dialer(limit time.Duration) fasthttp.DialFuncWithTimeout {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		if timeout <= 0 || timeout > limit {
			timeout = limit
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil, &dialError{err}
		}
		return c, nil
	}
}

// newUpstreamPool builds the upstreams of cfg (defaults set, validated)
// and registers the proxy's metrics with reg (nil: none).
func newUpstreamPool(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (*upstreamPool, error) {
	addrs, err := ParseUpstreams(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	p := &upstreamPool{retries: max(cfg.UpstreamRetries, 0), healthPath: cfg.UpstreamHealthPath,
		healthInterval: cfg.UpstreamHealthInterval, healthTimeout: min(cfg.UpstreamHealthTimeout, cfg.UpstreamHealthInterval),
		healthThreshold: cfg.UpstreamHealthThreshold, log: log}
	if cfg.UpstreamIdempotencyHeader != "-" {
		p.idempotencyHdr = cfg.UpstreamIdempotencyHeader
	}
	healthy := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "upstream_healthy",
		Help: "1 when the upstream is picked for requests (it passes its health checks, or none are configured), 0 while it is skipped, by configured upstream address."},
		[]string{"upstream"})
	retried := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "upstream_retries_total", Help: "Proxied requests sent again, to the next upstream, after a connection error (idempotent requests only)."})
	framing := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "framing_refused_total",
		Help: "Requests refused with 400 in proxy mode before any decision because their framing could smuggle a request, by reason."},
		[]string{"reason"})
	p.retried = retried
	for r := framingReason(1); r < numFramingReasons; r++ {
		p.framing[r] = framing.WithLabelValues(r.String())
	}
	for _, a := range addrs {
		u := &upstream{addr: a, gauge: healthy.WithLabelValues(a)}
		u.client = &fasthttp.HostClient{
			Addr:                          a,
			DialTimeout:                   dialer(cfg.UpstreamDialTimeout),
			MaxConns:                      cfg.UpstreamConns,
			ReadTimeout:                   cfg.UpstreamTimeout,
			WriteTimeout:                  cfg.UpstreamTimeout,
			MaxIdleConnDuration:           cfg.IdleTimeout,
			ReadBufferSize:                cfg.MaxHeaderSize, // the largest response head
			MaxIdemponentCallAttempts:     1,                 // the pool retries, across upstreams
			RetryIfErr:                    func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			StreamResponseBody:            true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			NoDefaultUserAgentHeader:      true,
		}
		if p.healthPath != "" {
			u.check = &fasthttp.HostClient{
				Addr:                      a,
				DialTimeout:               dialer(p.healthTimeout),
				MaxConns:                  1,
				ReadTimeout:               p.healthTimeout,
				WriteTimeout:              p.healthTimeout,
				MaxResponseBodySize:       64 << 10,
				MaxIdemponentCallAttempts: 1,
				RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
				Name:                      "poplimit-health-check",
			}
		}
		u.healthy.Store(true)
		u.gauge.Set(1)
		p.ups = append(p.ups, u)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{healthy, retried, framing} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// turn returns the next request's round-robin position.
func (p *upstreamPool) turn() uint32 { return p.next.Add(1) - 1 }

// pick returns the index of the upstream for an attempt of the request at
// round-robin position k that already tried the upstreams in the bit set
// tried: among the healthy ones it has not tried, else among the healthy
// ones; when none is healthy, among all of them, those not tried first
// (health checks that all fail are as likely wrong as the whole origin
// down, and a dead upstream answers fast with 502). Successive positions
// go to successive members of that set, so healthy upstreams share the
// requests evenly whatever the others do.
func (p *upstreamPool) pick(k uint32, tried uint64) int {
	n := len(p.ups)
	if n == 1 {
		return 0
	}
	var healthy uint64
	for j, u := range p.ups {
		if u.healthy.Load() {
			healthy |= 1 << j
		}
	}
	all := uint64(1)<<n - 1 // all ones for n = 64 too: the shift gives 0
	set := healthy &^ tried
	if set == 0 {
		set = healthy
	}
	if set == 0 {
		set = all &^ tried
	}
	if set == 0 {
		set = all
	}
	// The (k mod |set|)-th member of set.
	for m := k % uint32(bits.OnesCount64(set)); m > 0; m-- {
		set &= set - 1
	}
	return bits.TrailingZeros64(set)
}

// startChecks starts the health checks unless they run already, and
// returns the function that stops them (the last stop of several Serve
// calls stops them, and waits for the checks in flight: at most the
// health timeout). Without a health path it does nothing.
func (p *upstreamPool) startChecks() (stop func()) {
	if p.healthPath == "" {
		return func() {}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.serving++; p.serving == 1 {
		p.stop = make(chan struct{})
		for _, u := range p.ups {
			p.wg.Add(1)
			go p.checkLoop(u, p.stop)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			p.serving--
			last := p.serving == 0
			if last {
				close(p.stop)
			}
			p.mu.Unlock()
			if last {
				p.wg.Wait()
			}
		})
	}
}

// checkLoop checks u at once and then every health interval until stop
// closes.
func (p *upstreamPool) checkLoop(u *upstream, stop <-chan struct{}) {
	defer p.wg.Done()
	t := time.NewTicker(p.healthInterval)
	defer t.Stop()
	for {
		p.checkOnce(u)
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// checkOnce sends one health check to u: a GET of the health path that
// must answer 2xx or 3xx within the health timeout. Threshold failures in
// a row mark u unhealthy; one pass marks it healthy again.
func (p *upstreamPool) checkOnce(u *upstream) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + u.addr + p.healthPath)
	err := u.check.DoTimeout(req, resp, p.healthTimeout)
	code := resp.StatusCode()
	if err == nil && code >= 200 && code < 400 {
		u.fails = 0
		if !u.healthy.Swap(true) {
			u.gauge.Set(1)
			p.log.Info("edge: upstream passes its health check again", "upstream", u.addr)
		}
		return
	}
	if u.fails++; u.fails < p.healthThreshold || !u.healthy.Load() {
		return
	}
	u.healthy.Store(false)
	u.gauge.Set(0)
	reason := "status " + strconv.Itoa(code)
	if err != nil {
		reason = err.Error()
	}
	p.log.Warn("edge: upstream fails its health checks; skipped until it passes", "upstream", u.addr,
		"failures", u.fails, "last", reason)
}
