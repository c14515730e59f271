package loadtest

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/metricsum"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/window"
)

// DefaultTrackedKeys is OfflineConfig.MaxKeys's default: the limited keys
// tracked per rule for the report.
const DefaultTrackedKeys = 100_000

// DefaultSettleDelay is OfflineConfig.SettleDelay's default.
const DefaultSettleDelay = 10 * time.Millisecond

// OfflineConfig configures Offline. The zero value of each field means the
// default written beside it; Rules is required.
type OfflineConfig struct {
	Rules *rules.Rules
	// Origin is the absolute time of the trace's offset 0. Default: the
	// trace's own (from its first request with a Time), else the Unix
	// epoch, a multiple of every window, so that offsets that are
	// multiples of a window fall on its edges as they do in a replay with
	// ReplayConfig.Align.
	Origin time.Time
	// FlushInterval is the simulated limiter's flush interval, driven in
	// trace time. Default the edge's (window.Config's, 5ms).
	FlushInterval time.Duration
	// TopKeys is how many of each rule's most limited keys are reported.
	// Default 10.
	TopKeys int
	// MaxKeys bounds the limited keys tracked per rule for the report
	// (cmd/loadtest's -tracked-keys; not the edges' -max-keys, the keys
	// their limiters keep a view of). Past it, the less limited half is
	// forgotten and the rule's report is marked Approximate. Default
	// DefaultTrackedKeys.
	MaxKeys int
	// CheckPrefix is stripped from paths before matching, as an edge in
	// decision mode does with its -check-prefix. Default the edge's,
	// httpedge.DefaultCheckPrefix.
	CheckPrefix string
	// OnDecision, when not nil, is called with each request's decision, in
	// trace order, on Offline's goroutine.
	OnDecision func(OfflineDecision)
	// Edges is how many edges of one PoP decide the trace, each with the
	// edge's own core, limiter and block cache, over one shared store in
	// simulated time. Default 1.
	Edges int
	// Spread is how requests reach the edges, as a replay spreads them
	// over its targets: ByClient keeps each client on one edge (a balancer
	// hashing the client's address, the replay's own hash); RoundRobin
	// deals every client's requests over all of them (one connection per
	// request behind ECMP or an L4 balancer). Default ByClient.
	Spread Spread
	// RTT is the round trip to the shared store: an edge's increments land
	// RTT after it sends them, and what it reads of the others' units is
	// that old (see simStore). Default 0. Token and leaky buckets and
	// sliding logs are applied at once.
	RTT time.Duration
	// MaxDefer is the edges' window.Config.MaxDefer: how long a key far
	// from its limit may keep its units unsent. Default the edge's.
	MaxDefer time.Duration
	// GuessPeers is the edges' window.Config.GuessPeers.
	GuessPeers bool
	// AsyncNearLimit is the edges' window.Config.AsyncNearLimit. Without
	// it, the round trips of decisions near the limit are answered at
	// once, with what the store holds then (the others' units less those
	// still on their way).
	AsyncNearLimit bool
	// SettleDelay is how long after a request its response is known, for
	// a request whose trace line has no duration_ms: a rule that counts by
	// response (count:) settles its units then, with the line's status
	// (kept when it counts, given back when not), as an edge does when the
	// origin answers; a line without a status never settles and keeps its
	// units, as a request whose response never came. A line with
	// duration_ms settles that long after it. Default 10ms.
	SettleDelay time.Duration
	// OnEvent, when not nil, is called with the decision event of every
	// rule that decided a request, exactly as an edge emits it (Edge 0), on
	// Offline's goroutine; the event is valid during the call. Fed to the
	// aggregator's judge, it measures the algorithm's own accuracy with no
	// distribution at all.
	OnEvent func(*event.Event)
}

// OfflineDecision is what the edge would have answered one request.
type OfflineDecision struct {
	Index int64         // the request's number, from 0, as Result.Index
	Edge  int           // the edge that decided it, from 0
	At    time.Duration // when it was decided: its offset (never before an earlier request's)
	// Status is 200 (admitted), 429 (refused) or 400 (a missing key under
	// missing_key: deny, a bad cost header, or a path origins read
	// differently: a backslash, %5C or a leading "//").
	Status int
	// Rule is the refusing rule, or for an admitted request the matching
	// rule with the least remaining (the one its RateLimit field names);
	// "" when no rule applied. For a 400 it is the rule that refused to
	// decide (a live 400 names none).
	Rule      string
	FromCache bool      // refused from the block cache
	ReleaseAt time.Time // refused: when the key is released; zero otherwise
}

