package httpedge

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/internal/certfile"
	"github.com/poplimit/poplimit/rules"
)

// Deps are the parts a Server uses besides its Core.
type Deps struct {
	Logger     *slog.Logger          // default slog.Default()
	Registerer prometheus.Registerer // nil: no metrics registered
}

// Server is the fasthttp front end of an edge: it turns each request into
// a Request for its Core and the Decision into an answer (decision mode)
// or a proxied request (proxy mode). Its methods are safe for concurrent
// use.
type Server struct {
	cfg  Config
	core *decision.Core
	deps Deps
	log  *slog.Logger
	m    *serverMetrics
	addr *clientaddr.Resolver

	srv      *fasthttp.Server
	rm       *readMetrics // requests the HTTP reader refused (bodylimit.go)
	conns    *connLimiter // connections per client (connlimit.go)
	upstream *upstreamPool
	certs    *certfile.Pair // nil without TLS

}

// NewServer returns the fasthttp front end of core. It does not listen:
// call Serve.
func NewServer(cfg Config, core *decision.Core, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if core == nil {
		return nil, errors.New("edge: NewServer: no Core")
	}
	cfg.setDefaults()
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, core: core, deps: deps, log: deps.Logger,
		addr: clientaddr.New(cfg.TrustedProxies, cfg.Forwarding, cfg.ClientIPHeader)}
	var err error
	if s.m, err = newServerMetrics(deps.Registerer, s); err != nil {
		return nil, err
	}
	if s.rm, err = newReadMetrics(deps.Registerer); err != nil {
		return nil, err
	}
	if s.conns, err = newConnLimiter(cfg.MaxConnsPerClient, cfg.maxConns(), s.addr.Trusted, s.log, deps.Registerer); err != nil {
		return nil, err
	}
	s.warn(core.Rules())
	if cfg.TLSCert != "" {
		// Reloads are logged and counted by the pair (certfile), and
		// watched by the edge (edge.Serve).
		if s.certs, err = certfile.Load(cfg.TLSCert, cfg.TLSKey, certfile.Options{Logger: s.log, Prefix: "edge", Reloads: s.m.tlsReloads}); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	if cfg.Mode == Proxy {
		if s.upstream, err = newUpstreamPool(&cfg, deps.Registerer, s.log); err != nil {
			return nil, err
		}
	}
	s.srv = &fasthttp.Server{
		Handler:                      s.guard,
		Name:                         "poplimit",
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		ReadBufferSize:               cfg.MaxHeaderSize,    // a larger request head is answered 431
		MaxRequestBodySize:           cfg.maxRequestBody(), // decision mode: MaxDecisionBody, refused before buffering
		ErrorHandler:                 s.readRefusal,        // counted; a body over MaxDecisionBody: 413 problem+json
		Concurrency:                  cfg.Concurrency,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                false,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		ConnState:                    s.conns.connState, // idle connections listed, closed first under pressure (connlimit.go)
		StreamRequestBody:            cfg.Mode == Proxy, // bodies stream to the upstream (proxy.go)
		Logger:                       fasthttpLogger{s.log},
	}
	return s, nil
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}

// warn logs what of rs this front end will not apply.
func (s *Server) warn(rs *rules.Rules) {
	if s.cfg.Mode == Proxy {
		return
	}
	for _, r := range rs.Rules {
		if r.Kind == rules.Concurrency {
			s.log.Warn("edge: concurrency rules apply only in proxy mode, where responses are seen to complete; they are skipped", "rule", r.Name)
		}
	}
	if rs.Shedding.MaxInFlight > 0 {
		s.log.Warn("edge: load shedding applies only in proxy mode, where the upstream is seen; it is off")
	}
}

// Core returns the server's decision core.
func (s *Server) Core() *decision.Core { return s.core }

// Rules returns the rules in force.
func (s *Server) Rules() *rules.Rules { return s.core.Rules() }

// TLSPair is the traffic listener's certificate and key, which the edge
// watches; nil without TLS.
func (s *Server) TLSPair() *certfile.Pair { return s.certs }

// CheckRules logs what of rs this front end will not apply; a front end's
// owner calls it when rules are swapped in (see Core.SetRules).
func (s *Server) CheckRules(rs *rules.Rules) { s.warn(rs) }

// Serve serves the edge on ln until Shutdown, over TLS when configured,
// with the connections capped, each client's (Config.MaxConnsPerClient)
// and all of them (Config.MaxConns), the idle ones closed first under
// pressure; an accept that fails for want of a file descriptor is retried after a
// pause (connlimit.go).
func (s *Server) Serve(ln net.Listener) error {
	ln = s.conns.wrap(ln, s.certs == nil) // below TLS: a refused connection costs no handshake
	if s.certs != nil {
		ln = tls.NewListener(ln, s.certs.ServerConfig(nil))
	}
	if s.upstream != nil {
		stop := s.upstream.startChecks() // the health checks run while Serve does
		defer stop()
	}
	return s.srv.Serve(ln)
}

// Shutdown stops accepting and waits for requests in flight within ctx.
// The parts behind the core are closed by whoever built them (Edge.Close).
func (s *Server) Shutdown(ctx context.Context) error {
	return s.srv.ShutdownWithContext(ctx)
}

// Handler returns the edge's request handler, for tests and embedding.
func (s *Server) Handler() fasthttp.RequestHandler { return s.guard }

// guard is the panic guard around handle: a panic answers 500 and is
// counted, never taking the edge down.
func (s *Server) guard(ctx *fasthttp.RequestCtx) {
	defer s.recover(ctx)
	s.handle(ctx)
}

