package decision

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
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
	Emit(e *event.Event) bool
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
	// use it). A decision's time is Request.Now (DecideKey's now), or
	// the limiter's clock after a wait for a new key's read (see the
	// package doc). An admitted request of a rule with count is observed
	// when it settles (its event Counting), with a nil key: its key
	// material is not kept past the decision.
	Observe func(r *rules.Rule, key []byte, e *event.Event)
	// MaxDelayed bounds the requests held at once by leaky-bucket queues
	// (rules with action: delay); a request that would wait past it is
	// refused, as if its queue were full.
	MaxDelayed int // default 10,000
	// Wait holds an admitted request of a delay rule for d. nil sleeps;
	// the offline simulator, whose time is simulated, passes a no-op.
	Wait func(d time.Duration)
	// Pop names this edge's PoP in decision events (at most 32 bytes);
	// empty: none.
	Pop string
	// GlobalShare is the part of a global rule's limit this PoP admits
	// while it is cut off from the other PoPs' counts (CoreDeps.Global not
	// fresh). Default DefaultGlobalShare.
	GlobalShare float64
	// Clock is the time every front end over this core reads (Now) for
	// the requests it asks about, so that one clock reaches them all.
	Clock store.Clock // default store.SystemClock
	// RetryJitter is the most random time added to a refusal's
	// Retry-After (Verdict.Refuse), by every front end alike; negative:
	// none.
	RetryJitter time.Duration // default DefaultRetryJitter (2s)
	// BodyKeyBytes bounds the body a front end reads for the rules keyed
	// by it (form: and json: key parts), and only for requests such a
	// rule matches (WantsBody): a longer body falls back as the rule's
	// missing_key says (BodyTooLarge). At most MaxBodyKeyBytes.
	BodyKeyBytes int // default DefaultBodyKeyBytes (8 KiB)
	// SettleTimeout is how long a decision-mode reservation of a counting
	// rule (Hold) waits for its settle call; one not settled by then
	// keeps its units, as a request whose response never came.
	SettleTimeout time.Duration // default DefaultSettleTimeout (1m)
	// MaxHeld bounds the reservations held for a settle call: they are
	// kept in the order issued, and a settled one's room comes free once
	// those issued before it have settled or timed out. When it is
	// reached, a new reservation keeps its units at once.
	MaxHeld int // default DefaultMaxHeld (65,536)
}

// DefaultGlobalShare is CoreConfig.GlobalShare's default: two PoPs sharing
// a client evenly.
const DefaultGlobalShare = 0.5

// GlobalView is what an edge knows of the other PoPs (package global's
// Table): the units they counted for key in the sliding window of w ns
// ending at now, and whether that view is fresh. It must not allocate.
type GlobalView interface {
	Others(key uint64, now, w int64) (units uint64, fresh bool)
}

// CoreDeps are the parts a Core runs. Limiter is required.
type CoreDeps struct {
	Limiter *window.Limiter
	// Blocks holds refused keys until their release; nil: none, every
	// decision asks the limiter, and rules of action: block are refused
	// (the cache is what holds their block for the timeout).
	Blocks BlockCache
	// Slots runs concurrency rules; nil refuses rules that have any.
	Slots      *slots.Slots
	Events     Emitter               // nil: no decision events
	Registerer prometheus.Registerer // nil: metrics kept, not registered
	// Global is the other PoPs' counts for global rules; nil: a global
	// rule's limit holds within this PoP, as a pop rule's does.
	Global GlobalView
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
	wm     *waitMetrics // Wait and Reserve (wait.go)
	pop    []byte       // cfg.Pop, for events

	rules    atomic.Pointer[snapshot]
	pool     sync.Pool // *Verdict
	shed     shedder
	inflight atomic.Int64
	delayed  atomic.Int64 // requests held by leaky-bucket queues
	owned    *owned       // what New started, stopped by Close; nil for NewCore
	held     heldTable    // decision-mode reservations waiting to settle (held.go)
	sm       *settleMetrics
}