// KeyReport is one of a rule's most limited keys.
type KeyReport struct {
	// Key is the key material as the rule builds it, parts joined by " | "
	// (cut to 256 bytes); a key that fell back to the client address for
	// want of its own reads "ip-fallback:ADDR".
	Key                string  `json:"key"`
	Limited            int64   `json:"limited"`
	FirstLimitedMillis float64 `json:"first_limited_ms"`           // trace offset of its first refusal
	FirstLimitedAt     string  `json:"first_limited_at,omitempty"` // RFC 3339, when times are absolute
}

// RuleReport is what one rule would have done over the trace.
type RuleReport struct {
	Rule      string `json:"rule"`
	Limit     uint64 `json:"limit"`
	Window    string `json:"window"`
	Algorithm string `json:"algorithm"`
	Action    string `json:"action"`
	Mode      string `json:"mode"`
	Shadow    bool   `json:"shadow,omitempty"`
	Kind      string `json:"kind"`
	// Counting is set for a rule that counts by response (count:): its
	// units are what the responses (the trace's statuses) counted, and
	// its TopKeys are the keys it would have stopped, with when.
	Counting bool `json:"counting,omitempty"`
	// NotSimulated says why the rule's effect is not in the figures: a
	// shed rule depends on the live upstream's load; a concurrency rule
	// needs the requests' durations, which the trace lacks.
	NotSimulated string `json:"not_simulated,omitempty"`

	Matched        int64 `json:"matched"` // requests the rule decided
	Allowed        int64 `json:"allowed"`
	Limited        int64 `json:"limited"`          // refused, or for a shadow rule would have been
	FromBlockCache int64 `json:"from_block_cache"` // of Limited, answered from the block cache
	KeysLimited    int64 `json:"keys_limited"`
	// Approximate is set when more than MaxKeys keys were limited: the
	// least limited were forgotten, so KeysLimited may count a key twice
	// and a top key's count may miss its early refusals.
	Approximate bool        `json:"approximate,omitempty"`
	TopKeys     []KeyReport `json:"top_keys"`
}

// StoreOpsByKind is a simulated PoP's store operations by kind. An
// operation is one counter or state touched: a flush that sends the units
// of ten keys is ten.
type StoreOpsByKind struct {
	// Increments send counted units: a flush's, or a decision's own on
	// the request path (a sync rule's, an async one's near its limit).
	Increments int64 `json:"increments"`
	// NearLimitSyncs is the async decisions that took a round trip
	// because the units the other edges may have admitted unseen could
	// fill the key's room (the edges' poplimit_window_near_limit_syncs_total),
	// each one of the Increments.
	NearLimitSyncs int64 `json:"near_limit_syncs"`
	Reads          int64 `json:"reads"`      // window counts read: a previous window, a new key's current one
	Decrements     int64 `json:"decrements"` // units given back: a refused sync decision's
	States         int64 `json:"states"`     // bucket and log operations
}

// total is every operation counted in k.
func (k StoreOpsByKind) total() int64 { return k.Increments + k.Reads + k.Decrements + k.States }

// OfflineReport is the result of Offline.
type OfflineReport struct {
	Requests  int64     `json:"requests"`
	BadLines  int64     `json:"bad_lines"`
	Allowed   int64     `json:"allowed"`
	Limited   int64     `json:"limited"`
	Denied    int64     `json:"denied"`    // answered 400
	Unmatched int64     `json:"unmatched"` // no rule applied
	Origin    time.Time `json:"origin"`    // the absolute time of offset 0
	Absolute  bool      `json:"absolute"`  // Origin came from the trace or the config
	SpanMs    float64   `json:"span_ms"`   // offset of the last request
	Edges     int       `json:"edges"`
	Spread    string    `json:"spread,omitempty"`
	// StoreOps is the operations the edges sent the shared store
	// (increments and reads of counters, bucket and log operations).
	StoreOps int64 `json:"store_ops"`
	// StoreOpsByKind is StoreOps by what the operations were.
	StoreOpsByKind StoreOpsByKind `json:"store_ops_by_kind"`
	Rules          []RuleReport   `json:"rules"`
	// Accuracy is the aggregator judge's report over the decisions, when
	// the caller judged them (cmd/loadtest offline -judge).
	Accuracy json.RawMessage `json:"accuracy,omitempty"`
}

