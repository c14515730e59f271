package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/pipeline"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/window"
	"github.com/valyala/fasthttp"
)

// OfflineConfig configures Offline. The zero value of each field means the
// default written beside it; Rules is required.
type OfflineConfig struct {
	Rules *window.Rules
	// Origin is the absolute time of the trace's offset 0. Default: the
	// trace's own (from its first request with a Time), else the Unix
	// epoch, a multiple of every window, so that offsets that are
	// multiples of a window fall on its edges as they do in a replay with
	// ReplayConfig.Align.
	Origin time.Time
	// FlushInterval is the simulated limiter's flush interval, driven in
	// trace time. Default 5ms, the edge's.
	FlushInterval time.Duration
	// TopKeys is how many of each rule's most limited keys are reported.
	// Default 10.
	TopKeys int
	// MaxKeys bounds the limited keys tracked per rule. Past it, the less
	// limited half is forgotten and the rule's report is marked
	// Approximate. Default 100,000.
	MaxKeys int
	// CheckPrefix is stripped from paths before matching, as an edge in
	// decision mode does with its -check-prefix. Default none.
	CheckPrefix string
	// OnDecision, when not nil, is called with each request's decision, in
	// trace order, on Offline's goroutine.
	OnDecision func(OfflineDecision)
	// OnEvent, when not nil, is called with the decision event of every
	// rule that decided a request, exactly as an edge emits it (Edge 0), on
	// Offline's goroutine; the event is valid during the call. Fed to the
	// aggregator's judge, it measures the algorithm's own accuracy with no
	// distribution at all.
	OnEvent func(*pipeline.Event)
}

