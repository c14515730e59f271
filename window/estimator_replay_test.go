package window

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// replayConfig is one judged replay of a trace through one Limiter.
type replayConfig struct {
	limit    uint64
	window   time.Duration
	phase    time.Duration // offset 0 this far past a window boundary
	flush    time.Duration
	edges    int           // limiters on one store, requests dealt round-robin (default 1)
	pinned   bool          // with edges: each client to one edge, by a hash of its address
	diag     bool          // classify the wrong decisions
	hist     histParams    // the estimator's histograms (zero: the defaults)
	local    bool          // Config.AsyncNearLimit
	guess    bool          // Config.GuessPeers
	maxDefer time.Duration // Config.MaxDefer
	mode     policy.Mode   // the rule's mode (zero: async)
}

type replayResult struct {
	decisions, wrongAllowed, wrongLimited int
	worst                                 float64 // the most over-admitted key's exact count ÷ limit
	storeOps                              int     // increments + reads (a key's reads in one batch: one op)
	requests                              int
	hists                                 int // histograms in use at the end
	diag                                  map[string]int
}

func (r replayResult) wrong() float64 {
	return float64(r.wrongAllowed+r.wrongLimited) / float64(r.decisions)
}

type traceLine struct {
	At float64 `json:"offset_ms"`
	IP string  `json:"ip"`
}

func loadTrace(t testing.TB, path string) []traceLine {
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace: %v", err)
	}
	defer f.Close()
	var out []traceLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l traceLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// replayTrace replays lines as loadtest offline does (one edge, simulated
// time, a block cache that answers a refused key until its release, a flush
// every interval of trace time) and judges every decision against the
// exact sliding logs, as the aggregator's judge does: an admitted request
// is wrong when the admitted units in its trailing window, it included,
// exceed the limit; a refused one when the attempts, it included, do not.
func replayTrace(t testing.TB, lines []traceLine, c replayConfig) replayResult {
	clock := newSimClock(time.Unix(0, 0))
	backend := &opStore{Store: store.NewMemStore(clock)}
	edges := make([]*Limiter, max(c.edges, 1))
	for i := range edges {
		l, err := New(Config{FlushInterval: c.flush, Clock: clock, hist: c.hist, AsyncNearLimit: c.local, GuessPeers: c.guess, MaxDefer: c.maxDefer}, backend)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(context.Background())
		edges[i] = l
	}
	pol := &Policy{Limit: c.limit, Window: c.window, Mode: c.mode}
	sl := algo.SlidingLog{Limit: int64(c.limit), Window: c.window}
	type keyState struct {
		admitted, attempts algo.SlidingLogState
		release            []int64 // per edge: its block cache
		adm                []int64 // admitted instants (POPLIMIT_DUMP)
		admBy              []int   // their edges
	}
	keys := map[uint64]*keyState{}
	res := replayResult{diag: map[string]int{}}
	origin := int64(c.phase)
	var lastFlush, last int64
	ctx := context.Background()
	for _, ln := range lines {
		tt := origin + int64(ln.At*1e6)
		tt = max(tt, last)
		last = tt
		clock.t.Store(tt)
		if tt-lastFlush >= int64(c.flush) {
			for _, l := range edges {
				l.Flush(ctx, time.Unix(0, tt))
			}
			lastFlush = tt
		}
		h := xxhash.Sum64String(ln.IP)
		ks := keys[h]
		if ks == nil {
			ks = &keyState{release: make([]int64, len(edges))}
			keys[h] = ks
		}
		ei := res.requests % len(edges)
		if c.pinned {
			ei = int(h>>32) % len(edges)
		}
		l := edges[ei]
		res.requests++
		res.decisions++
		allowed := false
		var d Answer
		if tt >= ks.release[ei] {
			d = l.Decide(ctx, time.Unix(0, tt), pol, h, c.limit, 1)
			allowed = d.Allowed
			if !allowed {
				ks.release[ei] = d.ReleaseAt
			}
		}
		if allowed {
			prior := sl.Count(&ks.admitted, tt)
			sl.Add(&ks.admitted, tt, 1)
			sl.Add(&ks.attempts, tt, 1)
			if c.diag {
				ks.adm = append(ks.adm, tt)
				ks.admBy = append(ks.admBy, ei)
			}
			if prior+1 > int64(c.limit) {
				res.wrongAllowed++
				res.worst = max(res.worst, float64(prior+1)/float64(c.limit))
				if c.diag {
					cause := l.diagnose(h, tt, "under", float64(prior)-d.Estimate)
					res.diag[cause]++
					if os.Getenv("POPLIMIT_DUMPA") != "" && strings.HasPrefix(cause, os.Getenv("POPLIMIT_DUMPA")) && res.diag["dumpa"] < 12 {
						res.diag["dumpa"]++
						logWrong(t, l, h, tt, int64(c.window), ei, d.Estimate, ks.adm, ks.admBy)
					}
				}
			}
		} else {
			n := sl.Count(&ks.attempts, tt)
			sl.Add(&ks.attempts, tt, 1)
			if n+1 <= int64(c.limit) {
				res.wrongLimited++
				if c.diag {
					cause := "L/cache" // refused by this edge's block cache
					if tt >= ks.release[ei] || d.ReleaseAt != 0 {
						cause = "L/" + l.diagnose(h, tt, "over", d.Estimate-float64(sl.Count(&ks.admitted, tt)))
					}
					res.diag[cause]++
					if os.Getenv("POPLIMIT_DUMP") != "" && strings.HasPrefix(cause, "L/shaped/over2") && res.diag["dump"] < 12 {
						res.diag["dump"]++
						logWrong(t, l, h, tt, int64(c.window), ei, d.Estimate, ks.adm, ks.admBy)
					}
				}
			}
		}
	}
	clock.Add(time.Second)
	for _, l := range edges {
		l.Flush(ctx, clock.Now())
		res.hists += l.Histograms()
	}
	res.storeOps = backend.incrs + backend.reads
	return res
}

