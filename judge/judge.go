package judge

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus"
)

// Class is how a decision is reported: enforced decisions make the accuracy
// figures, shadow and fallback decisions are tallied apart.
type Class uint8

const (
	Enforced Class = iota // decided by the counts and enforced
	Shadow                // decided by the counts, logged only (the rule is in shadow mode)
	Fallback              // decided by the rule's failure policy (store unavailable)
	numClasses
)

func (c Class) String() string {
	switch c {
	case Enforced:
		return "enforced"
	case Shadow:
		return "shadow"
	case Fallback:
		return "fallback"
	}
	return "unknown"
}

// Source is where an edge's decision came from.
type Source uint8

const (
	FromLimiter    Source = iota // the limiter's counts
	FromBlockCache               // the block cache, without counts
	numSources
)

func (s Source) String() string {
	switch s {
	case FromLimiter:
		return "limiter"
	case FromBlockCache:
		return "block_cache"
	}
	return "unknown"
}

// Reasons an event is late.
const (
	lateOutOfOrder = iota // its key has judged a later event
	lateForgotten         // its key has no state, and it is older than an expired state covered
	numLateReasons
)

var lateReasonNames = [numLateReasons]string{"out_of_order", "forgotten"}

// Reasons an event is invalid.
const (
	invalidParameters = iota // Limit or WindowMillis 0, or a bucket's B × W out of range
	invalidFuture            // more than AllowedLateness + MaxClockSkew after now
	invalidPast              // more than MaxEventAge before now
	numInvalidReasons
)

var invalidReasonNames = [numInvalidReasons]string{"parameters", "future", "past"}

// Reasons a key's state is removed.
const (
	evictIdle       = iota // two windows without an event: nothing lost
	evictMaxKeys           // the key table was full
	evictMaxEntries        // the logs' ring slots were at their bound
	numEvictReasons
)

var evictReasonNames = [numEvictReasons]string{"idle", "max_keys", "max_log_entries"}

// Bucket upper bounds. Overshoot is exact/limit of a wrongly allowed
// decision (> 1); the relative error is |estimate − exact|/exact.
var (
	overshootBounds = [...]float64{1.05, 1.1, 1.15, 1.25, 1.5, 2, 4}
	relErrBounds    = [...]float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5}
)

const otherLabel = "_other" // rule and edge label past MaxRules / MaxEdges

// cell is one combination of the breakdown dimensions.
type cell struct {
	rule   uint32
	edge   int32 // edge id, -1 for "_other"
	mode   policy.Mode
	source Source
	class  Class
	alg    uint8  // policy.Algorithm
	pop    uint16 // index into Judge.popNames
	global bool   // the rule's scope is global
}

// counts are a cell's tallies.
type counts struct {
	allowed, limited               int64
	wronglyAllowed, wronglyLimited int64
}

// ruleStats are a rule's distributions: overshoot of enforced wrongly
// allowed decisions and relative error of estimates.
type ruleStats struct {
	overshoot    [len(overshootBounds) + 1]int64
	overshootSum float64
	relErr       [len(relErrBounds) + 1]int64
	relErrSum    float64
}

type lateCell struct {
	edge   int32
	reason uint8
}

// Judge judges decision events against the exact truth of each event's
// algorithm. See the package doc for the semantics. It is safe for
// concurrent use.
type Judge struct {
	cfg      Config
	lateness int64 // ns
	hold     int64 // ns
	settle   int64 // ns a counting rule's events wait beyond the lateness: SettleLateness
	res      int64 // ns
	ahead    int64 // ns an event may be after now: lateness + MaxClockSkew; 0: unbounded
	maxAge   int64 // ns an event may be before now: MaxEventAge; 0: unbounded

	// mu protects the fields below.
	mu        sync.Mutex
	buf       buffer
	seq       uint64
	maxSeen   int64 // latest event time seen, Unix ns (valid when seen)
	seen      bool
	frontier  int64 // latest event time judged
	forgotten int64 // a stateless key's event before this is late

	rules     map[string]uint32
	ruleNames []string
	edges     map[uint16]struct{} // edges with a label of their own
	pops      map[string]uint32   // PoP name → index into popNames
	popNames  []string            // "" for events of no PoP; "_other" past MaxEdges
	keys      keyTable

	cells     map[cell]*counts
	perRule   []ruleStats // by rule index
	late      map[lateCell]int64
	evicted   [numEvictReasons]int64
	events    int64
	invalid   [numInvalidReasons]int64
	dups      dedup
	lateTotal int64
	overflows int64
	fn, fp    wrongKeys
}

