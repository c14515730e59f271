package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"time"
	"unsafe"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec RLS wraps
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
	"github.com/poplimit/poplimit/window"
)

// The values of Config.Headers.
const (
	HeadersDraft     = "draft"     // RateLimit-Policy, RateLimit, Retry-After (draft-ietf-httpapi-ratelimit-headers)
	HeadersRatelimit = "ratelimit" // envoyproxy/ratelimit's RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset
	HeadersNone      = "none"
)

// Config configures a Service. The zero value of each field means the
// default written beside it; validate reports every bad field.
type Config struct {
	// Headers says what response_headers_to_add carries, for the
	// descriptor envoyproxy/ratelimit would choose (the last one over its
	// limit, else the one with the least remaining):
	//   - "draft" (default): RateLimit-Policy ("name";q=100;w=60) and
	//     RateLimit ("name";r=5;t=30) of draft-ietf-httpapi-ratelimit-headers
	//     (-09 to -11 agree on these parameters), and Retry-After (seconds,
	//     never before the release nor the RateLimit t) when the answer is
	//     OVER_LIMIT;
	//   - "ratelimit": RateLimit-Limit, RateLimit-Remaining and
	//     RateLimit-Reset, as ratelimit writes them with
	//     LIMIT_RESPONSE_HEADERS_ENABLED;
	//   - "none": nothing, ratelimit's default.
	Headers string
	// ShadowMode answers OK whatever the descriptors say (ratelimit's
	// SHADOW_MODE); the statuses keep their codes. Default false.
	ShadowMode bool
	// QuotaMode puts every descriptor in quota mode (ratelimit's
	// QUOTA_MODE): the answer is OVER_LIMIT only when all of them are.
	// Default false.
	QuotaMode bool
	// RetryJitter is the most random seconds added to Retry-After, so that
	// refused clients do not all return at once. Default 0: none.
	RetryJitter time.Duration
	// MaxDescriptors bounds the descriptors of one request, and so the
	// working memory pooled per request; a request with more is refused
	// with an error (ratelimit has no bound). Default 256, at most 65536.
	MaxDescriptors int
	// Reflection registers the gRPC server reflection service (grpcurl
	// and the like). Default false.
	Reflection bool
	// Ready reports whether the edge should receive traffic (Server.Ready);
	// the standard health service (grpc.health.v1) says SERVING while it
	// does and the rules in force came from envoyproxy/ratelimit files.
	// Default: always ready.
	Ready func() bool
	// HealthInterval is how often Ready is asked. Default 1s, at most 1m.
	HealthInterval time.Duration
	// Now is the service's clock. Default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Headers == "" {
		c.Headers = HeadersDraft
	}
	if c.MaxDescriptors == 0 {
		c.MaxDescriptors = 256
	}
	if c.Ready == nil {
		c.Ready = func() bool { return true }
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c Config) validate() error {
	var errs []error
	switch c.Headers {
	case "", HeadersDraft, HeadersRatelimit, HeadersNone:
	default:
		errs = append(errs, fmt.Errorf("rls: Config.Headers %q: must be draft, ratelimit or none", c.Headers))
	}
	if c.RetryJitter < 0 || c.RetryJitter > time.Hour {
		errs = append(errs, fmt.Errorf("rls: Config.RetryJitter %v: must be between 0 and 1h", c.RetryJitter))
	}
	if c.MaxDescriptors < 0 || c.MaxDescriptors > 1<<16 {
		errs = append(errs, fmt.Errorf("rls: Config.MaxDescriptors %d: must be between 0 (default 256) and 65536", c.MaxDescriptors))
	}
	if c.HealthInterval < 0 || c.HealthInterval > time.Minute {
		errs = append(errs, fmt.Errorf("rls: Config.HealthInterval %v: must be between 0 (default 1s) and 1m", c.HealthInterval))
	}
	return errors.Join(errs...)
}

// The errors of requests refused before any lookup, with
// envoyproxy/ratelimit's texts (gRPC status UNKNOWN, as ratelimit's).
var (
	errRLSEmptyDomain   = errors.New("rate limit domain must not be empty")
	errRLSNoDescriptors = errors.New("rate limit descriptor list must not be empty")
	errRLSNoConfig      = errors.New("no rate limit configuration loaded")
	errRLSTooMany       = errors.New("too many rate limit descriptors")
	errRLSPanic         = errors.New("internal error")
)

