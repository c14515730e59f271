package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/window"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// BlockCache is what the edge needs of a cache of blocked keys (package
// blockcache): times are Unix nanoseconds.
type BlockCache interface {
	Blocked(key uint64, now int64) (releaseAt int64, ok bool)
	Block(key uint64, releaseAt, now int64) bool
	Clear()
}

// Emitter takes decision events without blocking (package pipeline's
// Producer). Emit copies the event; it counts what it drops itself.
type Emitter interface {
	Emit(e *pipeline.Event) bool
}

// Deps are the parts an edge composes. Limiter and Blocks are required.
type Deps struct {
	Limiter *window.Limiter
	Blocks  BlockCache
	// Slots runs concurrency rules; nil refuses rules files that have any.
	Slots  *window.Slots
	Events Emitter // nil: no decision events
	// StoreHealthy reports whether the shared store is reachable; nil means
	// always. Readiness turns false when it is not and a rule fails closed.
	StoreHealthy func() bool
	Logger       *slog.Logger          // default slog.Default()
	Registerer   prometheus.Registerer // nil: no metrics registered
	// ClockSkew is added to the wall clock, to test what skewed edges do.
	ClockSkew time.Duration
}

// Server is one edge: a fasthttp server that decides every request against
// the current rules. Its methods are safe for concurrent use.
type Server struct {
	cfg    Config
	deps   Deps
	log    *slog.Logger
	lim    *window.Limiter
	blocks BlockCache
	m      *metrics
	addr   clientAddr

	rules atomic.Pointer[snapshot]
	// reloadMu serializes reloads.
	reloadMu sync.Mutex

	srv      *fasthttp.Server
	upstream *fasthttp.HostClient
	shed     shedder
	scratch  sync.Pool // *scratch
	inflight atomic.Int64
}

// snapshot is one generation of rules with the metric handles of each rule,
// swapped in whole by a reload.
type snapshot struct {
	rules    *window.Rules
	counters []ruleCounters // by rule index
	failHard bool           // some rule fails closed
	shedding bool           // load shedding is on (proxy mode and max_in_flight set)
}

// maxHeld bounds the concurrency slots one request can hold.
const maxHeld = 4

// scratch is per-request working space, pooled.
type scratch struct {
	key  []byte
	buf  []byte
	ev   pipeline.Event
	held [maxHeld]heldSlot
	nh   int
	hops Hops
}

type heldSlot struct {
	rule *window.Rule
	key  uint64
}

// New returns an edge with the given rules. It does not listen: call Serve.
func New(cfg Config, rules *window.Rules, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Limiter == nil || deps.Blocks == nil {
		return nil, errors.New("edge: New: Limiter and Blocks are required")
	}
	if rules == nil || len(rules.Rules) == 0 {
		return nil, errors.New("edge: New: no rules")
	}
	cfg.setDefaults()
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, deps: deps, log: deps.Logger, lim: deps.Limiter, blocks: deps.Blocks,
		addr: newClientAddr(cfg.TrustedProxies, cfg.Forwarding, cfg.ClientIPHeader)}
	s.scratch.New = func() any { return &scratch{key: make([]byte, 0, 256), buf: make([]byte, 0, 512)} }
	var err error
	if s.m, err = newMetrics(deps.Registerer, s); err != nil {
		return nil, err
	}
	if err := s.check(rules); err != nil {
		return nil, err
	}
	s.rules.Store(s.newSnapshot(rules))
	if cfg.Mode == Proxy {
		s.upstream = &fasthttp.HostClient{
			Addr:                          cfg.Upstream,
			MaxConns:                      cfg.UpstreamConns,
			ReadTimeout:                   cfg.UpstreamTimeout,
			WriteTimeout:                  cfg.UpstreamTimeout,
			MaxIdleConnDuration:           cfg.IdleTimeout,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			NoDefaultUserAgentHeader:      true,
		}
	}
	s.srv = &fasthttp.Server{
		Handler:                      s.guard,
		Name:                         "poplimit",
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		ReadBufferSize:               cfg.MaxHeaderSize, // a larger request head is answered 431
		MaxRequestBodySize:           cfg.MaxBodySize,
		Concurrency:                  cfg.Concurrency,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                false,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{s.log},
	}
	return s, nil
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}