// diagnose names what a wrong decision's estimate rested on: by how much
// it missed the exact count (word: "under" for a wrong admission, "over"
// for a wrong refusal) and the part of the view that held the miss.
func (l *Limiter) diagnose(key uint64, t int64, word string, miss float64) string {
	s := l.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lookup(key)
	if e == nil {
		return "gone"
	}
	bucket := word + "<1"
	switch {
	case miss >= 5:
		bucket = word + ">=5"
	case miss >= 2:
		bucket = word + "2-5"
	case miss >= 1:
		bucket = word + "1-2"
	}
	ps, _ := s.shapes(e, 0)
	switch {
	case e.hist == 0:
		return "nohist/" + bucket
	case ps.h == nil:
		return "nopsh/" + bucket
	case ps.h.base > 0 && t-e.win < ps.h.at:
		return "inbase/" + bucket
	}
	return "shaped/" + bucket
}

// logWrong logs a wrong decision on key at t by edge ei (POPLIMIT_DUMP,
// POPLIMIT_DUMPA):
// the true admissions adm (by edge admBy) near the trailing window's start
// and in its parts, beside the edge's view and shape (dumpKey).
func logWrong(t testing.TB, l *Limiter, key uint64, tt, w int64, ei int, est float64, adm []int64, admBy []int) {
	start := tt - ((tt%w)+w)%w
	var inPrev, inCurr, prevWin int
	var near []string
	for j, a := range adm {
		switch {
		case a >= start-w && a < start:
			prevWin++
			if a > tt-w {
				inPrev++
			}
		case a >= start && a <= tt:
			inCurr++
		}
		if a >= tt-w-w/10 && a < tt-w+w/10 {
			near = append(near, fmt.Sprintf("%d@%.3f", admBy[j], float64(a-(start-w))/1e9))
		}
	}
	t.Logf("  true prev near u: %s", strings.Join(near, " "))
	t.Logf("edge %d key %x at %.3fs of window: estimate %.2f, exact %d (prev part %d of %d, curr %d); %s", ei, key, float64(tt-start)/1e9, est, inPrev+inCurr, inPrev, prevWin, inCurr, l.dumpKey(key, tt))
}

// dumpKey describes key's view and the shape of its previous window near
// t − W, for POPLIMIT_DUMP.
func (l *Limiter) dumpKey(key uint64, t int64) string {
	s := l.shardOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lookup(key)
	prev, curr := e.view()
	ps, _ := s.shapes(e, curr)
	sp := e.spans()
	out := fmt.Sprintf("view prev %d curr %d (pend %d infl %d) share %d orate %d reply %.3fs spans %.3f/%.3f pfirst %d first %d hist %d", prev, curr, e.pend, e.infl, e.share, e.orate, float64(e.replied()-e.start)/1e9, float64(sp.Prev)/1e9, float64(sp.Next)/1e9, e.pfirst, e.first, e.hist)
	if ps.h != nil {
		u := t - e.win
		a, n, f, lst := ps.after(u)
		out += fmt.Sprintf("; prev shape mass %d base %d, part %.2f", ps.h.mass, ps.h.base, ps.prevPart(uint64(prev), a, n, f, lst, u))
		var bs []string
		for j := range ps.b {
			nn, ff, ll := ps.seg(j)
			if ll > u-e.win/5 && ff < u+e.win/5 {
				bs = append(bs, fmt.Sprintf("%d@%.3f-%.3f", nn, float64(ff-ps.h.start)/1e9, float64(ll-ps.h.start)/1e9))
			}
		}
		out += " near u: " + strings.Join(bs, " ")
	}
	return out
}

func envDuration(t testing.TB, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return def
}