// Service is Envoy's rate limit service (envoy.service.ratelimit.v3.
// RateLimitService/ShouldRateLimit) over the decision core, answering as
// envoyproxy/ratelimit answers (rules/envoyconf/SERVICE.md) from the
// descriptor index of the rules in force (envoyconf.DescriptorsOf), so
// that it replaces ratelimit with ratelimit's own files. It serves the
// standard health service beside it, and the reflection service when
// configured. Its methods are safe for concurrent use.
//
// Each descriptor is decided by the core under its rule
// (decision.Core.DecideKey, with the descriptor's own limit when it
// overrides the rule's), the counter key being ratelimit's
// (domain_k1_v1_k2_v2_), except one whose hits exceed what its limit
// admits in one call (admitsAtMost): it is answered OVER_LIMIT and counts
// nothing, so that no single call can refuse the other callers of a
// shared descriptor. A request reads one rules generation and decides
// every descriptor under it, so a reload never splits a request. A
// response and everything it points to come from a pool and return to it
// once the gRPC server has marshaled them: ShouldRateLimit allocates
// nothing of its own.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer

	cfg    Config
	core   *decision.Core
	log    *slog.Logger
	m      *rlsMetrics
	srv    *grpc.Server
	health *health.Server
	pool   sync.Pool // *rlsScratch

	mu      sync.Mutex // guards started and stopped
	started bool
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup // the health watcher
}

// New returns the rate limit service over core. It does not listen:
// call Serve. log nil is slog.Default(); reg nil registers no metrics.
func New(core *decision.Core, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if core == nil {
		return nil, errors.New("rls: New: no Core")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Service{cfg: cfg, core: core, log: log, stop: make(chan struct{}), health: health.NewServer()}
	s.pool.New = func() any { return new(rlsScratch) }
	var err error
	if s.m, err = newRLSMetrics(reg); err != nil {
		return nil, err
	}
	s.srv = grpc.NewServer(grpc.ForceServerCodecV2(rlsCodec{base: encoding.GetCodecV2("proto"), rls: s}))
	rlspb.RegisterRateLimitServiceServer(s.srv, s)
	healthpb.RegisterHealthServer(s.srv, s.health)
	if cfg.Reflection {
		reflection.Register(s.srv)
	}
	s.setHealth(s.ready())
	return s, nil
}

// Serve serves the service on ln until Stop; it returns nil after Stop.
// It may be called for several listeners.
func (s *Service) Serve(ln net.Listener) error {
	s.mu.Lock()
	if !s.started && !s.stopped {
		s.started = true
		s.wg.Add(1)
		go s.watchHealth()
	}
	s.mu.Unlock()
	if err := s.srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("rls: serve %s: %w", ln.Addr(), err)
	}
	return nil
}

// Stop says NOT_SERVING on the health service, stops accepting, and waits
// for the calls in flight to finish within ctx; past ctx it closes every
// connection and returns ctx's error. It is safe to call more than once.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.health.Shutdown()
	done := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.srv.Stop()
		<-done
		err = fmt.Errorf("rls: stop: %w", ctx.Err())
	}
	s.wg.Wait()
	return err
}

// ready is the health service's answer: the edge is ready and the rules in
// force have a descriptor index.
func (s *Service) ready() bool {
	return s.cfg.Ready() && envoyconf.DescriptorsOf(s.core.Rules()) != nil
}

func (s *Service) setHealth(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, st)
}

// watchHealth asks Ready every HealthInterval until Stop.
func (s *Service) watchHealth() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	last := s.ready()
	s.setHealth(last)
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if ok := s.ready(); ok != last {
				last = ok
				s.setHealth(ok)
			}
		}
	}
}

// rlsDesc is the working state of one descriptor of a request.
type rlsDesc struct {
	m            rules.DescriptorMatch
	eoff, elen   int // its entries in rlsScratch.entries
	koff, klen   int // its counter key in rlsScratch.keys
	hits         uint64
	replaced     bool
	quota        bool
	over         bool
	hasLimit     bool // a status with current_limit
	remaining    uint32
	reset        time.Duration
	retryAt      int64 // Unix ns, when over: when a request fits again
	policy       []byte
	policyWindow time.Duration
}