// check reports what this edge cannot run of rs.
func (s *Server) check(rs *window.Rules) error {
	n := 0
	for _, r := range rs.Rules {
		if r.Kind == window.Concurrency {
			n++
		}
	}
	switch {
	case n > 0 && s.deps.Slots == nil:
		return errors.New("edge: rules have concurrency limits but the edge has no Slots")
	case n > maxHeld:
		return fmt.Errorf("edge: %d concurrency rules, at most %d", n, maxHeld)
	}
	if n > 0 && s.cfg.Mode != Proxy {
		s.log.Warn("edge: concurrency rules apply only in proxy mode, where responses are seen to complete; they are skipped")
	}
	if rs.Shedding.MaxInFlight > 0 && s.cfg.Mode != Proxy {
		s.log.Warn("edge: load shedding applies only in proxy mode, where the upstream is seen; it is off")
	}
	return nil
}

func (s *Server) newSnapshot(rs *window.Rules) *snapshot {
	sn := &snapshot{rules: rs, counters: make([]ruleCounters, len(rs.Rules)),
		shedding: rs.Shedding.MaxInFlight > 0 && s.cfg.Mode == Proxy}
	for i, r := range rs.Rules {
		sn.counters[i] = s.m.forRule(r.Name)
		if r.Fail == window.FailClosed {
			sn.failHard = true
		}
	}
	return sn
}

// Rules returns the rules in force.
func (s *Server) Rules() *window.Rules { return s.rules.Load().rules }

// SetRules swaps in new rules. Cached blocks are dropped, since a changed
// limit or window changes every release time.
func (s *Server) SetRules(rs *window.Rules) error {
	if err := s.check(rs); err != nil {
		return err
	}
	old := s.rules.Swap(s.newSnapshot(rs))
	s.blocks.Clear()
	if old != nil {
		s.m.dropRemoved(old.rules, rs)
	}
	return nil
}

// Serve serves the edge on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(ln)
}

// Shutdown stops accepting, waits for requests in flight within ctx, then
// flushes the limiter's pending increments to the store.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.ShutdownWithContext(ctx)
	if ferr := s.lim.Close(ctx); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return err
}

// Handler returns the edge's request handler, for tests and embedding.
func (s *Server) Handler() fasthttp.RequestHandler { return s.guard }

// guard is the panic guard around handle: a panic answers 500 and is
// counted, never taking the edge down.
func (s *Server) guard(ctx *fasthttp.RequestCtx) {
	defer func() {
		if p := recover(); p != nil {
			s.m.panics.Inc()
			s.log.Error("edge: handler panic", "panic", p)
			ctx.Response.Reset()
			writeProblem(ctx, fasthttp.StatusInternalServerError, "Internal Server Error", "the rate limiter failed on this request")
		}
	}()
	s.handle(ctx)
}

// decidePath is the JSON decision endpoint in decision mode.
const decidePath = "/_poplimit/decide"

func (s *Server) now() time.Time {
	t := time.Now()
	if s.deps.ClockSkew != 0 {
		t = t.Add(s.deps.ClockSkew)
	}
	return t
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	if s.cfg.Mode == Decision {
		if string(path) == decidePath {
			s.handleDecideJSON(ctx)
			return
		}
		path = StripPrefix(path, s.cfg.CheckPrefix)
	}
	sn := s.rules.Load()
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	now := s.now()
	t := now.UnixNano()
	host := HostOnly(ctx.Host())
	method := ctx.Method()
	ip := s.clientIP(ctx, &sc.hops)
	if sn.shedding {
		p := priorityOf(sn.rules, host, method, path)
		if s.shed.load(&sn.rules.Shedding, s.inflight.Load()) >= threshold(p, sn.rules.Shedding.Reserved) {
			s.m.shed[p].Inc()
			ctx.Response.Header.SetCanonical(hRetryAfter, strconv.AppendInt(sc.buf[:0], retryAfter(t+int64(time.Second), t, s.cfg.RetryJitter), 10))
			writeProblem(ctx, fasthttp.StatusServiceUnavailable, "Service Unavailable", "the service is overloaded and sheds this class of request; retry later")
			return
		}
	}
	sc.nh = 0
	defer s.releaseSlots(sc)

	var best quota // the allowing rule with the least remaining
	for _, r := range sn.rules.Rules {
		if r.Kind == window.Shed || !r.Matches(host, method, path) {
			continue
		}
		if r.Kind == window.Concurrency && s.cfg.Mode != Proxy {
			continue
		}
		var ok bool
		sc.key, ok = AppendKey(sc.key[:0], &ctx.Request, r, ip)
		if !ok {
			switch r.MissingKey {
			case window.MissingKeySkip:
				continue
			case window.MissingKeyDeny:
				s.m.missingKey.Inc()
				writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "the request lacks the key that its rate limit needs")
				return
			}
			sc.key = AppendFallbackKey(sc.key[:0], r, ip)
		}
		cost := r.Cost
		if r.CostHeader != "" {
			if v := ctx.Request.Header.Peek(r.CostHeader); len(v) > 0 {
				n, err := fasthttp.ParseUint(v)
				if err != nil || n < 1 || uint64(n) > r.MaxCost {
					s.m.badCost.Inc()
					writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "the request cost header is not a whole number within the rule's bounds")
					return
				}
				cost = uint64(n)
			}
		}
		var q quota
		var refused bool
		if r.Kind == window.Concurrency {
			q, refused = s.acquire(sn, r, sc, now, t)
		} else {
			q, refused = s.decide(sn, r, sc, now, t, cost)
		}
		if refused {
			sc.buf = writeRefusal(ctx, &q, t, s.cfg.RetryJitter, sc.buf)
			return
		}
		if best.rule == nil || q.remaining < best.remaining {
			best = q
		}
		if !sn.rules.MatchAll {
			break
		}
	}
	if s.cfg.Mode == Proxy {
		s.proxy(ctx)
	} else {
		ctx.SetStatusCode(fasthttp.StatusOK)
	}
	if best.rule != nil {
		sc.buf = setQuotaHeaders(&ctx.Response.Header, &best, t, sc.buf)
	}
}