// recover answers 500 for a panic of the request's handling and counts it.
func (s *Server) recover(ctx *fasthttp.RequestCtx) {
	if p := recover(); p != nil {
		s.m.panics.Inc()
		s.log.Error("edge: handler panic", "panic", p)
		ctx.Response.Reset()
		writeProblem(ctx, fasthttp.StatusInternalServerError, "the rate limiter failed on this request")
	}
}

// decidePath is the JSON decision endpoint in decision mode.
const decidePath = "/_poplimit/decide"

// now is the time by the core's clock, the one every front end reads.
func (s *Server) now() time.Time { return s.core.Now() }

func (s *Server) handle(ctx *fasthttp.RequestCtx) { s.serve(ctx, nil) }

// Wrap returns next behind the edge's decision: a refused request is
// answered by the edge (429, 400, 503), an admitted one by next, with the
// quota headers added to its response; concurrency slots are held while
// next runs. It is the fasthttp middleware for programs that embed an
// edge (Build, then Wrap instead of Serve), with the panic guard.
func (s *Server) Wrap(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		defer s.recover(ctx)
		s.serve(ctx, next)
	}
}

// serve decides ctx's request and answers it: by next when not nil, else
// as the mode says (forward to the upstream, or 200).
func (s *Server) serve(ctx *fasthttp.RequestCtx, next fasthttp.RequestHandler) {
	if s.cfg.Mode == Proxy && next == nil && !s.checkFraming(ctx) {
		return // framing that could smuggle a request: 400 before any decision (proxy_framing.go)
	}
	checking := s.cfg.Mode == Decision && next == nil
	if s.refusesPath(ctx, checking) {
		return // a path origins read differently: 400 before any decision (paths.go)
	}
	path := ctx.Path()
	if checking {
		if string(path) == settlePath {
			s.handleSettle(ctx) // settle.go
			return
		}
		if string(path) == decidePath && s.cfg.DecideToken != "" {
			if !s.authorized(ctx) {
				ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="poplimit decide"`)
				writeProblem(ctx, fasthttp.StatusUnauthorized, "the decision endpoint needs its bearer token")
				return
			}
			s.handleDecideJSON(ctx)
			return
		}
		path = StripPrefix(path, s.cfg.CheckPrefix)
	}
	addr, trusted := peerAddr(ctx), false
	if s.addr.Trusted(addr) {
		var hops clientaddr.Hops // on the stack, cleared only for a proxy's request
		addr, trusted = s.fromProxies(ctx, addr, &hops), true
	}
	req := decision.Request{Host: decision.HostOnly(ctx.Host()), Method: ctx.Method(), Path: path,
		Addr: addr, Fields: fastFields{&ctx.Request}, Now: s.now(),
		Tracked: s.cfg.Mode == Proxy || next != nil}
	if trusted && s.cfg.Mode == Decision && s.cfg.ForwardedMethodHeader != "" {
		// A proxy that asks with GET whatever the request (Caddy's
		// forward_auth) says the real method in a header.
		if m := ctx.Request.Header.Peek(s.cfg.ForwardedMethodHeader); len(m) > 0 {
			if !isMethod(m) {
				writeProblem(ctx, fasthttp.StatusBadRequest, "the forwarded method is not an HTTP method")
				return
			}
			req.Method = m
		}
	}
	if checking {
		req.Fields = checkFields{fastFields{&ctx.Request}} // Envoy marks a body it cut (bodykeys.go)
	}
	if s.core.WantsBody(req.Host, req.Method, req.Path) && !s.holdBody(ctx) {
		return // the body ended early: 400 (bodykeys.go)
	}
	d := s.core.Decide(&req)
	defer s.core.Finish(d)
	if d.Outcome != decision.Allowed {
		writeRefusal(ctx, d) // status, fields and body as the core renders them
		return
	}
	switch {
	case next != nil:
		next(ctx)
		if d.Counting() {
			s.core.Settle(d, ctx.Response.StatusCode(), responseFields{&ctx.Response.Header})
		}
	case s.cfg.Mode == Proxy:
		if s.proxy(ctx) && d.Counting() {
			// The upstream's own answer settles what counting rules
			// reserved; an edge's 502 or 504 leaves them kept (Finish).
			s.core.Settle(d, ctx.Response.StatusCode(), responseFields{&ctx.Response.Header})
		}
	default:
		ctx.SetStatusCode(fasthttp.StatusOK)
		if d.Counting() {
			s.hold(ctx, d) // settle.go
		}
	}
	d.SetFields(&ctx.Response.Header)
}

// proxy forwards the request to an upstream and leaves its response in
// ctx (see forward, in proxy.go); it reports whether the response is the
// upstream's.
func (s *Server) proxy(ctx *fasthttp.RequestCtx) bool { return s.forward(ctx) }

// StripPrefix removes prefix from path when path is prefix or prefix/…, as
// the edge does with its check prefix in decision mode.
func StripPrefix(path []byte, prefix string) []byte {
	if len(prefix) == 0 || !bytes.HasPrefix(path, []byte(prefix)) {
		return path
	}
	rest := path[len(prefix):]
	if len(rest) == 0 {
		return []byte("/")
	}
	if rest[0] != '/' {
		return path
	}
	return rest
}

// authorized reports whether the request carries the decision endpoint's
// bearer token, compared in constant time.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	tok, ok := bytes.CutPrefix(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), []byte("Bearer "))
	return ok && subtle.ConstantTimeCompare(tok, []byte(s.cfg.DecideToken)) == 1
}

// isMethod reports whether m is an HTTP method token of at most 32 bytes.
func isMethod(m []byte) bool {
	if len(m) > 32 {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
