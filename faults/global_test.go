package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/pipeline"
)

// netCut dials brokers for one PoP and can cut it off from them: Cut
// closes its connections and refuses new ones until Heal, as a partition
// between the PoP and the Kafka cluster does.
type netCut struct {
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

var errCut = errors.New("faults: the PoP is cut off from the brokers")

func (n *netCut) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if n.cut.Load() {
		return nil, errCut
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut.Load() {
		c.Close()
		return nil, errCut
	}
	n.conns = append(n.conns, c)
	return c, nil
}

func (n *netCut) Cut() {
	n.cut.Store(true)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		c.Close()
	}
	n.conns = nil
}

func (n *netCut) Heal() { n.cut.Store(false) }

// tee records an edge's events and sends them to its producer.
type tee struct {
	rec *recorder
	p   *pipeline.Producer
}

func (t tee) Emit(e *event.Event) bool { t.rec.Emit(e); return t.p.Emit(e) }

// twoPops starts a broker with the events' and the counts' topics, the
// aggregator binary publishing the counts every interval, and two PoPs of
// two edges each over a memcached shard of their own; every decision is
// recorded in rec and sent through its edge's producer. It returns the
// edges' addresses and registries, PoP a's first, and each PoP's cut.
func twoPops(t *testing.T, rules string, interval time.Duration, rec *recorder) (targets []string, regs []*prometheus.Registry, cuts [2]*netCut, agg *aggProc) {
	t.Helper()
	port := testenv.FreePort(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port),
		kfake.SeedTopics(partitions, eventsTopic), kfake.SeedTopics(1, global.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]
	agg = startAggregatorProc(t, "-brokers", broker, "-topic", eventsTopic, "-global-interval", interval.String(),
		"-lateness", "1s", "-idle-flush", "2s")
	for p, pop := range []string{"a", "b"} {
		cuts[p] = &netCut{}
		_, shards := testenv.Shards(t, 1)
		for i := range popEdges {
			reg := prometheus.NewRegistry()
			pc := pipeline.DefaultProducerConfig()
			pc.Brokers, pc.Topic, pc.Dial = []string{broker}, eventsTopic, cuts[p].dial
			prod, err := pipeline.NewProducer(pc, reg)
			if err != nil {
				t.Fatal(err)
			}
			e := newEdge(t, edgeSpec{id: 10*(p+1) + i, rules: rules, servers: shardsNamed(shards...), reg: reg,
				events: tee{rec, prod}, pop: pop, brokers: []string{broker}, kafkaDial: cuts[p].dial})
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				prod.Close(ctx)
			})
			targets, regs = append(targets, serve(t, e).addr), append(regs, reg)
		}
	}
	return targets, regs, cuts, agg
}

// admittedWindows returns, for the decisions of rule in recs, the most
// any one client had admitted in a trailing window of w, over the limit,
// from 'from' on (times in true time).
func worstTrailing(recs []rec, rule string, w time.Duration, limit float64, from int64) (worst float64, who uint64) {
	byKey := map[uint64][]int64{}
	for _, r := range recs {
		if string(r.ev.Rule) == rule && r.ev.Decision == event.Allowed {
			byKey[r.ev.KeyHash] = append(byKey[r.ev.KeyHash], r.at)
		}
	}
	for k, ts := range byKey {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		lo := 0
		for hi, at := range ts {
			for ts[lo] <= at-int64(w) {
				lo++
			}
			if at >= from {
				if r := float64(hi-lo+1) / limit; r > worst {
					worst, who = r, k
				}
			}
		}
	}
	return worst, who
}

// globalClients: one client at twice the global limit, and clients from
// half to one and a half times it, all dealt over the four edges of both
// PoPs; and clients of a PoP-scope rule at one and a half times its limit,
// whose limit holds in each PoP apart (each PoP sees three quarters).
// Their addresses start at base.
func globalClients(base int) []client {
	cs := []client{{ip: clientIP(base + 1), path: "/g", rate: 20}}
	for i, r := range []float64{5, 8, 9.5, 11, 13, 15} {
		cs = append(cs, client{ip: clientIP(base + 10 + i), path: "/g", rate: r})
	}
	for i := range 4 {
		cs = append(cs, client{ip: clientIP(base + 30 + i), path: "/p", rate: 15})
	}
	return cs
}