// Offline runs rules over a trace with the window package's own Limiter
// and an in-memory store, in simulated time, with no server: what the edge
// would have decided, request by request, had the trace been replayed at
// speed 1 through one edge. It follows the edge's request path: the rules
// in order (the first match, or all with match: all, stopping at a
// refusal), the key recipe with its missing_key policy, cost headers, the
// block cache (a refused key is answered from memory until its release),
// and shadow rules (decided and counted, never refusing).
//
// Differences from a live edge: a request's host is the trace's (a live
// replay of a trace without hosts sends the target's address), and time
// is the trace's exactly, where a replayed request arrives a little after
// its schedule: a decision can differ when that delay carries it across a
// window edge or a release time (see the package doc).
//
// Memory is bounded by the limiter's MaxKeys, the block cache's bound and
// MaxKeys per rule, whatever the trace's length. Offline is not
// concurrent: it runs on the caller's goroutine.
func Offline(ctx context.Context, cfg OfflineConfig, trace Trace) (*OfflineReport, error) {
	if cfg.Rules == nil || len(cfg.Rules.Rules) == 0 {
		return nil, errors.New("loadtest: offline: no rules")
	}
	if cfg.FlushInterval < 0 || cfg.TopKeys < 0 || cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("loadtest: offline: FlushInterval %v, TopKeys %d, MaxKeys %d: none may be negative", cfg.FlushInterval, cfg.TopKeys, cfg.MaxKeys)
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = window.Config{}.WithDefaults().FlushInterval // the edge's
	}
	if cfg.CheckPrefix == "" {
		cfg.CheckPrefix = httpedge.DefaultCheckPrefix
	}
	if cfg.TopKeys == 0 {
		cfg.TopKeys = 10
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultTrackedKeys
	}
	if cfg.Edges == 0 {
		cfg.Edges = 1
	}
	if cfg.SettleDelay < 0 {
		return nil, fmt.Errorf("loadtest: offline: SettleDelay %v: must not be negative", cfg.SettleDelay)
	}
	if cfg.SettleDelay == 0 {
		cfg.SettleDelay = DefaultSettleDelay
	}
	if cfg.Edges < 1 || cfg.Edges > 64 || cfg.RTT < 0 || cfg.Spread > RoundRobin {
		return nil, fmt.Errorf("loadtest: offline: Edges %d (1 to 64), RTT %v (at least 0), Spread %d (ByClient or RoundRobin)",
			cfg.Edges, cfg.RTT, cfg.Spread)
	}
	sim := &offline{cfg: cfg, clock: &simClock{}}
	sim.rules = make([]ruleStats, len(cfg.Rules.Rules))
	for i := range sim.rules {
		sim.rules[i].keys = map[uint64]*keyStat{}
	}
	sim.store = newSimStore(sim.clock, int64(cfg.RTT))
	defer sim.close()
	var regs []*prometheus.Registry // each edge's metrics
	for i := range cfg.Edges {
		var o edge.Options
		o.Limiter.FlushInterval, o.Limiter.MaxDefer, o.Limiter.GuessPeers = cfg.FlushInterval, cfg.MaxDefer, cfg.GuessPeers
		o.Limiter.AsyncNearLimit = cfg.AsyncNearLimit
		if cfg.Edges > 1 {
			o.EdgeID = i + 1
		}
		blocks := &mapBlocks{m: map[uint64]int64{}, sweep: 1024}
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		st, err := edge.NewStack(o, cfg.Rules, edge.StackDeps{Store: edgeStore{sim.store, i}, Blocks: blocks, Registerer: reg,
			Events: sim, Clock: sim.clock, Phase: time.Duration(i) * cfg.FlushInterval / time.Duration(cfg.Edges),
			Observe: sim.observe, Wait: func(time.Duration) {}})
		if err != nil {
			return nil, fmt.Errorf("loadtest: offline: %w", err)
		}
		sim.edges = append(sim.edges, st)
	}
	rep := &OfflineReport{}
	originSet := !cfg.Origin.IsZero()
	origin := cfg.Origin
	if !originSet {
		origin = time.Unix(0, 0)
	}
	var last time.Duration
	var traceErr error
	for r, err := range trace {
		if err != nil {
			if isLineError(err) {
				rep.BadLines++
				continue
			}
			traceErr = err
			break
		}
		if !originSet && !r.Time.IsZero() {
			origin, originSet = r.Time.Add(-r.At), true
		}
		sim.origin = origin
		at := max(r.At, last)
		last = at
		if rep.Requests&4095 == 0 && ctx.Err() != nil {
			traceErr = fmt.Errorf("loadtest: offline: %w", ctx.Err())
			break
		}
		for c := r.count(); c > 0; c-- {
			d := sim.decide(origin, at, &r, rep.Requests)
			rep.Requests++
			switch d.Status {
			case 200:
				rep.Allowed++
			case 429:
				rep.Limited++
			default:
				rep.Denied++
			}
			if d.Rule == "" && d.Status == 200 {
				rep.Unmatched++
			}
			if cfg.OnDecision != nil {
				cfg.OnDecision(d)
			}
		}
	}
	sim.finishUntil(time.Duration(math.MaxInt64))
	sim.close()
	rep.Edges, rep.StoreOps, rep.StoreOpsByKind = cfg.Edges, sim.store.byKind.total(), sim.store.byKind
	for _, reg := range regs {
		n, err := metricsum.Sum(reg, "poplimit_window_near_limit_syncs_total")
		if err != nil {
			return nil, fmt.Errorf("loadtest: offline: %w", err)
		}
		rep.StoreOpsByKind.NearLimitSyncs += int64(n)
	}
	if cfg.Edges > 1 {
		rep.Spread = cfg.Spread.String()
	}
	rep.Origin, rep.Absolute = origin, originSet
	rep.SpanMs = float64(last) / 1e6
	for i, r := range cfg.Rules.Rules {
		rr := sim.rules[i].report(r, cfg.TopKeys, origin, originSet)
		switch {
		case r.Kind == rules.Shed:
			rr.NotSimulated = "a shed rule depends on the live upstream's load"
		case r.Kind == rules.Concurrency && !sim.durations:
			rr.NotSimulated = "a concurrency rule needs the requests' durations (duration_ms), which the trace lacks"
		}
		rep.Rules = append(rep.Rules, rr)
	}
	return rep, traceErr
}

