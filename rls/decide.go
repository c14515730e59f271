package rls

import (
	"context"
	"errors"
	"math"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// The errors of requests refused before any lookup, with
// envoyproxy/ratelimit's texts (gRPC status UNKNOWN, as ratelimit's).
var (
	errRLSEmptyDomain   = errors.New("rate limit domain must not be empty")
	errRLSNoDescriptors = errors.New("rate limit descriptor list must not be empty")
	errRLSNoConfig      = errors.New("no rate limit configuration loaded")
	errRLSTooMany       = errors.New("too many rate limit descriptors")
	errRLSPanic         = errors.New("internal error")
)

// rlsDesc is the working state of one descriptor of a request.
type rlsDesc struct {
	m            rules.DescriptorMatch
	eoff, elen   int // its entries in rlsScratch.entries
	koff, klen   int // its counter key in rlsScratch.keys
	hits         uint64
	replaced     bool
	settle       bool // a stream-done call settling reservations (settle.go)
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
	// The reservations of counting rules, for request_headers_to_add.
	res    corepb.HeaderValue
	resPtr [1]*corepb.HeaderValue
	resBuf []byte
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
	now := s.core.Now()
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
		ds.settle = ds.elen == 1 && sc.entries[ds.eoff].Key == ReservationKey
	}
	sc.resBuf = sc.resBuf[:0]
	for i, d := range req.Descriptors {
		ds := &sc.ds[i]
		if !known || ds.settle {
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
		if ds.settle {
			s.settle(sc.entries[ds.eoff].Value, ds.hits)
			continue
		}
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
		if v.Counting() {
			s.hold(sc, v)
		}
		s.core.Finish(v)
	}
	s.answer(sc, n, now)
	if len(sc.resBuf) > 0 {
		sc.res = corepb.HeaderValue{Key: ReservationHeader, Value: bytesView(sc.resBuf)}
		sc.resPtr[0] = &sc.res
		sc.resp.RequestHeadersToAdd = sc.resPtr[:]
	}
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
		(r.Algorithm == policy.TokenBucket || r.Algorithm == policy.LeakyBucket) {
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