// rlsScratch is the working space of one request and the response it
// answers, pooled. resp must stay the first field: the codec finds the
// scratch from the response it marshals.
type rlsScratch struct {
	resp     rlspb.RateLimitResponse
	statuses []*rlspb.RateLimitResponse_DescriptorStatus
	limits   []*rlspb.RateLimitResponse_RateLimit
	durs     []*durationpb.Duration
	mults    []*wrapperspb.UInt32Value
	hdrs     [4]corepb.HeaderValue
	hdrPtrs  [4]*corepb.HeaderValue
	hbuf     []byte
	hoff     [4][2]int
	entries  []rules.DescriptorEntry
	keys     []byte
	ds       []rlsDesc
}

// grow makes room for n descriptors.
func (sc *rlsScratch) grow(n int) {
	for len(sc.statuses) < n {
		sc.statuses = append(sc.statuses, new(rlspb.RateLimitResponse_DescriptorStatus))
		sc.limits = append(sc.limits, new(rlspb.RateLimitResponse_RateLimit))
		sc.durs = append(sc.durs, new(durationpb.Duration))
		sc.mults = append(sc.mults, new(wrapperspb.UInt32Value))
	}
	if cap(sc.ds) < n {
		sc.ds = make([]rlsDesc, n)
	}
	sc.ds = sc.ds[:n]
}

// ShouldRateLimit answers one request of Envoy's rate limit filter as
// envoyproxy/ratelimit does (rules/envoyconf/SERVICE.md): one status per
// descriptor in request order, the overall code, and the configured
// response headers. Unknown domains and descriptors are answered OK;
// an empty domain, no descriptors, no envoyproxy/ratelimit rules in force,
// or a descriptor's limit with an unknown unit are errors.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (resp *rlspb.RateLimitResponse, err error) {
	now := s.cfg.Now()
	defer func() {
		if p := recover(); p != nil {
			s.m.errPanic.Inc()
			s.log.Error("rls: panic", "panic", p)
			resp, err = nil, errRLSPanic
		}
	}()
	switch {
	case req.GetDomain() == "":
		s.m.errEmptyDomain.Inc()
		return nil, errRLSEmptyDomain
	case len(req.GetDescriptors()) == 0:
		s.m.errNoDescriptors.Inc()
		return nil, errRLSNoDescriptors
	case len(req.Descriptors) > s.cfg.MaxDescriptors:
		s.m.errTooMany.Inc()
		return nil, errRLSTooMany
	}
	sc := s.pool.Get().(*rlsScratch)
	if err = s.decide(sc, req, now); err != nil {
		s.pool.Put(sc)
		return nil, err
	}
	s.m.duration.Observe(time.Since(now).Seconds())
	return &sc.resp, nil
}