// decide runs one rule for the key in sc.key and reports the quota and
// whether the request is refused (shadow rules never refuse).
func (s *Server) decide(sn *snapshot, r *window.Rule, sc *scratch, now time.Time, t int64, cost uint64) (quota, bool) {
	h := r.Hash(sc.key)
	limit := sn.rules.LimitFor(r, sc.key)
	c := &sn.counters[r.Index]
	ev := &sc.ev
	*ev = pipeline.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: uint32(cost), Limit: uint32(limit),
		WindowMillis: uint32(r.Window / time.Millisecond), Edge: uint16(s.cfg.EdgeID),
		Mode: pipeline.Mode(r.Mode), Action: pipeline.Action(r.Action), Shadow: r.Shadow}
	q := quota{rule: r, limit: limit}
	if rel, blocked := s.blocks.Blocked(h, t); blocked {
		if r.Action == window.Block {
			s.lim.Record(now, r, h, cost) // a blocked client's real rate stays visible
		}
		c.limitedCache.Inc()
		q.resetAt, q.releaseAt = rel, rel
		ev.Decision, ev.FromBlockCache = pipeline.Limited, true
		s.emit(ev)
		return q, true
	}
	d := s.lim.Decide(context.Background(), now, r, h, limit, cost)
	q.remaining, q.resetAt, q.releaseAt = d.Remaining, d.ResetAt, d.ReleaseAt
	ev.Estimate = float32(d.Estimate)
	ev.Fallback = d.Fallback != window.FallbackNone
	switch {
	case d.Allowed:
		if ev.Fallback {
			c.allowedFallback.Inc()
		} else {
			c.allowed.Inc()
		}
		ev.Decision = pipeline.Allowed
	case r.Shadow:
		c.shadowLimited.Inc()
		ev.Decision = pipeline.Limited
	default:
		if ev.Fallback {
			c.limitedFallback.Inc()
		} else {
			c.limited.Inc()
			if d.ReleaseAt > t && !s.blocks.Block(h, d.ReleaseAt, t) {
				s.m.blockDropped.Inc()
			}
		}
		ev.Decision = pipeline.Limited
	}
	s.emit(ev)
	return q, !d.Allowed && !r.Shadow
}

// emit hands ev to the pipeline, which counts what it drops or samples out.
func (s *Server) emit(ev *pipeline.Event) {
	if s.deps.Events != nil {
		s.deps.Events.Emit(ev)
	}
}

// acquire takes a concurrency slot for the key in sc.key under r; the slot
// is given back by releaseSlots when the request is done.
func (s *Server) acquire(sn *snapshot, r *window.Rule, sc *scratch, now time.Time, t int64) (quota, bool) {
	h := r.Hash(sc.key)
	limit := sn.rules.LimitFor(r, sc.key)
	c := &sn.counters[r.Index]
	q := quota{rule: r, limit: limit, resetAt: t + int64(time.Second), releaseAt: t + int64(time.Second)}
	ok, fb := s.deps.Slots.Acquire(context.Background(), now, r, h, limit)
	switch {
	case ok && fb == window.FallbackNone:
		c.allowed.Inc()
	case ok:
		c.allowedFallback.Inc()
	case fb != window.FallbackNone:
		c.limitedFallback.Inc()
	case r.Shadow:
		c.shadowLimited.Inc()
		return q, false
	default:
		c.limited.Inc()
	}
	if ok {
		sc.held[sc.nh] = heldSlot{r, h}
		sc.nh++
		q.remaining = 1 // unknown beyond "not full": say one is left
	}
	return q, !ok
}