// snapshot is one generation of rules with the metric handles of each rule,
// swapped in whole by SetRules.
type snapshot struct {
	rules    *rules.Rules
	counters []ruleCounters // by rule index
	// admit is the policy each rule's admissions are decided under, by
	// rule index: the rule's own, but for a counting rule of mode: async,
	// decided by one store round trip as a sync rule is (settle.go).
	admit    []*window.Policy
	fixed    []fixedFields // by rule index
	failHard bool          // some rule fails closed
	shedding bool          // load shedding is on (Upstream and max_in_flight set)
	hasConc  bool          // some rule limits concurrency
	bodyKeys bool          // some rule is keyed by the body (WantsBody)
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
	if deps.Limiter == nil {
		return nil, errors.New("edge: NewCore: a Limiter is required")
	}
	if deps.Blocks == nil {
		deps.Blocks = noBlocks{}
	}
	if cfg.MaxDelayed < 0 || cfg.MaxDelayed > 1<<20 {
		return nil, fmt.Errorf("edge: MaxDelayed %d: must be between 0 (default) and 2^20", cfg.MaxDelayed)
	}
	if cfg.MaxDelayed == 0 {
		cfg.MaxDelayed = 10000
	}
	if len(cfg.Pop) > event.MaxPopLen {
		return nil, fmt.Errorf("edge: Pop %q: at most %d bytes", cfg.Pop, event.MaxPopLen)
	}
	if cfg.GlobalShare < 0 || cfg.GlobalShare > 1 {
		return nil, fmt.Errorf("edge: GlobalShare %v: must be between 0 and 1", cfg.GlobalShare)
	}
	if cfg.GlobalShare == 0 {
		cfg.GlobalShare = DefaultGlobalShare
	}
	if cfg.RetryJitter > MaxRetryJitter {
		return nil, fmt.Errorf("edge: RetryJitter %v: at most %v (negative: none)", cfg.RetryJitter, MaxRetryJitter)
	}
	switch {
	case cfg.RetryJitter == 0:
		cfg.RetryJitter = DefaultRetryJitter
	case cfg.RetryJitter < 0:
		cfg.RetryJitter = 0
	}
	if cfg.Clock == nil {
		cfg.Clock = store.SystemClock
	}
	if cfg.BodyKeyBytes < 0 || cfg.BodyKeyBytes > MaxBodyKeyBytes {
		return nil, fmt.Errorf("edge: BodyKeyBytes %d: must be between 0 (default) and %d", cfg.BodyKeyBytes, MaxBodyKeyBytes)
	}
	if cfg.BodyKeyBytes == 0 {
		cfg.BodyKeyBytes = DefaultBodyKeyBytes
	}
	if cfg.SettleTimeout < 0 || cfg.SettleTimeout > 24*time.Hour {
		return nil, fmt.Errorf("edge: SettleTimeout %v: must be between 0 (default) and 24h", cfg.SettleTimeout)
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = DefaultSettleTimeout
	}
	if cfg.MaxHeld < 0 || cfg.MaxHeld > 1<<24 {
		return nil, fmt.Errorf("edge: MaxHeld %d: must be between 0 (default) and 2^24", cfg.MaxHeld)
	}
	if cfg.MaxHeld == 0 {
		cfg.MaxHeld = DefaultMaxHeld
	}
	c := &Core{cfg: cfg, deps: deps, lim: deps.Limiter, blocks: deps.Blocks, pop: []byte(cfg.Pop)}
	c.pool.New = func() any { return &Verdict{key: make([]byte, 0, 256)} }
	var err error
	if c.m, err = newCoreMetrics(deps.Registerer, c); err != nil {
		return nil, err
	}
	if c.wm, err = newWaitMetrics(deps.Registerer); err != nil {
		return nil, err
	}
	if c.sm, err = newSettleMetrics(deps.Registerer, c); err != nil {
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
		admit:    make([]*window.Policy, len(rs.Rules)),
		shedding: rs.Shedding.MaxInFlight > 0 && c.cfg.Upstream, blockSalt: rand.Uint64()}
	n, counting := 0, 0
	for i, r := range rs.Rules {
		sn.admit[i] = &r.Policy
		if r.Count.On() {
			counting++
			if r.Mode == policy.Async {
				p := r.Policy
				p.Mode = policy.Sync
				sn.admit[i] = &p
			}
		}
		sn.counters[i] = c.m.forRule(r.Name)
		q := Quota{Rule: r, Limit: r.Limit}
		sn.fixed[i] = fixedFields{limit: r.Limit, policy: AppendPolicy(nil, &q), xlimit: strconv.AppendUint(nil, r.Limit, 10),
			problem: appendProblemHead(nil, &q)}
		if r.Fail == policy.FailClosed {
			sn.failHard = true
		}
		if r.Kind == rules.Concurrency {
			n++
		}
		sn.bodyKeys = sn.bodyKeys || r.BodyKey()
		if _, none := c.blocks.(noBlocks); none && r.Action == policy.Block {
			return fmt.Errorf("edge: rule %q has action: block, which needs a block cache (CoreDeps.Blocks) to hold the block for its timeout", r.Name)
		}
	}
	sn.hasConc = n > 0
	switch {
	case n > 0 && c.deps.Slots == nil:
		return errors.New("edge: rules have concurrency limits but the edge has no Slots")
	case n > maxHeld:
		return fmt.Errorf("edge: %d concurrency rules, at most %d", n, maxHeld)
	case rs.MatchAll && counting > maxPending:
		return fmt.Errorf("edge: %d rules with count under match: all, at most %d (one request reserves units under each)", counting, maxPending)
	}
	old := c.rules.Swap(sn)
	if old != nil {
		c.blocks.Clear()
		c.m.dropRemoved(old.rules, rs)
	}
	return nil
}

