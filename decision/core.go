package decision

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/window"
)

// BlockCache is what the core needs of a cache of blocked keys (package
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

// Fields reads a request's header fields, query parameters and cookies for
// key recipes and cost headers. Each method returns the first and the last
// value of the field called name and n, how many times it appears: n = 0
// when absent (first and last nil), first and last the same value when
// n = 1. The core decides what a field that appears more than once means
// (the rule's duplicate_key), so a front end counts every occurrence:
//
//   - a header once per line (names compared under ASCII case folding),
//     its value the line's bytes without surrounding blanks;
//   - a query parameter once per name=value pair of the query (a bare name
//     counts, with an empty value), names and values percent-decoded, a
//     plus being a space;
//   - a cookie once per name=value pair of all the Cookie lines together
//     (a client or an HTTP/2 hop may split the one list into several
//     lines), names compared exactly, values as written but for
//     surrounding blanks and one pair of surrounding double quotes; a
//     pair whose value then holds '"', ';' or '\' is not a cookie.
//
// A front end implements it over its own request type without allocating
// (but to percent-decode); the returned bytes need only live until Decide
// returns.
type Fields interface {
	Header(name string) (first, last []byte, n int)
	Query(name string) (first, last []byte, n int)
	Cookie(name string) (first, last []byte, n int)
}

// Request is what the core needs to know of one request. A front end fills
// it from its own request type; nothing in it is kept after Decide returns.
type Request struct {
	Host   []byte // without port, as rules match it
	Method []byte
	Path   []byte     // after any check prefix, without the query
	Addr   netip.Addr // the client, as resolved from trusted proxies
	Fields Fields     // nil: the request has no headers, query or cookies
	Now    time.Time
	// Tracked says the front end sees the response complete and calls
	// Finish then: concurrency rules apply only to tracked requests (in
	// decision mode the edge never sees the upstream's response).
	Tracked bool
}

// Outcome is the core's answer to one request.
type Outcome uint8

const (
	// Allowed: forward or answer 200. No rule applied when Quota.Rule is nil.
	Allowed Outcome = iota
	// Limited: answer 429 with Retry-After from Quota.ReleaseAt.
	Limited
	// Denied: answer 400 with Reason: the request lacks the key its rule
	// needs (missing_key: deny), carries a field of the key more than once
	// (duplicate_key: refuse) or carries a bad cost.
	Denied
	// Shed: the upstream is overloaded and this class of request is shed;
	// answer 503 with Retry-After from Quota.ReleaseAt.
	Shed
	// Undecidable: the rule asked for cannot be decided by this call (a
	// concurrency or shed rule through DecideKey); answer with Reason.
	Undecidable
)

var outcomeNames = [...]string{"allowed", "limited", "denied", "shed", "undecidable"}

func (o Outcome) String() string { return outcomeNames[o] }

// Quota is what the response headers of one request say: the state of the
// rule that answers it (the refusing rule, or the allowing rule with the
// least remaining).
type Quota struct {
	Rule      *rules.Rule // nil when no rule applied
	Limit     uint64
	Remaining uint64
	ResetAt   int64 // Unix ns: when the rule's current window ends
	ReleaseAt int64 // Unix ns, refusals only: when a request of this cost fits again

	fixed *fixedFields // the rule's header values rendered once; nil: render them
}

// fixedFields are the header values of a rule that do not change from
// request to request at its own limit, rendered once per generation of
// rules: RateLimit-Policy, X-RateLimit-Limit and most of the problem body.
type fixedFields struct {
	limit   uint64 // what they were rendered for
	policy  []byte
	xlimit  []byte
	problem []byte // the refusal's problem body up to its retry_after value
}

// Verdict is the core's verdict on one request and the working space that
// produced it. Decide returns one from a pool; the front end reads it,
// answers, and hands it back with Finish, after the response completed
// when the request was Tracked. A Verdict is not safe for concurrent use.
type Verdict struct {
	Outcome Outcome
	Quota   Quota
	Reason  string // for Denied and Undecidable: a sentence for the problem detail
	// FromBlockCache says a refusal was answered from the block cache;
	// Fallback that a store failure decided (the rule's fail policy).
	FromBlockCache, Fallback bool
	// Delay is how long a leaky-bucket queue (action: delay) held the
	// admitted request before the core answered.
	Delay time.Duration

	key  []byte
	ev   pipeline.Event
	held [maxHeld]heldSlot
	nh   int
	now  time.Time
}

