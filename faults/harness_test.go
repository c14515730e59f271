package faults

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/rules"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
)

// full reports whether the full versions run (POPLIMIT_FULL=1).
func full() bool { return os.Getenv("POPLIMIT_FULL") == "1" }

// pick returns short in the normal suite and long in the full version.
func pick[T any](short, long T) T {
	if full() {
		return long
	}
	return short
}

// loopback is whose X-Forwarded-For the edges believe: the replayer's.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// edgeSpec describes an in-process edge. The zero value of each field is
// cmd/edge's default.
type edgeSpec struct {
	id      int
	rules   string
	servers []shardproxy.Server // empty: an in-memory store of its own
	// Store settings, as cmd/edge sets them (flags) or shardproxy defaults.
	storeTimeout time.Duration // default 100ms
	flush        time.Duration // default 5ms
	retryTimeout time.Duration // default 5s (shardproxy's, not a flag)
	maxKeys      int
	skew         time.Duration
	cfg          httpedge.Config // TrustedProxies default loopback, RetryJitter 1ns
	events       decision.Emitter
	reg          *prometheus.Registry // default a new one
}

// inEdge is an edge built in-process by the one test harness (edgetest),
// as cmd/edge builds it.
type inEdge struct {
	*edge.Edge
	srv    *httpedge.Server
	lim    *window.Limiter
	mc     *shardproxy.Client // nil with an in-memory store
	blocks *blockcache.Cache
	reg    edge.Registry
	rules  *rules.Rules
}

// newEdge builds an edge as cmd/edge does, without listening; it is stopped
// at cleanup (stop is idempotent).
func newEdge(t testing.TB, s edgeSpec) *inEdge {
	t.Helper()
	o := edge.Options{Server: s.cfg, Events: s.events, ClockSkew: s.skew, Logger: discardLogger}
	if s.reg != nil {
		o.Registry = s.reg
	}
	o.EdgeID = s.id
	if o.Server.TrustedProxies == nil {
		o.Server.TrustedProxies = loopback
	}
	o.Limiter.FlushInterval, o.Limiter.StoreTimeout, o.Limiter.MaxKeys = s.flush, s.storeTimeout, s.maxKeys
	o.Memcache.Servers, o.Memcache.RetryTimeout = s.servers, s.retryTimeout
	o.BlockCache.MaxEntries = 1 << 16
	e := edgetest.New(t, s.rules, o)
	return &inEdge{Edge: e, srv: e.Server, lim: e.Limiter, mc: e.Memcache(), blocks: e.Blocks, reg: e.Registry, rules: e.Rules()}
}

// stop shuts the edge down as SIGTERM does: it stops serving, flushes its
// pending increments, and closes the store client and the block cache.
func (e *inEdge) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.Close(ctx)
}

// front is a listener whose requests go to whichever edge is current, so an
// edge can be replaced under load without closing the clients' connections,
// as a rolling restart behind a load balancer looks to its clients.
//
// It also times the edge's handler, the service time of each request on
// the server, which a client on this shared machine cannot see apart from
// its own scheduling delays.
type front struct {
	addr string
	cur  atomic.Pointer[inEdge]
	srv  *fasthttp.Server

	mu      sync.Mutex
	handled []handled
}

// handled is one request as the front saw it.
type handled struct {
	path  string
	start time.Time
	took  time.Duration
}

// serve starts a front for e on a free loopback port, stopped at cleanup.
func serve(t testing.TB, e *inEdge) *front {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{addr: ln.Addr().String()}
	f.cur.Store(e)
	f.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			start := time.Now()
			f.cur.Load().srv.Handler()(ctx)
			h := handled{path: string(ctx.Path()), start: start, took: time.Since(start)}
			f.mu.Lock()
			f.handled = append(f.handled, h)
			f.mu.Unlock()
		},
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           60 * time.Second,
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
	}
	go f.srv.Serve(ln)
	t.Cleanup(func() {
		f.srv.Shutdown()
		f.cur.Load().stop()
	})
	return f
}

// served returns the requests handled so far.
func (f *front) served() []handled {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.handled)
}

// swap makes next the current edge and stops the previous one (its last
// flush included), as an edge restarted with a new configuration.
func (f *front) swap(next *inEdge) {
	f.cur.Swap(next).stop()
}

var discardLogger = newDiscardLogger()

// shardsNamed returns servers for addrs named shard-0, shard-1, …: two edges
// that reach the same shards through different addresses (relays) build the
// same ring from the names.
func shardsNamed(addrs ...string) []shardproxy.Server {
	out := make([]shardproxy.Server, len(addrs))
	for i, a := range addrs {
		out[i] = shardproxy.Server{Addr: a, Name: fmt.Sprintf("shard-%d", i)}
	}
	return out
}