// simClock is the simulated time, in Unix ns.
type simClock struct{ ns atomic.Int64 }

func (c *simClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// offline is the state of one Offline run: the edge's decision core over
// a limiter in simulated time, a block cache of its own and the rule
// statistics the core's observer collects.
type offline struct {
	cfg       OfflineConfig
	clock     *simClock
	edges     []*edge.Stack // the edge's own assembly of its core, on the simulated clock
	store     *simStore
	closed    bool
	req       fasthttp.Request // scratch, to read paths, queries and cookies as the edge does
	ub        []byte
	rules     []ruleStats
	at        time.Duration // the offset being decided, for the observer
	origin    time.Time     // the absolute time of offset 0
	pending   pendingHeap   // tracked and counting requests still in flight
	durations bool          // some request carried a duration
}

type ruleStats struct {
	matched, allowed, limited, fromCache, keysLimited int64
	approximate                                       bool
	keys                                              map[uint64]*keyStat
}

type keyStat struct {
	key     string
	limited int64
	first   time.Duration
}

const maxKeyDisplay = 256

func (o *offline) decide(origin time.Time, at time.Duration, r *TraceRequest, idx int64) OfflineDecision {
	now := origin.Add(at)
	t := now.UnixNano()
	o.finishUntil(at)
	o.stepUntil(t) // the edges' flushers and renewers, as of now
	o.clock.ns.Store(t)
	e := o.edgeOf(r, idx)
	core := o.edges[e].Core
	req := &o.req
	req.Reset()
	path := r.Path
	if path == "" {
		path = "/"
	}
	o.ub = append(append(o.ub[:0], "http://h"...), path...)
	req.URI().DisablePathNormalizing = false
	req.SetRequestURIBytes(o.ub)
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	if r.ContentType != "" {
		req.Header.SetContentType(r.ContentType)
	}
	method := r.Method
	if r.Body != "" && len(r.Body) <= core.BodyKeyBytes() {
		// Read by a rule keyed on a body field; a longer body streams
		// past an edge, which then falls back as missing_key says.
		req.SetBodyString(r.Body)
	}
	if method == "" {
		method = "GET"
	}
	o.durations = o.durations || r.Duration > 0
	o.at = at
	if httpedge.AmbiguousRequest(req, o.cfg.CheckPrefix, true) {
		return OfflineDecision{Index: idx, Edge: e, At: at, Status: 400} // as the live edge refuses it, before any rule
	}
	v := core.Decide(&decision.Request{Host: decision.HostOnly([]byte(r.Host)), Method: []byte(method),
		Path: httpedge.StripPrefix(req.URI().Path(), o.cfg.CheckPrefix), Addr: r.IP,
		Fields: httpedge.FastFields(req), Now: now, Tracked: r.Duration > 0})
	d := OfflineDecision{Index: idx, Edge: e, At: at, Status: v.Status()}
	if v.Quota.Rule != nil {
		d.Rule = v.Quota.Rule.Name
	}
	if v.Outcome == decision.Limited {
		d.FromCache = v.FromBlockCache
		if v.Quota.ReleaseAt > 0 {
			d.ReleaseAt = time.Unix(0, v.Quota.ReleaseAt)
		}
	}
	switch {
	case v.Counting():
		// Its response is known later: counting rules settle it then.
		delay := o.cfg.SettleDelay
		if r.Duration > 0 {
			delay = r.Duration
		}
		heap.Push(&o.pending, pendingReq{end: at + delay, v: v, edge: e, status: r.Status, settle: true})
	case v.Outcome == decision.Allowed && r.Duration > 0:
		heap.Push(&o.pending, pendingReq{end: at + r.Duration, v: v, edge: e}) // its slots are held until then
	default:
		core.Finish(v)
	}
	return d
}

// edgeOf is the edge the balancer deals request idx to.
func (o *offline) edgeOf(r *TraceRequest, idx int64) int {
	n := len(o.edges)
	if n == 1 {
		return 0
	}
	if o.cfg.Spread == RoundRobin {
		return int(idx % int64(n))
	}
	b := r.IP.As16()
	return int(xxhash.Sum64(b[:]) % uint64(n))
}

// stepUntil runs every edge's loops due by t, in time order across the
// edges, each at its own instant, as concurrent edges would.
func (o *offline) stepUntil(t int64) {
	for {
		next, which := int64(0), -1
		for i, st := range o.edges {
			if d := st.Due(t); d <= t && (which < 0 || d < next) {
				next, which = d, i
			}
		}
		if which < 0 {
			return
		}
		o.clock.ns.Store(next)
		o.edges[which].Step(context.Background(), time.Unix(0, next))
	}
}

// close stops every edge's core, once.
func (o *offline) close() {
	if o.closed {
		return
	}
	o.closed = true
	for _, st := range o.edges {
		st.Close(context.Background())
	}
}

// finishUntil completes the tracked requests that ended by at, giving
// their concurrency slots back, and settles the counting rules' requests
// whose responses were known by at, each at its own instant: with the
// trace's status, or, without one, never (their units kept).
func (o *offline) finishUntil(at time.Duration) {
	for o.pending.Len() > 0 && o.pending[0].end <= at {
		p := heap.Pop(&o.pending).(pendingReq)
		core := o.edges[p.edge].Core
		if p.settle && p.status != 0 {
			t := o.origin.Add(p.end).UnixNano()
			o.stepUntil(t)
			o.clock.ns.Store(t)
			core.Settle(p.v, p.status, nil)
		}
		core.Finish(p.v)
	}
}

// Emit takes the core's decision events: the caller's OnEvent sees each,
// exactly as an edge emits it (Edge 0).
func (o *offline) Emit(e *event.Event) bool {
	if o.cfg.OnEvent != nil {
		o.cfg.OnEvent(e)
	}
	return true
}

// observe counts one rule decision in the rule's report.
func (o *offline) observe(r *rules.Rule, key []byte, e *event.Event) {
	st := &o.rules[r.Index]
	st.matched++
	if e.Decision == event.Allowed {
		st.allowed++
		return
	}
	st.limited++
	if e.FromBlockCache {
		st.fromCache++
	}
	o.limitedKey(st, e.KeyHash, key, o.at)
}

type pendingReq struct {
	end    time.Duration
	v      *decision.Verdict
	edge   int
	status int  // the origin's answer, 0: unknown
	settle bool // counting rules reserved units: settle them at end
}

// pendingHeap orders tracked requests by their end.
type pendingHeap []pendingReq

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h pendingHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)        { *h = append(*h, x.(pendingReq)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// maxBlocks bounds the simulated block cache, as the edge's block cache
// is bounded. A block that does not fit is lost, which costs the key's next
// request a trip through the limiter, as on the edge.
const maxBlocks = 1 << 20

// mapBlocks is the simulator's block cache: exact and deterministic where
// the edge's (ristretto) admits asynchronously.
type mapBlocks struct {
	m     map[uint64]int64 // key hash → release, Unix ns
	sweep int
}

func (b *mapBlocks) Blocked(key uint64, now int64) (int64, bool) {
	rel, ok := b.m[key]
	return rel, ok && rel > now
}

// Block records a refused key until releaseAt; it never shortens a block.
func (b *mapBlocks) Block(key uint64, releaseAt, now int64) bool {
	if cur, ok := b.m[key]; ok && cur >= releaseAt {
		return true
	}
	if len(b.m) >= b.sweep {
		for k, rel := range b.m {
			if rel <= now {
				delete(b.m, k)
			}
		}
		b.sweep = max(1024, 2*len(b.m))
	}
	if len(b.m) >= maxBlocks {
		return false
	}
	b.m[key] = releaseAt
	return true
}

func (b *mapBlocks) Clear() { clear(b.m) }

func (o *offline) limitedKey(st *ruleStats, h uint64, key []byte, at time.Duration) {
	if k, ok := st.keys[h]; ok {
		k.limited++
		return
	}
	if len(st.keys) >= o.cfg.MaxKeys {
		// Forget the less limited half.
		all := make([]*keyStat, 0, len(st.keys))
		for _, k := range st.keys {
			all = append(all, k)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].limited < all[j].limited })
		cut := all[len(all)/2].limited
		for hk, k := range st.keys {
			if k.limited <= cut && len(st.keys) > o.cfg.MaxKeys/2 {
				delete(st.keys, hk)
			}
		}
		st.approximate = true
	}
	st.keysLimited++
	st.keys[h] = &keyStat{key: displayKey(key), limited: 1, first: at}
}