// decide answers req into sc.resp from the rules in force: one generation
// for the whole request, whatever reload comes meanwhile.
func (s *Service) decide(sc *rlsScratch, req *rlspb.RateLimitRequest, now time.Time) error {
	g := s.core.Current()
	rs := g.Rules()
	idx := envoyconf.DescriptorsOf(rs)
	if idx == nil {
		s.m.errNoConfig.Inc()
		return errRLSNoConfig
	}
	n := len(req.Descriptors)
	sc.grow(n)
	known := idx.HasDomain(req.Domain)
	if !known {
		s.m.unknownDomain.Inc()
	}

	// Every lookup before any count, as ratelimit's constructLimitsToCheck.
	sc.entries, sc.keys = sc.entries[:0], sc.keys[:0]
	for i, d := range req.Descriptors {
		ds := &sc.ds[i]
		*ds = rlsDesc{m: rules.DescriptorMatch{Rule: -1}, eoff: len(sc.entries)}
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, rules.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		ds.elen = len(sc.entries) - ds.eoff
		ds.hits = hitsOf(d, req.HitsAddend)
	}
	for i, d := range req.Descriptors {
		ds := &sc.ds[i]
		if !known {
			continue
		}
		entries := sc.entries[ds.eoff : ds.eoff+ds.elen]
		ds.koff = len(sc.keys)
		if o := d.GetLimit(); o != nil {
			var err error
			ds.m, sc.keys, err = idx.Override(req.Domain, entries, o.GetRequestsPerUnit(), uint8(o.GetUnit()), sc.keys)
			if err != nil {
				s.m.errBadOverride.Inc()
				return err
			}
		} else {
			ds.m, sc.keys = idx.Descriptor(req.Domain, entries, sc.keys)
		}
		ds.klen = len(sc.keys) - ds.koff
	}
	applyReplaces(sc.ds[:n])

	t := now.UnixNano()
	for i := range sc.ds[:n] {
		ds := &sc.ds[i]
		counted := (ds.m.Answer == rules.DescriptorCounted || ds.m.Answer == rules.DescriptorOverride) && !ds.replaced
		ds.quota = s.cfg.QuotaMode && ds.m.Answer != rules.DescriptorUnlimited || counted && ds.m.Quota
		if !counted {
			continue
		}
		r := rs.Rules[ds.m.Rule]
		ds.hasLimit = true
		ds.reset = untilReset(now, ds.m.Window)
		ds.policy, ds.policyWindow = r.NameBytes(), ds.m.Window
		if most := admitsAtMost(ds, r); ds.hits > most {
			// More hits than the limit admits in one call: never admitted,
			// so nothing is counted (SERVICE.md, "hits_addend"). Counting
			// them would refuse every caller sharing the descriptor for the
			// rest of the window on one call's word.
			if most == 0 {
				s.m.uncountedZero.Inc()
			} else {
				s.m.uncountedHits.Inc()
			}
			ds.over = !r.Shadow
			if ds.over {
				ds.retryAt = t + int64(ds.reset)
			}
			continue
		}
		var limit uint64 // an override: the rule counts, the request's limit decides
		if ds.m.Answer == rules.DescriptorOverride {
			limit = uint64(ds.m.RequestsPerUnit)
		}
		v := s.core.DecideKey(g, now, ds.m.Rule, sc.keys[ds.koff:ds.koff+ds.klen], ds.hits, limit)
		ds.over = v.Outcome != decision.Allowed
		if !ds.over && (limit == 0 || !v.Fallback) { // a failed override: the fail policy answered
			ds.remaining = uint32(min(v.Quota.Remaining, uint64(ds.m.RequestsPerUnit)))
		}
		if ds.over {
			ds.remaining = 0
			ds.retryAt = t + int64(ds.reset)
			if v.Quota.ReleaseAt > t && ds.m.Answer == rules.DescriptorCounted {
				ds.retryAt = v.Quota.ReleaseAt
			}
		}
		s.core.Finish(v)
	}
	s.answer(sc, n, now)
	return nil
}

// hitsOf returns what descriptor d adds: its own hits_addend when set,
// 0 included (check only), else the request's, where 0 means 1
// (ratelimit's GetHitsAddends).
func hitsOf(d *rlcommon.RateLimitDescriptor, req uint32) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return uint64(max(req, 1))
}

// admitsAtMost is the most hits one call to descriptor ds, counted by
// rule r, can be admitted with whatever the count: the limit per window,
// or for a token or leaky bucket its capacity. A limit of 0 admits none.
func admitsAtMost(ds *rlsDesc, r *rules.Rule) uint64 {
	if ds.m.Answer == rules.DescriptorCounted && r.Burst > 0 &&
		(r.Algorithm == window.TokenBucketAlgorithm || r.Algorithm == window.LeakyBucketAlgorithm) {
		return r.Burst
	}
	return uint64(ds.m.RequestsPerUnit)
}

// applyReplaces marks every descriptor whose limit another descriptor's
// limit replaces by name (unlimited and replaced ones replace too), as
// ratelimit's constructLimitsToCheck.
func applyReplaces(ds []rlsDesc) {
	for i := range ds {
		name := ds[i].m.Name
		if name == "" || ds[i].m.Answer == rules.DescriptorNone {
			continue
		}
	search:
		for j := range ds {
			for _, r := range ds[j].m.Replaces {
				if r == name {
					ds[i].replaced = true
					break search
				}
			}
		}
	}
}