// placement places keys on servers as every edge does (ketama, fnv1a_64,
// hash tag "{}").
type placement struct{ ring *shardproxy.Ring }

func placementOf(t testing.TB, servers []shardproxy.Server) placement {
	t.Helper()
	ring, err := shardproxy.NewRing(servers, shardproxy.HashFNV1a64, "{}")
	if err != nil {
		t.Fatal(err)
	}
	return placement{ring}
}

// home returns the index of the shard that holds key's counters.
func (p placement) home(key uint64) int {
	var b [shardproxy.MaxCounterKeyLen]byte
	return p.ring.Lookup(shardproxy.AppendCounterKey(b[:0], key, 0))
}

// homeShard returns the index of the shard that holds key's counters.
func homeShard(t testing.TB, servers []shardproxy.Server, key uint64) int {
	t.Helper()
	return placementOf(t, servers).home(key)
}

// recorder is an decision.Emitter that keeps every decision event with the true
// time it was made, and passes it on to next, if set. Safe for concurrent
// use once skews is set.
type recorder struct {
	next decision.Emitter
	// skews are the clock skews of the edges, by edge id: an event's time
	// is its edge's clock, which is the true time plus the skew.
	skews map[uint16]time.Duration
	mu    sync.Mutex
	recs  []rec
}

// rec is one decision: the edge's event, and the true wall-clock time (Unix
// ns) at which the edge decided, which its own clock may not agree with.
type rec struct {
	ev pipeline.Event
	at int64
}

func (r *recorder) Emit(e *pipeline.Event) bool {
	at := e.Time - int64(r.skews[e.Edge])
	r.mu.Lock()
	r.recs = append(r.recs, rec{ev: *e, at: at})
	r.mu.Unlock()
	if r.next != nil {
		return r.next.Emit(e)
	}
	return true
}

// snapshot returns the decisions recorded so far, in true-time order.
func (r *recorder) snapshot() []rec {
	r.mu.Lock()
	out := slices.Clone(r.recs)
	r.mu.Unlock()
	sortByAt(out)
	return out
}