// Now is the time by the core's clock (CoreConfig.Clock): every front end
// stamps its requests with it.
func (c *Core) Now() time.Time { return c.cfg.Clock.Now() }

// RetryJitter is the most random time the core adds to a refusal's
// Retry-After (CoreConfig.RetryJitter; 0: none), for front ends that
// render Retry-After from a release time of their own (the rate limit
// service).
func (c *Core) RetryJitter() time.Duration { return c.cfg.RetryJitter }

// FailsClosed reports whether some rule in force fails closed.
func (c *Core) FailsClosed() bool { return c.rules.Load().failHard }

// Decide decides req. The Verdict must be handed back with Finish, once
// the request is over when it was Tracked.
func (c *Core) Decide(req *Request) *Verdict {
	d := c.get(req.Now)
	c.decideInto(req, d)
	if d.np > 0 && d.Outcome != Allowed {
		c.keepAs(d, settledRefused) // given back: no origin answered
	}
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
		var why BodyReason
		d.key, st, why = AppendKeyBody(d.key[:0], req.Fields, r, req.Addr, c.cfg.BodyKeyBytes)
		if why != BodyRead {
			c.m.bodyKey[why].Inc()
		}
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
	d.Delay, d.jitter = 0, c.cfg.RetryJitter
}

// Finish gives back the concurrency slots d holds, keeps the units of
// counting rules not settled (Settle: no response came) and returns d to
// the pool; d must not be used after.
func (c *Core) Finish(d *Verdict) {
	if d.np > 0 {
		c.keepAs(d, settledNoResponse)
	}
	for i := 0; i < d.nh; i++ {
		c.deps.Slots.Release(d.held[i].key)
		d.held[i] = heldSlot{}
	}
	d.nh = 0
	d.Quota.Rule = nil
	c.pool.Put(d)
}

// RefusedPath counts a request a front end refused with 400 before any
// decision because origins read its path differently (a backslash, a
// leading "//"), in poplimit_edge_bad_requests_total{reason="ambiguous_path"}.
func (c *Core) RefusedPath() { c.m.badPath.Inc() }

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