// untilReset is ratelimit's duration_until_reset for a window aligned to
// the Unix epoch: the window's whole seconds minus now's within it (exact
// to the millisecond for windows that are not whole seconds); 0 without a
// window.
func untilReset(now time.Time, w time.Duration) time.Duration {
	if w <= 0 {
		return 0
	}
	if w%time.Second == 0 {
		d := int64(w / time.Second)
		m := now.Unix() % d
		if m < 0 {
			m += d
		}
		return time.Duration(d-m) * time.Second
	}
	d := w.Milliseconds()
	m := now.UnixMilli() % d
	if m < 0 {
		m += d
	}
	return time.Duration(d-m) * time.Millisecond
}

// answer fills sc.resp from the decided descriptors: statuses, overall
// code, headers.
func (s *Service) answer(sc *rlsScratch, n int, now time.Time) {
	resp := &sc.resp
	resp.Statuses = sc.statuses[:n]
	resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd, resp.RawBody, resp.DynamicMetadata, resp.Quota = nil, nil, nil, nil, nil
	failedRL, failedQuota, totalQuota := 0, 0, 0
	chosen, minRemaining := -1, uint32(math.MaxUint32)
	var retryAt int64
	for i := range sc.ds[:n] {
		ds := &sc.ds[i]
		st := sc.statuses[i]
		st.Code, st.LimitRemaining, st.CurrentLimit, st.DurationUntilReset, st.Quota = rlspb.RateLimitResponse_OK, 0, nil, nil, nil
		unlimited := ds.m.Answer == rules.DescriptorUnlimited
		switch {
		case unlimited:
			st.LimitRemaining = math.MaxUint32
			s.m.descUnlimited.Inc()
		case ds.replaced:
			s.m.descReplaced.Inc()
		case !ds.hasLimit:
			s.m.descNone.Inc()
		default:
			rl := sc.limits[i]
			rl.Name, rl.RequestsPerUnit = ds.m.Name, ds.m.RequestsPerUnit
			rl.Unit = rlspb.RateLimitResponse_RateLimit_Unit(ds.m.Unit)
			rl.UnitMultiplier = nil
			if ds.m.UnitMultiplier > 1 {
				rl.UnitMultiplier = sc.mults[i]
				rl.UnitMultiplier.Value = ds.m.UnitMultiplier
			}
			d := sc.durs[i]
			d.Seconds, d.Nanos = int64(ds.reset/time.Second), int32(ds.reset%time.Second)
			st.CurrentLimit, st.DurationUntilReset, st.LimitRemaining = rl, d, ds.remaining
			if ds.over {
				st.Code = rlspb.RateLimitResponse_OVER_LIMIT
				retryAt = max(retryAt, ds.retryAt)
				s.m.descOver.Inc()
			} else {
				s.m.descOK.Inc()
			}
		}
		// The header's descriptor, as ratelimit chooses it.
		if ds.hasLimit && ds.remaining < minRemaining {
			chosen, minRemaining = i, ds.remaining
		}
		if unlimited {
			continue
		}
		if ds.over && !ds.replaced {
			if ds.quota {
				failedQuota++
			} else {
				failedRL++
				chosen, minRemaining = i, 0
			}
		}
		if ds.quota {
			totalQuota++
		}
	}
	over := failedRL > 0 || totalQuota > 0 && totalQuota == failedQuota
	if over && s.cfg.ShadowMode {
		over = false
		s.m.globalShadow.Inc()
	}
	resp.OverallCode = rlspb.RateLimitResponse_OK
	if over {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		s.m.respOver.Inc()
	} else {
		s.m.respOK.Inc()
	}
	if chosen >= 0 && s.cfg.Headers != HeadersNone {
		s.headers(sc, &sc.ds[chosen], over, retryAt, now)
	}
}

// Header names of response_headers_to_add.
const (
	hdrPolicy     = "RateLimit-Policy"
	hdrRateLimit  = "RateLimit"
	hdrRetryAfter = "Retry-After"
	hdrRLLimit    = "RateLimit-Limit"
	hdrRLRemain   = "RateLimit-Remaining"
	hdrRLReset    = "RateLimit-Reset"
)