func (s *Server) releaseSlots(sc *scratch) {
	for i := 0; i < sc.nh; i++ {
		s.deps.Slots.Release(sc.held[i].rule, sc.held[i].key)
		sc.held[i] = heldSlot{}
	}
	sc.nh = 0
}

// proxy forwards the request to the upstream and leaves its response in
// ctx: 504 when it times out, 502 when it cannot be reached.
func (s *Server) proxy(ctx *fasthttp.RequestCtx) {
	req := &ctx.Request
	req.Header.Del(fasthttp.HeaderConnection)
	s.inflight.Add(1)
	begin := time.Now()
	err := s.upstream.DoTimeout(req, &ctx.Response, s.cfg.UpstreamTimeout)
	s.shed.observe(time.Since(begin))
	s.inflight.Add(-1)
	if err == nil {
		return
	}
	ctx.Response.Reset()
	if errors.Is(err, fasthttp.ErrTimeout) {
		s.m.upstreamTimeout.Inc()
		writeProblem(ctx, fasthttp.StatusGatewayTimeout, "Gateway Timeout", "the upstream did not answer in time")
		return
	}
	s.m.upstreamError.Inc()
	writeProblem(ctx, fasthttp.StatusBadGateway, "Bad Gateway", "the upstream could not be reached")
}

// HostOnly returns host without its port, as rules match it.
func HostOnly(h []byte) []byte {
	if i := bytes.LastIndexByte(h, ':'); i >= 0 && bytes.IndexByte(h[i:], ']') < 0 {
		h = h[:i]
	}
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	return h
}

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

// Ready reports whether the edge should receive traffic: not when a rule
// fails closed and the store is unreachable.
func (s *Server) Ready() bool {
	if s.deps.StoreHealthy == nil {
		return true
	}
	return !s.rules.Load().failHard || s.deps.StoreHealthy()
}

// LoadFiles parses the configured rules and overrides files.
func LoadFiles(rulesFile, overridesFile string) (*window.Rules, error) {
	data := []byte(DefaultRules)
	if rulesFile != "" {
		var err error
		if data, err = os.ReadFile(rulesFile); err != nil {
			return nil, fmt.Errorf("edge: rules: %w", err)
		}
	}
	rs, err := window.ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("edge: %s: %w", nameOr(rulesFile, "built-in rules"), err)
	}
	if overridesFile != "" {
		data, err := os.ReadFile(overridesFile)
		if err != nil {
			return nil, fmt.Errorf("edge: overrides: %w", err)
		}
		if rs.Overrides, err = window.ParseOverrides(data); err != nil {
			return nil, fmt.Errorf("edge: %s: %w", overridesFile, err)
		}
	}
	return rs, nil
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Reload reads the rules and overrides files again and swaps them in. A bad
// file is rejected with every error listed, the running rules stay, and the
// failure is logged and counted.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	rs, err := LoadFiles(s.cfg.RulesFile, s.cfg.OverridesFile)
	if err == nil {
		err = s.SetRules(rs)
	}
	if err != nil {
		s.m.reloads.WithLabelValues("rejected").Inc()
		s.m.reloadOK.Set(0)
		s.log.Error("edge: reload rejected; the running rules stay", "err", err)
		return err
	}
	s.m.reloads.WithLabelValues("applied").Inc()
	s.m.reloadOK.Set(1)
	s.log.Info("edge: rules reloaded", "rules", len(rs.Rules), "file", s.cfg.RulesFile)
	return nil
}

// WatchFiles reloads when the rules or overrides file changes (polled every
// ReloadPoll) or when hup receives, until ctx ends.
func (s *Server) WatchFiles(ctx context.Context, hup <-chan os.Signal) {
	stamp := func() string {
		var b []byte
		for _, f := range []string{s.cfg.RulesFile, s.cfg.OverridesFile} {
			if f == "" {
				continue
			}
			if st, err := os.Stat(f); err == nil {
				b = fmt.Appendf(b, "%s:%d:%d;", f, st.ModTime().UnixNano(), st.Size())
			}
		}
		return string(b)
	}
	last := stamp()
	t := time.NewTicker(s.cfg.ReloadPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last = stamp()
			s.Reload()
		case <-t.C:
			if cur := stamp(); cur != last {
				last = cur
				s.Reload()
			}
		}
	}
}