// Key returns the key material of the answering rule's key (valid until
// Finish), for reports.
func (d *Verdict) Key() []byte { return d.key }

// maxHeld bounds the concurrency slots one request can hold.
const maxHeld = 4

type heldSlot struct {
	rule *rules.Rule
	key  uint64
}

// CoreConfig configures a Core. The zero value of each field means the
// default written beside it.
type CoreConfig struct {
	// EdgeID names this edge in decision events (0 to 65535).
	EdgeID int // default 0
	// Upstream says the front end proxies allowed requests and reports the
	// upstream's load (BeginUpstream/EndUpstream): load shedding applies
	// only then.
	Upstream bool
	// Observe, when set, is called for every rule decision with the rule,
	// its key material and the event, on the deciding goroutine; the key
	// and event are valid during the call (the offline simulator's reports
	// use it). A request's time is always Request.Now: the core reads no
	// clock.
	Observe func(r *rules.Rule, key []byte, e *pipeline.Event)
	// MaxDelayed bounds the requests held at once by leaky-bucket queues
	// (rules with action: delay); a request that would wait past it is
	// refused, as if its queue were full.
	MaxDelayed int // default 10,000
	// Wait holds an admitted request of a delay rule for d. nil sleeps;
	// the offline simulator, whose time is simulated, passes a no-op.
	Wait func(d time.Duration)
}

// CoreDeps are the parts a Core runs. Limiter and Blocks are required.
type CoreDeps struct {
	Limiter *window.Limiter
	Blocks  BlockCache
	// Slots runs concurrency rules; nil refuses rules that have any.
	Slots      *window.Slots
	Events     Emitter               // nil: no decision events
	Registerer prometheus.Registerer // nil: metrics kept, not registered
}

// Core is the decision core: match → key → cost → block cache → limiter
// (or concurrency slot) → verdict and event, for every front end alike.
// Its methods are safe for concurrent use and allocate nothing on the
// request path.
type Core struct {
	cfg    CoreConfig
	deps   CoreDeps
	lim    *window.Limiter
	blocks BlockCache
	m      *coreMetrics

	rules    atomic.Pointer[snapshot]
	pool     sync.Pool // *Verdict
	shed     shedder
	inflight atomic.Int64
	delayed  atomic.Int64 // requests held by leaky-bucket queues
}

// snapshot is one generation of rules with the metric handles of each rule,
// swapped in whole by SetRules.
type snapshot struct {
	rules    *rules.Rules
	counters []ruleCounters // by rule index
	fixed    []fixedFields  // by rule index
	failHard bool           // some rule fails closed
	shedding bool           // load shedding is on (Upstream and max_in_flight set)
	hasConc  bool           // some rule limits concurrency
	// blockSalt is mixed into block-cache keys: each generation of rules
	// has blocks of its own, so a block from before a reload can never
	// answer under the new rules, whatever races the cache's Clear.
	blockSalt uint64
}

// NewCore returns a core deciding by rs.
func NewCore(cfg CoreConfig, rs *rules.Rules, deps CoreDeps) (*Core, error) {
	if cfg.EdgeID < 0 || cfg.EdgeID > 65535 {
		return nil, fmt.Errorf("edge: EdgeID %d: must be between 0 and 65535", cfg.EdgeID)
	}
	if deps.Limiter == nil || deps.Blocks == nil {
		return nil, errors.New("edge: NewCore: Limiter and Blocks are required")
	}
	if cfg.MaxDelayed < 0 || cfg.MaxDelayed > 1<<20 {
		return nil, fmt.Errorf("edge: MaxDelayed %d: must be between 0 (default) and 2^20", cfg.MaxDelayed)
	}
	if cfg.MaxDelayed == 0 {
		cfg.MaxDelayed = 10000
	}
	c := &Core{cfg: cfg, deps: deps, lim: deps.Limiter, blocks: deps.Blocks}
	c.pool.New = func() any { return &Verdict{key: make([]byte, 0, 256)} }
	var err error
	if c.m, err = newCoreMetrics(deps.Registerer, c); err != nil {
		return nil, err
	}
	if err := c.SetRules(rs); err != nil {
		return nil, err
	}
	return c, nil
}