// headers writes the response headers of descriptor ds into sc.resp. Their
// values are views of sc.hbuf, which lives as long as the response.
func (s *Service) headers(sc *rlsScratch, ds *rlsDesc, over bool, retryAt int64, now time.Time) {
	b := sc.hbuf[:0]
	k := 0
	mark := func(start int) {
		sc.hoff[k] = [2]int{start, len(b)}
		k++
	}
	t := ceilSeconds(int64(ds.reset))
	var keys [4]string
	if s.cfg.Headers == HeadersRatelimit {
		keys = [4]string{hdrRLLimit, hdrRLRemain, hdrRLReset}
		st := len(b)
		b = strconv.AppendUint(b, uint64(ds.m.RequestsPerUnit), 10)
		mark(st)
		st = len(b)
		b = strconv.AppendUint(b, uint64(ds.remaining), 10)
		mark(st)
		st = len(b)
		b = strconv.AppendInt(b, t, 10)
		mark(st)
	} else {
		keys = [4]string{hdrPolicy, hdrRateLimit, hdrRetryAfter}
		st := len(b)
		b = appendSFPolicy(b, ds.policy, uint64(ds.m.RequestsPerUnit), ceilSeconds(int64(ds.policyWindow)))
		mark(st)
		st = len(b)
		b = appendSFLimit(b, ds.policy, uint64(ds.remaining), t)
		mark(st)
		if over {
			tn := now.UnixNano()
			ra := max(decision.RetryAfter(retryAt, tn, s.cfg.RetryJitter), t)
			st = len(b)
			b = strconv.AppendInt(b, ra, 10)
			mark(st)
		}
	}
	sc.hbuf = b
	for i := 0; i < k; i++ {
		h := &sc.hdrs[i]
		h.Key, h.RawValue = keys[i], nil
		h.Value = bytesView(b[sc.hoff[i][0]:sc.hoff[i][1]])
		sc.hdrPtrs[i] = h
	}
	sc.resp.ResponseHeadersToAdd = sc.hdrPtrs[:k]
}

// appendSFPolicy appends a RateLimit-Policy item: the policy name as an
// sf-string (rule names need no escaping) with q and w.
func appendSFPolicy(dst, name []byte, q uint64, w int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, `";q=`...)
	dst = strconv.AppendUint(dst, q, 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, max(w, 1), 10)
}

// appendSFLimit appends a RateLimit item: the policy name with r and t.
func appendSFLimit(dst, name []byte, r uint64, t int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, `";r=`...)
	dst = strconv.AppendUint(dst, r, 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, t, 10)
}

// bytesView returns b as a string without copying: b must not change while
// the string is in use (here: until the response is marshaled).
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// release returns a response ShouldRateLimit made, and its working space,
// to the pool; resp must not be used after.
func (s *Service) release(resp *rlspb.RateLimitResponse) {
	sc := (*rlsScratch)(unsafe.Pointer(resp)) // resp is sc.resp, its first field
	sc.resp.Statuses, sc.resp.ResponseHeadersToAdd = nil, nil
	s.pool.Put(sc)
}

// rlsCodec is gRPC's proto codec that, once it has marshaled a response of
// ShouldRateLimit, hands it back to the pool: the server reads a reply
// only to marshal it, unless RPC tracing (grpc.EnableTracing) logs it, in
// which case nothing is recycled. The RLS's server has no stats handler,
// the only other reader.
type rlsCodec struct {
	base encoding.CodecV2
	rls  *Service
}

func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := c.base.Marshal(v)
	if r, ok := v.(*rlspb.RateLimitResponse); ok && !grpc.EnableTracing {
		c.rls.release(r)
	}
	return out, err
}

func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }
func (c rlsCodec) Name() string                                { return c.base.Name() }

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
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help:    "Time to decide a ShouldRateLimit call, from its arrival in the handler to its answer, in seconds.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{reqs, descs, errs, uncounted, m.unknownDomain, m.globalShadow, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: metrics: %w", err)
		}
	}
	return m, nil
}

// ceilSeconds returns d nanoseconds rounded up to whole seconds, at least 0.
func ceilSeconds(d int64) int64 {
	if d <= 0 {
		return 0
	}
	return (d + int64(time.Second) - 1) / int64(time.Second)
}