// displayKey renders key material for a report: a fallback key as
// "ip-fallback:<address>", any other with its unprintable bytes escaped.
func displayKey(k []byte) string {
	prefix := ""
	if rest, ok := bytes.CutPrefix(k, []byte(decision.FallbackKeyTag)); ok {
		prefix, k = "ip-fallback:", rest
	}
	s := strconv.QuoteToASCII(string(k))
	s = prefix + s[1:len(s)-1]
	if len(s) > maxKeyDisplay {
		s = s[:maxKeyDisplay] + "…"
	}
	return s
}

func (st *ruleStats) report(r *rules.Rule, top int, origin time.Time, absolute bool) RuleReport {
	rr := RuleReport{
		Rule: r.Name, Kind: r.Kind.String(), Limit: r.Limit, Window: r.Window.String(), Algorithm: r.Algorithm.String(),
		Action: r.Action.String(), Mode: r.Mode.String(), Shadow: r.Shadow, Counting: r.Count.On(),
		Matched: st.matched, Allowed: st.allowed, Limited: st.limited, FromBlockCache: st.fromCache,
		KeysLimited: st.keysLimited, Approximate: st.approximate, TopKeys: []KeyReport{},
	}
	all := make([]*keyStat, 0, len(st.keys))
	for _, k := range st.keys {
		all = append(all, k)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if a.limited != b.limited {
			return a.limited > b.limited
		}
		if a.first != b.first {
			return a.first < b.first
		}
		return a.key < b.key
	})
	for _, k := range all[:min(top, len(all))] {
		kr := KeyReport{Key: k.key, Limited: k.limited, FirstLimitedMillis: float64(k.first) / 1e6}
		if absolute {
			kr.FirstLimitedAt = origin.Add(k.first).Format(time.RFC3339Nano)
		}
		rr.TopKeys = append(rr.TopKeys, kr)
	}
	return rr
}