// Rules returns the rules in force.
func (c *Core) Rules() *rules.Rules { return c.rules.Load().rules }

// SetRules swaps in new rules. Cached blocks no longer apply, since a
// changed limit or window changes every release time: each generation of
// rules keys its blocks apart, and the old ones are cleared. It refuses rules the core
// cannot run, keeping the old ones.
func (c *Core) SetRules(rs *rules.Rules) error {
	if rs == nil || len(rs.Rules) == 0 {
		return errors.New("edge: no rules")
	}
	sn := &snapshot{rules: rs, counters: make([]ruleCounters, len(rs.Rules)), fixed: make([]fixedFields, len(rs.Rules)),
		shedding: rs.Shedding.MaxInFlight > 0 && c.cfg.Upstream, blockSalt: rand.Uint64()}
	n := 0
	for i, r := range rs.Rules {
		sn.counters[i] = c.m.forRule(r.Name)
		q := Quota{Rule: r, Limit: r.Limit}
		sn.fixed[i] = fixedFields{limit: r.Limit, policy: AppendPolicy(nil, &q), xlimit: strconv.AppendUint(nil, r.Limit, 10),
			problem: appendProblemHead(nil, &q)}
		if r.Fail == window.FailClosed {
			sn.failHard = true
		}
		if r.Kind == rules.Concurrency {
			n++
		}
	}
	sn.hasConc = n > 0
	switch {
	case n > 0 && c.deps.Slots == nil:
		return errors.New("edge: rules have concurrency limits but the edge has no Slots")
	case n > maxHeld:
		return fmt.Errorf("edge: %d concurrency rules, at most %d", n, maxHeld)
	}
	old := c.rules.Swap(sn)
	if old != nil {
		c.blocks.Clear()
		c.m.dropRemoved(old.rules, rs)
	}
	return nil
}

// FailsClosed reports whether some rule in force fails closed.
func (c *Core) FailsClosed() bool { return c.rules.Load().failHard }

// Decide decides req. The Verdict must be handed back with Finish, once
// the request is over when it was Tracked.
func (c *Core) Decide(req *Request) *Verdict {
	d := c.get(req.Now)
	c.decideInto(req, d)
	return d
}

func (c *Core) decideInto(req *Request, d *Verdict) {
	sn := c.rules.Load()
	t := d.now.UnixNano()
	if sn.shedding {
		p := priorityOf(sn.rules, req.Host, req.Method, req.Path)
		if c.shed.load(&sn.rules.Shedding, c.inflight.Load()) >= threshold(p, sn.rules.Shedding.Reserved) {
			c.m.shed[p].Inc()
			d.Outcome = Shed
			d.Quota.ReleaseAt = t + int64(time.Second)
			return
		}
	}
	var best Quota // the allowing rule with the least remaining
	for _, r := range sn.rules.Rules {
		if r.Kind == rules.Shed || !r.Matches(req.Host, req.Method, req.Path) {
			continue
		}
		if r.Kind == rules.Concurrency && !req.Tracked {
			continue
		}
		var st KeyStatus
		d.key, st = AppendKeyStatus(d.key[:0], req.Fields, r, req.Addr)
		switch {
		case st == KeyDuplicate:
			c.m.duplicateKey.Inc()
			d.Outcome, d.Quota.Rule, d.Reason = Denied, r, duplicateKeyReason
			return
		case st == KeyMissing:
			switch r.MissingKey {
			case rules.MissingKeySkip:
				continue
			case rules.MissingKeyDeny:
				c.m.missingKey.Inc()
				d.Outcome, d.Quota.Rule, d.Reason = Denied, r, "the request lacks the key that its rate limit needs"
				return
			}
			d.key = AppendFallbackKey(d.key[:0], r, req.Addr)
		}
		cost := r.Cost
		if r.CostHeader != "" && req.Fields != nil {
			// A second line may be the client's, beside the one a proxy
			// wrote: which one counts is not for the edge to guess.
			if v, _, lines := req.Fields.Header(r.CostHeader); lines > 1 {
				c.m.badCost.Inc()
				d.Outcome, d.Quota.Rule, d.Reason = Denied, r, "the request carries its cost header more than once"
				return
			} else if len(v) > 0 {
				n, ok := parseCost(v)
				if !ok || n > r.MaxCost {
					c.m.badCost.Inc()
					d.Outcome, d.Quota.Rule, d.Reason = Denied, r, "the request cost header is not a whole number within the rule's bounds"
					return
				}
				cost = n
			}
		}
		var refused bool
		if r.Kind == rules.Concurrency {
			refused = c.acquire(sn, r, d, t)
		} else {
			refused = c.decide(sn, r, d, t, cost)
		}
		if refused {
			d.Outcome = Limited
			return
		}
		if best.Rule == nil || d.Quota.Remaining < best.Remaining {
			best = d.Quota
		}
		if !sn.rules.MatchAll {
			break
		}
	}
	d.Outcome, d.Quota, d.FromBlockCache = Allowed, best, false
	c.holdAdmitted(d, t)
}