// OfflineDecision is what the edge would have answered one request.
type OfflineDecision struct {
	Index int64         // the request's number, from 0, as Result.Index
	At    time.Duration // when it was decided: its offset (never before an earlier request's)
	// Status is 200 (admitted), 429 (refused) or 400 (a missing key under
	// missing_key: deny, or a bad cost header).
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

// OfflineReport is the result of Offline.
type OfflineReport struct {
	Requests  int64        `json:"requests"`
	BadLines  int64        `json:"bad_lines"`
	Allowed   int64        `json:"allowed"`
	Limited   int64        `json:"limited"`
	Denied    int64        `json:"denied"`    // answered 400
	Unmatched int64        `json:"unmatched"` // no rule applied
	Origin    time.Time    `json:"origin"`    // the absolute time of offset 0
	Absolute  bool         `json:"absolute"`  // Origin came from the trace or the config
	SpanMs    float64      `json:"span_ms"`   // offset of the last request
	Rules     []RuleReport `json:"rules"`
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
		cfg.FlushInterval = 5 * time.Millisecond
	}
	if cfg.TopKeys == 0 {
		cfg.TopKeys = 10
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = 100_000
	}
	sim := &offline{cfg: cfg, clock: &simClock{}, blocks: map[uint64]int64{}, blockSweep: 1024}
	sim.rules = make([]ruleStats, len(cfg.Rules.Rules))
	for i := range sim.rules {
		sim.rules[i].keys = map[uint64]*keyStat{}
	}
	var err error
	sim.lim, err = window.New(window.Config{FlushInterval: cfg.FlushInterval, Clock: sim.clock}, window.NewMemStore(sim.clock))
	if err != nil {
		return nil, fmt.Errorf("loadtest: offline: %w", err)
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
	sim.lim.Close(context.Background())
	rep.Origin, rep.Absolute = origin, originSet
	rep.SpanMs = float64(last) / 1e6
	for i, r := range cfg.Rules.Rules {
		rep.Rules = append(rep.Rules, sim.rules[i].report(r, cfg.TopKeys, origin, originSet))
	}
	return rep, traceErr
}

// simClock is the simulated time, in Unix ns.
type simClock struct{ ns atomic.Int64 }

func (c *simClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// offline is the state of one Offline run.
type offline struct {
	cfg        OfflineConfig
	clock      *simClock
	lim        *window.Limiter
	lastFlush  int64
	blocks     map[uint64]int64 // key hash → release, Unix ns: the block cache
	blockSweep int
	req        fasthttp.Request // scratch, to read paths, queries and cookies as the edge does
	key, ub    []byte
	rules      []ruleStats
	ev         pipeline.Event // scratch for OnEvent
}

// maxBlocks bounds the simulated block cache, as the edge's
// -block-cache-entries default. A block that does not fit is lost, which
// costs the key's next request a trip through the limiter, as on the edge.
const maxBlocks = 1 << 20

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

func (o *offline) decide(origin time.Time, at time.Duration, r *Request, idx int64) OfflineDecision {
	now := origin.Add(at)
	t := now.UnixNano()
	o.clock.ns.Store(t)
	if t-o.lastFlush >= int64(o.cfg.FlushInterval) {
		o.lim.Flush(context.Background(), now)
		o.lastFlush = t
	}
	d := OfflineDecision{Index: idx, At: at, Status: 200}

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
	p := edge.StripPrefix(req.URI().Path(), o.cfg.CheckPrefix)
	method := r.Method
	if method == "" {
		method = "GET"
	}
	host := edge.HostOnly([]byte(r.Host))

	rs := o.cfg.Rules
	bestRemaining := uint64(0)
	for _, rule := range rs.Rules {
		if !rule.Matches(host, []byte(method), p) {
			continue
		}
		key, ok := edge.AppendKey(o.key[:0], req, rule, r.IP)
		if !ok {
			switch rule.MissingKey {
			case window.MissingKeySkip:
				o.key = key
				continue
			case window.MissingKeyDeny:
				o.key = key
				d.Status, d.Rule = 400, rule.Name
				return d
			}
			key = edge.AppendFallbackKey(key[:0], rule, r.IP)
		}
		o.key = key
		cost := rule.Cost
		if rule.CostHeader != "" {
			if v := req.Header.Peek(rule.CostHeader); len(v) > 0 {
				n, err := fasthttp.ParseUint(v)
				if err != nil || n < 1 || uint64(n) > rule.MaxCost {
					d.Status, d.Rule = 400, rule.Name
					return d
				}
				cost = uint64(n)
			}
		}
		st := &o.rules[rule.Index]
		st.matched++
		h := rule.Hash(key)
		limit := rs.LimitFor(rule, key)
		if rel, blocked := o.blocks[h]; blocked && rel > t {
			if rule.Action == window.Block {
				o.lim.Record(now, rule, h, cost)
			}
			o.event(t, rule, h, limit, cost, pipeline.Limited, true, window.Decision{})
			st.limited++
			st.fromCache++
			o.limitedKey(st, h, key, at)
			d.Status, d.Rule, d.FromCache, d.ReleaseAt = 429, rule.Name, true, time.Unix(0, rel)
			return d
		}
		dec := o.lim.Decide(context.Background(), now, rule, h, limit, cost)
		verdict := pipeline.Limited
		if dec.Allowed {
			verdict = pipeline.Allowed
		}
		o.event(t, rule, h, limit, cost, verdict, false, dec)
		switch {
		case dec.Allowed:
			st.allowed++
		case rule.Shadow:
			st.limited++
			o.limitedKey(st, h, key, at)
		default:
			st.limited++
			o.limitedKey(st, h, key, at)
			if dec.Fallback == window.FallbackNone && dec.ReleaseAt > t {
				o.block(h, dec.ReleaseAt, t)
			}
			d.Status, d.Rule = 429, rule.Name
			if dec.ReleaseAt > 0 {
				d.ReleaseAt = time.Unix(0, dec.ReleaseAt)
			}
			return d
		}
		if d.Rule == "" || dec.Remaining < bestRemaining {
			d.Rule, bestRemaining = rule.Name, dec.Remaining
		}
		if !rs.MatchAll {
			break
		}
	}
	return d
}

// event hands one rule's decision to OnEvent, shaped as the edge's.
func (o *offline) event(t int64, r *window.Rule, h, limit, cost uint64, d pipeline.Decision, fromCache bool, dec window.Decision) {
	if o.cfg.OnEvent == nil {
		return
	}
	o.ev = pipeline.Event{Time: t, KeyHash: h, Rule: r.NameBytes(), Cost: uint32(cost), Limit: uint32(limit),
		WindowMillis: uint32(r.Window / time.Millisecond), Estimate: float32(dec.Estimate),
		Decision: d, Mode: pipeline.Mode(r.Mode), Action: pipeline.Action(r.Action),
		FromBlockCache: fromCache, Shadow: r.Shadow, Fallback: dec.Fallback != window.FallbackNone}
	o.cfg.OnEvent(&o.ev)
}

// block records a refused key until releaseAt; it never shortens a block.
func (o *offline) block(h uint64, releaseAt, now int64) {
	if cur, ok := o.blocks[h]; ok && cur >= releaseAt {
		return
	}
	if len(o.blocks) >= o.blockSweep {
		for k, rel := range o.blocks {
			if rel <= now {
				delete(o.blocks, k)
			}
		}
		o.blockSweep = max(1024, 2*len(o.blocks))
	}
	if len(o.blocks) >= maxBlocks {
		return
	}
	o.blocks[h] = releaseAt
}

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
	if rest, ok := bytes.CutPrefix(k, []byte(edge.FallbackKeyTag)); ok {
		prefix, k = "ip-fallback:", rest
	}
	s := strconv.QuoteToASCII(string(k))
	s = prefix + s[1:len(s)-1]
	if len(s) > maxKeyDisplay {
		s = s[:maxKeyDisplay] + "…"
	}
	return s
}

func (st *ruleStats) report(r *window.Rule, top int, origin time.Time, absolute bool) RuleReport {
	rr := RuleReport{
		Rule: r.Name, Limit: r.Limit, Window: r.Window.String(), Algorithm: r.Algorithm.String(),
		Action: r.Action.String(), Mode: r.Mode.String(), Shadow: r.Shadow,
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