// TestEstimatorTraceReplay judges a trace (POPLIMIT_TRACE, a loadtest gen
// JSON-lines file) at four phases of the window grid, as loadtest offline
// -judge -phases 4 does (POPLIMIT_PHASE shifts all four: 9.7s starts the
// first 0.3 s before a boundary of a 10 s window, the hardest for a
// client's onset), and logs the accuracy and store operations per
// request. POPLIMIT_K lists bucket counts to compare (default the
// package's), POPLIMIT_FLUSH flush intervals, POPLIMIT_EDGES deals the
// requests round-robin to that many limiters on one store (each with its
// own block cache; POPLIMIT_SPREAD=client pins each client to one edge),
// POPLIMIT_INTERP (last, even or ends) and POPLIMIT_ONSET_SHIFT set the
// histograms' placement of a bucket's units and onset (histParams),
// POPLIMIT_DIAG=1 classifies the wrong decisions (the wrongly limited
// ones prefixed L/), and POPLIMIT_DUMP=1 with it logs the first dozen
// refusals whose estimate exceeded the exact count by 2 to 5: the key's
// view, its shape near the trailing window's start and the true admissions
// there, by edge; POPLIMIT_DUMPA=CAUSE likewise the first dozen wrong
// admissions whose cause begins with CAUSE (nopsh, shaped, ...).
func TestEstimatorTraceReplay(t *testing.T) {
	path := os.Getenv("POPLIMIT_TRACE")
	if path == "" {
		t.Skip("POPLIMIT_TRACE not set")
	}
	lines := loadTrace(t, path)
	ks := []int{histParams{}.withDefaults().buckets}
	if v := os.Getenv("POPLIMIT_K"); v != "" {
		ks = nil
		for _, f := range strings.Split(v, ",") {
			k, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			ks = append(ks, k)
		}
	}
	flushes := []time.Duration{5 * time.Millisecond}
	if v := os.Getenv("POPLIMIT_FLUSH"); v != "" {
		flushes = nil
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(f)
			if err != nil {
				t.Fatal(err)
			}
			flushes = append(flushes, d)
		}
	}
	var hp histParams
	if v := os.Getenv("POPLIMIT_ONSET_SHIFT"); v != "" {
		sh, err := strconv.Atoi(v)
		if err != nil || sh < 1 {
			t.Fatalf("POPLIMIT_ONSET_SHIFT %q: want a shift of at least 1", v)
		}
		hp.onsetShift = uint(sh)
	}
	if v := os.Getenv("POPLIMIT_INTERP"); v != "" {
		i := slices.Index([]string{"last", "even", "ends"}, v)
		if i < 0 {
			t.Fatalf("POPLIMIT_INTERP %q: want last, even or ends", v)
		}
		hp.interp = histInterp(i)
	}
	w := envDuration(t, "POPLIMIT_WINDOW", 10*time.Second)
	var mode policy.Mode
	if os.Getenv("POPLIMIT_MODE") == "sync" {
		mode = policy.Sync
	}
	edges := 1
	if v := os.Getenv("POPLIMIT_EDGES"); v != "" {
		edges, _ = strconv.Atoi(v)
	}
	for _, fl := range flushes {
		for _, k := range ks {
			hp.buckets = k
			worst, worstKey := 0.0, 0.0
			for p := range 4 {
				ph := (envDuration(t, "POPLIMIT_PHASE", 0) + w*time.Duration(p)/4) % w
				r := replayTrace(t, lines, replayConfig{limit: 100, window: w, phase: ph, flush: fl, edges: edges, pinned: os.Getenv("POPLIMIT_SPREAD") == "client", diag: os.Getenv("POPLIMIT_DIAG") != "", hist: hp, local: os.Getenv("POPLIMIT_LOCAL") != "" || os.Getenv("POPLIMIT_GUESS") != "", guess: os.Getenv("POPLIMIT_GUESS") != "", mode: mode, maxDefer: envDuration(t, "POPLIMIT_MAX_DEFER", 0)})
				worst, worstKey = max(worst, r.wrong()), max(worstKey, r.worst)
				t.Logf("edges=%d k=%d flush=%v phase=%v: %d decisions, wrongly allowed %d, wrongly limited %d, wrong %.3f%%, worst key %.2f×, store ops/request %.4f, histograms %d",
					edges, k, fl, ph, r.decisions, r.wrongAllowed, r.wrongLimited, 100*r.wrong(), r.worst, float64(r.storeOps)/float64(r.requests), r.hists)
				if len(r.diag) > 0 {
					var names []string
					for n := range r.diag {
						names = append(names, n)
					}
					sort.Strings(names)
					var b strings.Builder
					for _, n := range names {
						fmt.Fprintf(&b, " %s=%d", n, r.diag[n])
					}
					t.Logf("  wrong decisions by cause (L/: wrongly limited):%s", b.String())
				}
			}
			t.Logf("edges=%d k=%d flush=%v: worst phase %.3f%% wrong, worst key %.2f×", edges, k, fl, 100*worst, worstKey)
		}
	}
}