// duplicateKeyReason is the problem detail of a request refused under
// duplicate_key: refuse.
const duplicateKeyReason = "a header, query parameter or cookie of the request's rate-limit key appears more than once; send it once"

// holdAdmitted holds an admitted request for its place in a leaky-bucket
// queue (action: delay), at t; when MaxDelayed requests already wait, it
// is refused instead, released when its place would have come.
func (c *Core) holdAdmitted(d *Verdict, t int64) {
	if d.Delay > 0 && !c.hold(d) {
		d.Outcome = Limited
		d.Quota.ReleaseAt = t + int64(d.Delay)
	}
}

// hold waits out an admitted request's place in its leaky-bucket queue,
// unless MaxDelayed requests already wait: then it reports false.
func (c *Core) hold(d *Verdict) bool {
	if c.delayed.Add(1) > int64(c.cfg.MaxDelayed) {
		c.delayed.Add(-1)
		c.m.delayRefused.Inc()
		return false
	}
	defer c.delayed.Add(-1)
	c.m.delayed.Observe(d.Delay.Seconds())
	if c.cfg.Wait != nil {
		c.cfg.Wait(d.Delay)
	} else {
		time.Sleep(d.Delay)
	}
	return true
}

// Generation is one generation of the rules in force, with what the core
// prepared for it. A front end that maps a request to rules itself reads
// the Generation once per request (Current) and decides every part of
// the request under it, so a reload never splits a request across two
// generations. The zero Generation has no rules.
type Generation struct{ sn *snapshot }

// Current returns the generation in force.
func (c *Core) Current() Generation { return Generation{c.rules.Load()} }

// Rules returns the generation's rules.
func (g Generation) Rules() *rules.Rules {
	if g.sn == nil {
		return nil
	}
	return g.sn.rules
}

// DecideKey decides key under rule index of g directly, with no matching
// and no key recipe: the JSON decision endpoint and Envoy's rate limit
// service, which map their requests to rules themselves. cost is taken as
// it is: 0 checks the key without counting. limit, when not 0, is the
// request's own limit over the rule's count (Envoy's per-descriptor
// override): the rule counts as always, and the Verdict's Outcome and
// Quota say whether that limit is passed and what of it remains; when the
// store failed, the rule's failure policy answers. An index outside g's
// rules, or a concurrency or shed rule (which depend on live requests),
// is Undecidable with the reason; a cost above the rule's bound is
// Denied. The Verdict must be handed back with Finish.
func (c *Core) DecideKey(g Generation, now time.Time, index int, key []byte, cost, limit uint64) *Verdict {
	if g.sn == nil || index < 0 || index >= len(g.sn.rules.Rules) {
		d := c.get(now)
		d.Outcome, d.Reason = Undecidable, "no such rule"
		return d
	}
	r := g.sn.rules.Rules[index]
	d := c.decideKey(g.sn, now, r, key, cost)
	if limit == 0 || d.Fallback || d.Outcome == Undecidable || d.Outcome == Denied {
		return d
	}
	// The rule counted; the request's limit decides: used is what the
	// rule's window holds now, this request's units included.
	used := r.Limit - min(d.Quota.Remaining, r.Limit)
	d.Quota.Limit = limit
	switch {
	case d.Outcome != Allowed || used > limit:
		d.Outcome, d.Quota.Remaining = Limited, 0
	default:
		d.Quota.Remaining = limit - used
	}
	return d
}