// sortByAt sorts recs by time, keeping the order of equal times.
func sortByAt(recs []rec) {
	slices.SortStableFunc(recs, func(a, b rec) int { return cmpInt(a.at, b.at) })
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// verdict is what the exact sliding window says of one decision.
type verdict struct {
	overAdmitted   bool    // allowed, and admitting it made the exact admitted count in (t−W, t] exceed the limit
	wronglyLimited bool    // refused while the client had sent no more than the limit in (t−W, t], this one included
	overshoot      float64 // of an over-admitted decision: the exact count it made, over the limit (> 1)
}

// exact judges throttle decisions in recs (in true-time order) against the
// exact sliding window, by the rules of package judge (times floored to its
// 1 ms resolution), using the true times. Shadow decisions and block rules
// are left unjudged. It gives the same totals as the judge and, unlike it,
// a verdict per decision, to split them by client and phase.
func exact(recs []rec) []verdict {
	type unit struct {
		at   int64
		cost uint64
	}
	type state struct {
		admitted, attempted   []unit
		admittedN, attemptedN uint64
	}
	type keyID struct {
		rule string
		key  uint64
	}
	states := map[keyID]*state{}
	out := make([]verdict, len(recs))
	for i := range recs {
		e := &recs[i].ev
		if e.Shadow || e.Action != pipeline.ActionThrottle || e.Limit == 0 || e.WindowMillis == 0 {
			continue
		}
		id := keyID{string(e.Rule), e.KeyHash}
		s := states[id]
		if s == nil {
			s = &state{}
			states[id] = s
		}
		t := recs[i].at - recs[i].at%int64(time.Millisecond) // the judge's resolution
		from := t - int64(e.WindowMillis)*int64(time.Millisecond)
		for len(s.admitted) > 0 && s.admitted[0].at <= from {
			s.admittedN -= s.admitted[0].cost
			s.admitted = s.admitted[1:]
		}
		for len(s.attempted) > 0 && s.attempted[0].at <= from {
			s.attemptedN -= s.attempted[0].cost
			s.attempted = s.attempted[1:]
		}
		c := uint64(e.Cost)
		if e.Decision == pipeline.Allowed {
			out[i].overAdmitted = s.admittedN+c > uint64(e.Limit)
			if out[i].overAdmitted {
				out[i].overshoot = float64(s.admittedN+c) / float64(e.Limit)
			}
			s.admitted = append(s.admitted, unit{t, c})
			s.admittedN += c
		} else {
			out[i].wronglyLimited = s.attemptedN+c <= uint64(e.Limit)
		}
		s.attempted = append(s.attempted, unit{t, c})
		s.attemptedN += c
	}
	return out
}

// tally counts decisions and what the exact window says of them.
type tally struct {
	Decisions, Allowed, Limited  int
	OverAdmitted, WronglyLimited int
	Fallback, FromBlockCache     int
	MaxOvershoot                 float64 // the largest exact count an over-admission made, over the limit
}

func (t *tally) add(r *rec, v verdict) {
	t.Decisions++
	if r.ev.Decision == pipeline.Allowed {
		t.Allowed++
	} else {
		t.Limited++
	}
	if v.overAdmitted {
		t.OverAdmitted++
		t.MaxOvershoot = max(t.MaxOvershoot, v.overshoot)
	}
	if v.wronglyLimited {
		t.WronglyLimited++
	}
	if r.ev.Fallback {
		t.Fallback++
	}
	if r.ev.FromBlockCache {
		t.FromBlockCache++
	}
}

func (t tally) String() string {
	return fmt.Sprintf("%d decisions: %d allowed, %d limited; %d admitted beyond the limit (%.2f%%, worst %.2f× the limit), %d refused within it; %d fallbacks",
		t.Decisions, t.Allowed, t.Limited, t.OverAdmitted, pct(t.OverAdmitted, t.Decisions), t.MaxOvershoot, t.WronglyLimited, t.Fallback)
}

// worse reports whether k of n decisions admitted beyond the limit is a
// worse share than k0 of n0 by more than margin percentage points plus
// three standard errors of the difference of the two shares. A phase of a
// few hundred decisions moves that share by several points by chance
// alone (0.08 of 135 and of 300: 2.8 points of standard error), so a fixed
// margin would fail now and then with nothing wrong.
func worse(k, n, k0, n0 int, margin float64) bool {
	p, p0 := pct(k, n), pct(k0, n0)
	se := 0.0
	if n > 0 && n0 > 0 {
		se = math.Sqrt(p*(100-p)/float64(n) + p0*(100-p0)/float64(n0))
	}
	return p > p0+margin+3*se
}

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// judgeReport runs the aggregator's judge over recs, with their true times
// as event times, and returns its report after judging everything.
func judgeReport(t testing.TB, recs []rec) judge.Report {
	t.Helper()
	cfg := judge.DefaultConfig()
	cfg.Hold = 0
	j, err := judge.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := make([]pipeline.Event, 0, 1024)
	for i := range recs {
		e := recs[i].ev
		e.Time = recs[i].at
		batch = append(batch, e)
		if len(batch) == cap(batch) {
			j.Add(e.Time, batch...)
			batch = batch[:0]
		}
	}
	j.Add(time.Now().UnixNano(), batch...)
	j.Flush()
	return j.Report()
}

// checkAgainstJudge fails t unless the exact evaluator and the judge agree
// on the enforced totals of recs (fallbacks are tallied apart by the judge).
// phaseOf returns the phase of an event at time at (Unix ns): p for an
// event from bounds[p] on, the last phase running on past its end bound;
// -1 before bounds[0].
func phaseOf(bounds []time.Time, at int64) int {
	for p := len(bounds) - 2; p >= 0; p-- {
		if at >= bounds[p].UnixNano() {
			return p
		}
	}
	return -1
}

// judged returns the recorded decisions in time order with their exact
// verdicts, once it has checked that the aggregator's judge agrees.
func judged(t testing.TB, r *recorder) ([]rec, []verdict, judge.Report) {
	t.Helper()
	recs := r.snapshot()
	vs := exact(recs)
	return recs, vs, checkAgainstJudge(t, recs, vs)
}

func checkAgainstJudge(t testing.TB, recs []rec, vs []verdict) judge.Report {
	t.Helper()
	r := judgeReport(t, recs)
	var enf tally
	for i := range recs {
		if !recs[i].ev.Fallback && !recs[i].ev.Shadow {
			enf.add(&recs[i], vs[i])
		}
	}
	if r.Enforced.WronglyAllowed != int64(enf.OverAdmitted) || r.Enforced.WronglyLimited != int64(enf.WronglyLimited) ||
		r.Enforced.Decisions != int64(enf.Decisions) {
		t.Errorf("the judge and the exact evaluator disagree: judge %d decisions, %d wrongly allowed, %d wrongly limited; exact %d, %d, %d",
			r.Enforced.Decisions, r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited, enf.Decisions, enf.OverAdmitted, enf.WronglyLimited)
	}
	return r
}

// client is one client of a generated trace.
type client struct {
	ip   netip.Addr
	path string
	rate float64 // requests per second
}

// ruleKey returns the rule a client of the async/sync tests sends to
// ("sync" on path /s, else "async") and its key under that rule in rs.
func (c client) ruleKey(rs *rules.Rules) (rule string, key uint64) {
	rule = "async"
	if c.path == "/s" {
		rule = "sync"
	}
	return rule, rs.Lookup(rule).Hash(c.ip.AppendTo(nil))
}

// clientIP returns the i-th client address of a test (10.x.y.z).
func clientIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// steady returns a trace in which every client sends at its rate, evenly
// spaced with ±20 % jitter from a random phase, for d; and the client index
// of each request, by its index in the replay (each request has Count 1).
func steady(clients []client, d time.Duration, seed uint64) ([]loadtest.Request, []int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	type item struct {
		r loadtest.Request
		c int
	}
	var items []item
	for ci, c := range clients {
		gap := float64(time.Second) / c.rate
		at := rng.Float64() * gap
		for at < float64(d) {
			items = append(items, item{loadtest.Request{At: time.Duration(at), IP: c.ip, Path: c.path}, ci})
			at += gap * (0.8 + 0.4*rng.Float64())
		}
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].r.At < items[j].r.At })
	reqs := make([]loadtest.Request, len(items))
	owner := make([]int, len(items))
	for i, it := range items {
		reqs[i], owner[i] = it.r, it.c
	}
	return reqs, owner
}