// popEdges is the edges of each PoP: one, so that what the tests measure
// is the protocol between PoPs; a client dealt over the edges within a
// PoP adds that spread's error (BENCHMARKS.md, "One client over every
// edge").
const popEdges = 1

const globalRules = `
rules:
  - {name: p, path_prefix: /p, limit: 100, window: 10s}
  - {name: g, limit: 100, window: 10s, scope: global}
`

// TestGlobalLimitAcrossPoPs: a global rule's limit of 100 per 10 s holds
// for clients dealt over two PoPs (each PoP alone would admit a client at
// twice the limit in full), judged by key across the PoPs; a PoP rule's
// limit holds in each PoP apart, as before. The trace starts mid-window
// (2.5 s past the grid); the full version runs it at four phases, each
// with clients of their own.
//
// The other PoPs' counts carry their window's shape (units per sixteenth
// of it): as two window totals weighed as if even, a client that starts
// mid-window was undercounted in its next window, 6.4-16.2 % wrong and
// 1.10-1.20× from mid-window against 0.59 % and 1.00× from a boundary.
// With the shape: 0.39-0.54 % and 1.01-1.02× at all four phases
// (docs/DESIGN.md, "Limits across PoPs"; BENCHMARKS.md has the current
// figures).
func TestGlobalLimitAcrossPoPs(t *testing.T) {
	const interval = 100 * time.Millisecond // the aggregator's default
	var events recorder
	targets, _, _, agg := twoPops(t, globalRules, interval, &events)
	win := 10 * time.Second
	phases := pick([]time.Duration{2500 * time.Millisecond}, []time.Duration{0, 2500 * time.Millisecond, 5 * time.Second, 7500 * time.Millisecond})
	for pi, phase := range phases {
		var start time.Time
		reqs, _ := steady(globalClients(100*pi), 25*time.Second, uint64(3+pi))
		_, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin,
			Align: win, Phase: phase, OnStart: func(s time.Time) { start = s }}, reqs)
		t.Logf("phase %v: replay: %d sent, %d completed, errors %v, statuses %v", phase, rep.Sent, rep.Completed, rep.Errors, rep.Statuses)
		var recs []rec
		for _, r := range events.snapshot() {
			if r.at >= start.UnixNano() {
				recs = append(recs, r)
			}
		}
		// From one window in: the first window has no previous one, in
		// which every PoP's count starts at once.
		worst, who := worstTrailing(recs, "g", win, 100, start.Add(win).UnixNano())
		worstP, _ := worstTrailing(recs, "p", win, 100, start.Add(win).UnixNano())
		j := judgeReport(t, recs)
		t.Logf("phase %v: global rule: worst client admitted %.3f× the limit in a trailing window (key %016x); pop rule: worst %.3f× (each PoP holds its own limit)", phase, worst, who, worstP)
		for _, s := range j.ByScope {
			t.Logf("phase %v: judged, scope %s: %d decisions, %d wrongly allowed, %d wrongly limited (%.3f %% wrong)",
				phase, s.Name, s.Enforced.Decisions, s.Enforced.WronglyAllowed, s.Enforced.WronglyLimited, 100*s.Enforced.WrongRatio)
		}
		for _, s := range j.ByPop {
			t.Logf("phase %v: judged, PoP %q: %d decisions, %.3f %% wrong", phase, s.Name, s.Enforced.Decisions, 100*s.Enforced.WrongRatio)
		}
		if why := overloaded(rep); why != "" {
			t.Logf("phase %v: accuracy not judged: the machine was overloaded: %s", phase, why)
			continue
		}
		if worst > 1.05 {
			t.Errorf("phase %v: global rule: a client dealt over two PoPs got %.3f× the limit in a trailing window: want ≤ 1.05× (each PoP alone: 2×)", phase, worst)
		}
		if worstP < 1.3 {
			t.Errorf("phase %v: pop rule: the worst client got %.3f× the limit: want each PoP to admit its own (1.5×)", phase, worstP)
		}
		// The target is 0.5 %; the four phases measured 0.39-0.54 %. A
		// regression past 1 % fails.
		for _, s := range j.ByScope {
			if s.Name == "global" && s.Enforced.WrongRatio > 0.01 {
				t.Errorf("phase %v: global rule judged across PoPs: %.3f %% wrong, want about 0.5 %%, at most 1 %%", phase, 100*s.Enforced.WrongRatio)
			}
		}
	}
	ar := agg.report(t, true)
	for _, s := range ar.ByScope {
		t.Logf("the aggregator, every phase, scope %s: %d decisions, %.3f %% wrong", s.Name, s.Enforced.Decisions, 100*s.Enforced.WrongRatio)
	}
}