func (c *Core) decideKey(sn *snapshot, now time.Time, r *rules.Rule, key []byte, cost uint64) *Verdict {
	d := c.get(now)
	switch {
	case r.Kind != rules.Rate:
		d.Outcome, d.Quota.Rule = Undecidable, r
		d.Reason = "a " + r.Kind.String() + " rule depends on live requests and cannot be decided for a key"
		return d
	case cost > max(r.MaxCost, r.Cost):
		d.Outcome, d.Quota.Rule, d.Reason = Denied, r, "cost is above the rule's bound"
		return d
	}
	d.key = append(d.key[:0], key...)
	t := d.now.UnixNano()
	if c.decide(sn, r, d, t, cost) {
		d.Outcome = Limited
	} else {
		c.holdAdmitted(d, t)
	}
	return d
}

func (c *Core) get(now time.Time) *Verdict {
	d := c.pool.Get().(*Verdict)
	c.reset(d, now)
	return d
}

func (c *Core) reset(d *Verdict, now time.Time) {
	if d.key == nil {
		d.key = make([]byte, 0, 256)
	}
	d.Outcome, d.Quota, d.Reason, d.FromBlockCache, d.Fallback, d.nh, d.now = Allowed, Quota{}, "", false, false, 0, now
	d.Delay = 0
}

// Finish gives back the concurrency slots d holds and returns d to the
// pool; d must not be used after.
func (c *Core) Finish(d *Verdict) {
	for i := 0; i < d.nh; i++ {
		c.deps.Slots.Release(&d.held[i].rule.Policy, d.held[i].key)
		d.held[i] = heldSlot{}
	}
	d.nh = 0
	d.Quota.Rule = nil
	c.pool.Put(d)
}

// BeginUpstream and EndUpstream bracket a proxied request, for the load
// shedding model: requests in flight and a moving average of latency.
func (c *Core) BeginUpstream() time.Time {
	c.inflight.Add(1)
	return time.Now()
}

// EndUpstream ends what BeginUpstream began.
func (c *Core) EndUpstream(begin time.Time) {
	c.shed.observe(time.Since(begin))
	c.inflight.Add(-1)
}

// decide runs rate rule r for the key in d.key, leaving its quota in
// d.Quota, and reports whether the request is refused (shadow rules never
// refuse).
func (c *Core) decide(sn *snapshot, r *rules.Rule, d *Verdict, t int64, cost uint64) bool {
	h := r.Hash(d.key)
	limit := sn.rules.LimitFor(r, d.key)
	rc := &sn.counters[r.Index]
	ev := &d.ev
	*ev = pipeline.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: uint32(cost), Limit: uint32(limit),
		WindowMillis: uint32(r.Window / time.Millisecond), Edge: uint16(c.cfg.EdgeID),
		Mode: pipeline.Mode(r.Mode), Action: eventAction(r.Action), Shadow: r.Shadow,
		Algorithm: pipeline.Algorithm(r.Algorithm), Burst: uint32(burstFor(r, limit))}
	d.Quota = Quota{Rule: r, Limit: limit, fixed: &sn.fixed[r.Index]}
	bk := h ^ sn.blockSalt
	if rel, blocked := c.blocks.Blocked(bk, t); blocked {
		if r.Action == window.Block {
			c.lim.Record(d.now, &r.Policy, h, cost) // a blocked client's real rate stays visible
		}
		rc.limitedCache.Inc()
		d.Quota.ResetAt, d.Quota.ReleaseAt = rel, rel
		d.FromBlockCache = true
		ev.Decision, ev.FromBlockCache = pipeline.Limited, true
		c.emit(r, d)
		return true
	}
	v := c.lim.Decide(context.Background(), d.now, &r.Policy, h, limit, cost)
	if v.At > ev.Time {
		ev.Time = v.At // decided after a wait for the store: judged when decided
	}
	d.Quota.Remaining, d.Quota.ResetAt, d.Quota.ReleaseAt = v.Remaining, v.ResetAt, v.ReleaseAt
	ev.Estimate = float32(v.Estimate)
	if v.Delay > 0 && v.Allowed {
		ev.Delayed, ev.DelayMicros = true, uint32(min(v.Delay/time.Microsecond, 1<<32-1))
		d.Delay = max(d.Delay, v.Delay)
	}
	fb := v.Fallback != window.FallbackNone
	ev.Fallback, d.Fallback = fb, d.Fallback || fb
	ev.Decision = pipeline.Limited
	switch {
	case v.Allowed && fb:
		rc.allowedFallback.Inc()
		ev.Decision = pipeline.Allowed
	case v.Allowed:
		rc.allowed.Inc()
		ev.Decision = pipeline.Allowed
	case r.Shadow:
		rc.shadowLimited.Inc()
	case fb:
		rc.limitedFallback.Inc()
	default:
		rc.limited.Inc()
		if v.ReleaseAt > t && !c.blocks.Block(bk, v.ReleaseAt, t) {
			c.m.blockDropped.Inc()
		}
	}
	c.emit(r, d)
	return !v.Allowed && !r.Shadow
}