// traceOf returns reqs as a trace.
func traceOf(reqs []loadtest.Request) loadtest.Trace {
	return func(yield func(loadtest.Request, error) bool) {
		for _, r := range reqs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

// replay replays reqs against targets and returns every request's result,
// by index, with the report. MaxOutstanding stays modest: under the race
// detector each outstanding request is a goroutine.
func replay(t testing.TB, ctx context.Context, cfg loadtest.ReplayConfig, reqs []loadtest.Request) ([]loadtest.Result, *loadtest.Report) {
	t.Helper()
	results := make([]loadtest.Result, len(reqs))
	if cfg.MaxOutstanding == 0 {
		cfg.MaxOutstanding = 2000
	}
	if cfg.ConnsPerTarget == 0 {
		cfg.ConnsPerTarget = 32
	}
	cfg.OnResult = func(r loadtest.Result) {
		if r.Index >= 0 && int(r.Index) < len(results) {
			results[r.Index] = r
		}
	}
	rep, err := loadtest.Replay(ctx, cfg, traceOf(reqs))
	if err != nil { // t.Error: replay may run on a goroutine of the test
		t.Errorf("replay: %v", err)
	}
	if rep == nil {
		rep = &loadtest.Report{}
	}
	return results, rep
}

// latencies summarises service times (sent to answered) in ms.
type latencies []time.Duration

func (l latencies) String() string {
	if len(l) == 0 {
		return "no requests"
	}
	s := slices.Clone(l)
	slices.Sort(s)
	q := func(p float64) float64 { return ms(s[min(len(s)-1, int(p*float64(len(s))))]) }
	return fmt.Sprintf("n=%d p50 %.1f ms, p99 %.1f ms, max %.1f ms", len(s), q(0.5), q(0.99), ms(s[len(s)-1]))
}

func (l latencies) quantile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return slices.Max(l)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// table formats rows of cells as aligned text for the test log.
func table(rows [][]string) string {
	widths := map[int]int{}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.WriteString("\n  ")
		for i, c := range r {
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-len([]rune(c))+2))
		}
	}
	return b.String()
}

func newDiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// alignedStart returns the instant a replay with Align a started now will
// start at: the next multiple of a since the Unix epoch.
func alignedStart(a time.Duration) time.Time {
	now := time.Now()
	return now.Add(a - time.Duration(now.UnixNano()%int64(a)))
}

// overloaded says why a replay shows that this shared machine could not
// keep its pace (requests not sent, or sent late), or "" if it kept it.
// Accuracy figures measured while it could not are the machine's, not the
// limiter's: tests log them but do not judge them.
func overloaded(rep *loadtest.Report) string {
	switch {
	case rep.NotSent > 0:
		return fmt.Sprintf("%d requests not sent (too many outstanding)", rep.NotSent)
	case rep.SendLag.P99Millis > 100:
		return fmt.Sprintf("requests sent late: p99 lag %.0f ms", rep.SendLag.P99Millis)
	}
	return ""
}