// TestGlobalPoPCutOff cuts PoP b off from Kafka for 10 s: its edges stop
// hearing the other PoP's counts (and stop delivering their own events)
// and, after -global-stale, hold the global rule to -global-share (0.5)
// of its limit; PoP a still hears the publisher but no longer b's counts.
// The figures per phase go to faults/RESULTS.md.
func TestGlobalPoPCutOff(t *testing.T) {
	const interval = 100 * time.Millisecond
	var events recorder
	targets, regs, cuts, agg := twoPops(t, globalRules, interval, &events)
	win := 10 * time.Second
	before, cut, after := 12*time.Second, 10*time.Second, 13*time.Second
	reqs, _ := steady(globalClients(0), before+cut+after, 4)
	start := alignedStart(win)
	var cutAt, healAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(start.Add(before)))
		cutAt = time.Now()
		cuts[1].Cut()
		time.Sleep(cut)
		healAt = time.Now()
		cuts[1].Heal()
	}()
	_, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin, Align: win}, reqs)
	<-done
	t.Logf("replay: %d sent, %d completed, errors %v, statuses %v; cut at +%.2fs, healed at +%.2fs", rep.Sent, rep.Completed,
		rep.Errors, rep.Statuses, cutAt.Sub(start).Seconds(), healAt.Sub(start).Seconds())
	recs := events.snapshot()
	phases := []struct {
		name     string
		from, to time.Time
	}{{"before", start.Add(win), cutAt}, {"cut off", cutAt, healAt}, {"after", healAt.Add(win / 2), start.Add(before + cut + after)}}
	rows := [][]string{{"phase", "worst client ÷ limit (trailing 10 s)", "decisions of g"}}
	for _, ph := range phases {
		var in []rec
		for _, r := range recs {
			if r.at >= ph.from.UnixNano() && r.at < ph.to.UnixNano() && string(r.ev.Rule) == "g" {
				in = append(in, r)
			}
		}
		worst, _ := worstTrailing(recs, "g", win, 100, ph.from.UnixNano())
		if ph.to.Before(start.Add(before + cut + after)) {
			worst = worstUntil(recs, "g", win, 100, ph.from.UnixNano(), ph.to.UnixNano())
		}
		rows = append(rows, []string{ph.name, fmt.Sprintf("%.3f×", worst), fmt.Sprint(len(in))})
	}
	t.Logf("per phase:%s", table(rows))
	var heldA, heldB float64
	for i, reg := range regs {
		n := testenv.MetricSum(t, reg, "poplimit_edge_global_fallbacks_total")
		if i < popEdges {
			heldA += n
		} else {
			heldB += n
		}
	}
	t.Logf("decisions held to -global-share (cut off): PoP a %v, PoP b %v", heldA, heldB)
	ar := agg.report(t, true)
	for _, s := range ar.ByScope {
		t.Logf("the aggregator, scope %s: %d decisions, %.3f %% wrong", s.Name, s.Enforced.Decisions, 100*s.Enforced.WrongRatio)
	}
	if heldB == 0 {
		t.Error("PoP b, cut off for 10 s, held no decision to its share")
	}
	if heldA != 0 {
		t.Errorf("PoP a, never cut off, held %v decisions to its share", heldA)
	}
}

// worstUntil is worstTrailing over the decisions at from..to.
func worstUntil(recs []rec, rule string, w time.Duration, limit float64, from, to int64) float64 {
	var in []rec
	for _, r := range recs {
		if r.at < to {
			in = append(in, r)
		}
	}
	worst, _ := worstTrailing(in, rule, w, limit, from)
	return worst
}