// New validates cfg and returns an empty Judge whose metrics (see the
// package's Collector) are registered with reg, or with nothing if reg is
// nil.
func New(cfg Config, reg prometheus.Registerer) (*Judge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	j := &Judge{
		cfg:      cfg,
		lateness: int64(cfg.AllowedLateness),
		hold:     int64(cfg.Hold),
		settle:   int64(cfg.SettleLateness),
		res:      int64(cfg.Resolution),
		maxAge:   int64(cfg.MaxEventAge),
		rules:    make(map[string]uint32),
		edges:    make(map[uint16]struct{}),
		pops:     make(map[string]uint32),
		keys:     newKeyTable(cfg.MaxKeys),
		buf:      buffer{most: cfg.MaxBuffered + 1},
		cells:    make(map[cell]*counts),
		late:     make(map[lateCell]int64),
		fn:       newWrongKeys(cfg.MaxWrongKeys, true),
		fp:       newWrongKeys(cfg.MaxWrongKeys, false),
		dups:     newDedup(cfg.Dedup),
	}
	j.forgotten = math.MinInt64
	if cfg.MaxClockSkew > 0 {
		j.ahead = addSat(int64(cfg.AllowedLateness), int64(cfg.MaxClockSkew))
	}
	if reg != nil {
		if err := reg.Register(&collector{j: j}); err != nil {
			return nil, fmt.Errorf("judge: register metrics: %w", err)
		}
	}
	return j, nil
}

// Add takes events in arrival order, arrived at now (Unix ns, the
// caller's clock: events wait Config.Hold after it, and events too far
// after or before it are invalid, see Config.MaxClockSkew and
// Config.MaxEventAge), buffers them and judges those the watermark has
// passed and that have been held long enough. It copies what it keeps
// (an event's Rule may alias the caller's buffer). Without
// new rules, edges, keys or wrong keys, and once the buffer and the logs
// have grown to the traffic, it allocates nothing.
func (j *Judge) Add(now int64, events ...event.Event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range events {
		j.add(now, &events[i])
	}
}

// Advance judges the buffered events that the watermark has passed and
// that arrived at least Config.Hold before now (Unix ns, the clock Add was
// given). With a hold, call it periodically (every Hold/2, say): events
// held back when they arrived are otherwise judged only when more arrive.
func (j *Judge) Advance(now int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.release(now)
}

// Flush judges every buffered event, in time order, as if the watermark had
// reached the latest event time seen. Events that arrive later and older
// than what it judged are late. The aggregator calls it when the stream has
// been quiet and when it stops.
func (j *Judge) Flush() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.buf.len() > 0 {
		p := j.buf.pop()
		j.judge(&p)
	}
}

// FlushSettled judges, in time order, the buffered events as Flush does,
// but stops at the first event of a rule that counts by response whose
// time is not yet Config.SettleLateness before now (Unix ns, the clock Add
// was given): the events of its key's admitted requests may still be on
// their way, sent when those requests settle. The aggregator calls it
// when the stream has been quiet; call it again later for the rest.
func (j *Judge) FlushSettled(now int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.buf.len() > 0 {
		m := j.buf.min()
		if m.flags&fCounting != 0 && m.t > now {
			return
		}
		p := j.buf.pop()
		j.judge(&p)
	}
}

// Buffered returns the number of events waiting for the watermark.
func (j *Judge) Buffered() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.buf.len()
}

func (j *Judge) add(now int64, e *event.Event) {
	// A framed event's copies are its frame's, which the consumer drops.
	if !e.Framed && j.dups.seen(e) {
		return
	}
	j.events++
	if e.Limit == 0 || e.WindowMillis == 0 {
		j.invalid[invalidParameters]++
		return
	}
	if refOf(uint8(e.Algorithm)) == refBucket {
		burst := e.Burst
		if burst == 0 {
			burst = e.Limit
		}
		if _, ok := bucketDrain(e.Limit, burst, int64(e.WindowMillis)*int64(time.Millisecond)); !ok {
			j.invalid[invalidParameters]++
			return
		}
	}
	// Times no clock in sync with now could have stamped: kept out of the
	// watermark, the keys' state and the figures.
	if j.ahead > 0 && e.Time > addSat(now, j.ahead) {
		j.invalid[invalidFuture]++
		return
	}
	if j.maxAge > 0 && e.Time < addSat(now, -j.maxAge) {
		j.invalid[invalidPast]++
		return
	}
	decided := e.Time - mod(e.Time, j.res)
	t := decided
	if e.Delayed && e.Decision == event.Allowed && e.DelayMicros > 0 {
		// Judged where it went through: at its served time.
		at := e.Time + int64(e.DelayMicros)*int64(time.Microsecond)
		if at < e.Time {
			at = math.MaxInt64
		}
		t = at - mod(at, j.res)
	}
	var counted uint32
	if e.Counting {
		// Released, ordered and expired SettleLateness later than the
		// others: its key's admitted requests are sent when they settle.
		t, counted = addSat(t, j.settle), min(e.Counted, e.Cost)
	}
	j.seq++
	seq := j.seq
	if e.Counting && e.Decision == event.Limited {
		// Within a tick, a counting rule's refusals come after its
		// admissions: a refusal is sent at once, the admission that
		// reserved the units it was refused for only when it settles,
		// so arrival order would put them the wrong way round.
		seq |= 1 << 63
	}
	j.buf.push(pending{
		t: t, seq: seq, arrived: now, hash: e.KeyHash, rule: j.ruleIndex(e.Rule), pop: j.popIndex(e.Pop),
		cost: e.Cost, limit: e.Limit, windowMs: e.WindowMillis, burst: e.Burst, counted: counted,
		estimate: e.Estimate, edge: e.Edge, flags: flagsOf(e), alg: uint8(e.Algorithm),
	})
	// The watermark follows decision times: a delay does not make the
	// other events late.
	if !j.seen || decided > j.maxSeen {
		j.maxSeen, j.seen = decided, true
	}
	j.release(now)
	for j.buf.len() > j.cfg.MaxBuffered {
		p := j.buf.pop()
		j.overflows++
		j.judge(&p)
	}
}