// eventAction is a rule's action as events name it: a queue counts what
// it admits, as a throttle does (the event says Delayed).
func eventAction(a window.Action) pipeline.Action {
	if a == window.Block {
		return pipeline.ActionBlock
	}
	return pipeline.ActionThrottle
}

// burstFor is the bucket capacity rule r runs with for limit: a tier's
// limit scales the default burst too (as the limiter does).
func burstFor(r *rules.Rule, limit uint64) uint64 {
	if r.Burst == 0 || (limit != r.Limit && r.Burst == r.Limit) {
		return limit
	}
	return r.Burst
}

// emit hands the event in d to the pipeline, which counts what it drops or
// samples out, and to the observer.
func (c *Core) emit(r *rules.Rule, d *Verdict) {
	if c.deps.Events != nil {
		c.deps.Events.Emit(&d.ev)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(r, d.key, &d.ev)
	}
}

// acquire takes a concurrency slot for the key in d.key under r; Finish
// gives it back.
func (c *Core) acquire(sn *snapshot, r *rules.Rule, d *Verdict, t int64) bool {
	h := r.Hash(d.key)
	limit := sn.rules.LimitFor(r, d.key)
	rc := &sn.counters[r.Index]
	d.Quota = Quota{Rule: r, Limit: limit, ResetAt: t + int64(time.Second), ReleaseAt: t + int64(time.Second)}
	ok, fb := c.deps.Slots.Acquire(context.Background(), d.now, &r.Policy, h, limit)
	switch {
	case ok && fb == window.FallbackNone:
		rc.allowed.Inc()
	case ok:
		rc.allowedFallback.Inc()
	case fb != window.FallbackNone:
		rc.limitedFallback.Inc()
	case r.Shadow:
		rc.shadowLimited.Inc()
		return false
	default:
		rc.limited.Inc()
	}
	d.Fallback = d.Fallback || fb != window.FallbackNone
	if ok {
		d.held[d.nh] = heldSlot{r, h}
		d.nh++
		d.Quota.Remaining = 1 // unknown beyond "not full": say one is left
	}
	if c.cfg.Observe != nil {
		// Concurrency decisions are not rate events (the judge has no truth
		// for them) and go to no Emitter; the observer sees them.
		d.ev = pipeline.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: 1, Limit: uint32(limit),
			Edge: uint16(c.cfg.EdgeID), Decision: pipeline.Limited, Shadow: r.Shadow, Fallback: fb != window.FallbackNone}
		if ok {
			d.ev.Decision = pipeline.Allowed
		}
		c.cfg.Observe(r, d.key, &d.ev)
	}
	return !ok
}

// parseCost parses a cost header: a whole number of at least 1.
func parseCost(v []byte) (uint64, bool) {
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, n >= 1
}