// release judges, in time order, the buffered events that the watermark has
// passed and that arrived at least the hold before now. An earliest event
// still held keeps the later ones waiting too, so that order is kept.
func (j *Judge) release(now int64) {
	wm := j.maxSeen - j.lateness
	for j.buf.len() > 0 {
		m := j.buf.min()
		if m.t > wm || j.hold > 0 && now-m.arrived < j.hold {
			return
		}
		p := j.buf.pop()
		j.judge(&p)
	}
}

// addSat is a + b, saturated to the int64 range.
func addSat(a, b int64) int64 {
	s := a + b
	if (s > a) != (b > 0) {
		if b > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return s
}

// mod is x mod m in [0, m).
func mod(x, m int64) int64 {
	r := x % m
	if r < 0 {
		r += m
	}
	return r
}

// ruleIndex interns a rule name (see intern). Past MaxRules, new names
// share the "_other" index.
func (j *Judge) ruleIndex(b []byte) uint32 {
	i, added := intern(b, j.rules, &j.ruleNames, j.cfg.MaxRules)
	if added {
		j.perRule = append(j.perRule, ruleStats{})
	}
	return i
}

// popIndex interns a PoP's name (see intern). PoPs share MaxEdges with the
// edges (a PoP has at least one): past it, new names share "_other".
func (j *Judge) popIndex(b []byte) uint16 {
	i, _ := intern(b, j.pops, &j.popNames, min(j.cfg.MaxEdges, allPops-1)) // allPops is no PoP's index
	return uint16(i)
}

// intern returns the index of name b in names, adding it if new (added).
// The lookup by string(b) does not allocate; a new name is copied. Past
// most names, a new name shares the "_other" index. A name that is not
// UTF-8 keeps an index of its own but is reported with its invalid bytes
// replaced by U+FFFD (metric label values must be UTF-8), so two names
// may read alike: the report and the metrics add their rows up by name.
func intern(b []byte, index map[string]uint32, names *[]string, most int) (i uint32, added bool) {
	if i, ok := index[string(b)]; ok {
		return i, false
	}
	name := string(b)
	if len(*names) >= most {
		name = otherLabel
		if i, ok := index[name]; ok {
			return i, false
		}
	}
	i = uint32(len(*names))
	index[name] = i
	*names = append(*names, strings.ToValidUTF8(name, "\uFFFD"))
	return i, true
}

// scopeName is the label of a cell's scope.
func scopeName(global bool) string {
	if global {
		return "global"
	}
	return "pop"
}

// edgeLabel returns the edge's label index: its id, or -1 past MaxEdges.
func (j *Judge) edgeLabel(edge uint16) int32 {
	if _, ok := j.edges[edge]; ok {
		return int32(edge)
	}
	if len(j.edges) >= j.cfg.MaxEdges {
		return -1
	}
	j.edges[edge] = struct{}{}
	return int32(edge)
}

// judge applies one released event to its key and, unless it is late,
// judges it against the reference of its algorithm.
func (j *Judge) judge(p *pending) {
	if p.t > j.frontier {
		j.frontier = p.t
	}
	id := keyID{p.hash, p.rule, p.pop}
	if p.flags&fGlobal != 0 {
		id.pop = allPops
	}
	w := int64(p.windowMs) * int64(time.Millisecond)
	kind := refOf(p.alg)
	sp := w
	if kind == refBucket {
		sp = span(p, kind, w)
	}
	i, ok := j.keys.index[id]
	late := -1
	switch {
	case ok && p.t < j.keys.slab[i].last:
		late = lateOutOfOrder
	case !ok && p.t < j.forgotten:
		late = lateForgotten
	}
	if !ok {
		for j.keys.len() >= j.cfg.MaxKeys {
			j.evict(j.keys.oldest(-1), evictMaxKeys)
		}
		i = j.keys.add(id, kind, sp, p.t)
	}
	st := &j.keys.slab[i]
	if st.kind != kind {
		j.keys.reset(i, kind)
	}
	c := int64(p.cost)
	// t is the time the references see: a counting event's own, its
	// release time (p.t, which orders and expires its key) less the shift.
	t, counting := p.t, p.flags&fCounting != 0
	if counting {
		t -= j.settle
	}

	if late >= 0 {
		// Log the units at the latest instant the key has seen and judge
		// nothing.
		at := max(p.t, st.last)
		if counting {
			addLateCounted(st, kind, p, at-j.settle, w)
		} else {
			addLate(st, kind, p, at, c, w)
		}
		j.keys.account(i)
		j.lateTotal++
		j.late[lateCell{j.edgeLabel(p.edge), uint8(late)}]++
		j.bound(i)
		return
	}

	var v verdict
	switch {
	case counting:
		v = judgeCounted(st, kind, p, t, c, w)
	case kind == refBucket:
		v = judgeBucket(st, p, t, c, w)
	case kind == refFixed:
		v = judgeFixed(st, p, t, c, w)
	default:
		v = judgeLog(st, p, t, c, w)
	}
	j.keys.touch(i, sp, p.t)
	j.keys.account(i)
	j.tally(p, id, &v)
	j.expire(i)
	j.bound(i)
}

// tally records one judged decision.
func (j *Judge) tally(p *pending, id keyID, v *verdict) {
	class := Enforced
	switch {
	case p.flags&fFallback != 0:
		class = Fallback
	case p.flags&fShadow != 0:
		class = Shadow
	}
	source := FromLimiter
	if p.flags&fCache != 0 {
		source = FromBlockCache
	}
	mode := policy.Async
	if p.flags&fSync != 0 {
		mode = policy.Sync
	}
	k := cell{rule: p.rule, edge: j.edgeLabel(p.edge), mode: mode, source: source, class: class, alg: p.alg,
		pop: p.pop, global: p.flags&fGlobal != 0}
	cs := j.cells[k]
	if cs == nil {
		cs = new(counts)
		j.cells[k] = cs
	}
	if p.flags&fLimited != 0 {
		cs.limited++
	} else {
		cs.allowed++
	}
	if v.wrongAllowed {
		cs.wronglyAllowed++
	}
	if v.wrongLimited {
		cs.wronglyLimited++
	}
	if class == Fallback {
		return
	}
	rs := &j.perRule[p.rule]
	if class == Enforced {
		switch {
		case v.wrongAllowed:
			ratio := v.exact / v.bound
			rs.overshoot[bucket(overshootBounds[:], ratio)]++
			rs.overshootSum += ratio
			j.fn.note(id, p.limit, ratio)
		case v.wrongLimited:
			j.fp.note(id, p.limit, v.exact/v.bound)
		}
	}
	if source == FromLimiter && v.prior > 0 {
		e := math.Abs(float64(p.estimate)-v.prior) / v.prior
		rs.relErr[bucket(relErrBounds[:], e)]++
		rs.relErrSum += e
	}
}

// bucket returns the index of the first bound ≥ v, len(bounds) past them.
func bucket(bounds []float64, v float64) int {
	for i, b := range bounds {
		if v <= b {
			return i
		}
	}
	return len(bounds)
}

// expire removes the keys whose last event is two of their spans (their
// window, or a bucket's drain time when longer) behind the latest judged
// time, except key keep.
func (j *Judge) expire(keep int32) {
	kt := &j.keys
	for l := range kt.lists {
		w := kt.lists[l].window
		for {
			i := kt.lists[l].head
			if i < 0 || i == keep || kt.slab[i].last > j.frontier-2*w {
				break
			}
			if h := kt.slab[i].last + w; h > j.forgotten {
				j.forgotten = h
			}
			j.evict(i, evictIdle)
		}
	}
}

// bound evicts the least recently active keys while the logs' rings have
// room for more than MaxLogEntries entries, sparing key keep.
func (j *Judge) bound(keep int32) {
	for j.keys.slots > j.cfg.MaxLogEntries {
		i := j.keys.oldest(keep)
		if i < 0 {
			return
		}
		j.evict(i, evictMaxEntries)
	}
}

func (j *Judge) evict(i int32, reason int) {
	j.keys.remove(i)
	j.evicted[reason]++
}
