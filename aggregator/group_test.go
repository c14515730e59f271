package aggregator

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
)

// These tests run aggregators in one consumer group on a broker that
// outlives them (kfake, as a real cluster does): events are partitioned by
// key hash, so each key's events reach one member, whose judge holds the
// key's whole history; the members' reports add up to one aggregator's.

const groupPartitions = 8

// groupTrace is decisions of keys 1..keys from edges 1 and 2, in two
// phases: phase 0 from base, phase 1 from base + 30 s (three windows of
// the 10 s rule later, so no key's history from phase 0 bears on phase 1).
// In each phase every key gets 10 admissions, an 11th admission (wrongly
// allowed) and a refusal (right); every 4th key gets a refusal at its 5th
// attempt instead of an admission (wrongly limited).
func groupTrace(keys int) (phases [2]*trace, want judge.DecisionTally) {
	base := time.Now().Add(-2 * time.Minute).Truncate(10 * time.Second).UnixNano()
	for ph := range phases {
		tr := &trace{base: base}
		for k := 1; k <= keys; k++ {
			from := int64(ph*30_000 + k) // ms
			key := uint64(k) * 0x9E3779B97F4A7C15
			if k%4 == 0 {
				tr.add(from, 4, 50, key, event.Allowed, nil)
				tr.add(from+200, 1, 0, key, event.Limited, nil)
				tr.add(from+250, 6, 50, key, event.Allowed, nil)
				want.WronglyLimited++
			} else {
				tr.add(from, 10, 50, key, event.Allowed, nil)
			}
			tr.add(from+600, 1, 0, key, event.Allowed, nil)
			tr.add(from+650, 1, 0, key, event.Limited, nil)
			want.WronglyAllowed++
		}
		phases[ph] = tr
	}
	want.Decisions = int64(len(phases[0].events) + len(phases[1].events))
	return phases, want
}

// groupConfig is an aggregator of group on the broker at addr.
func groupConfig(t *testing.T, addr, group string) Config {
	cfg := testConfig(t)
	cfg.Brokers = []string{addr}
	cfg.Consumer.GroupID = group
	cfg.Judge.AllowedLateness = time.Minute // the trace is emitted in moments: order it by time
	return cfg
}

// waitStable waits until group has n members and is stable: every member
// has its partitions, so that no rebalance moves them while the stream
// flows.
func waitStable(t *testing.T, addr, group string, n int) {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second}
	testenv.WaitFor(t, 40*time.Second, "the group stable with its members", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil || len(r.Groups) != 1 {
			return false
		}
		g := r.Groups[0]
		return g.Error == nil && g.GroupState == "Stable" && len(g.Members) == n
	})
}

func emitPhase(t *testing.T, tr *trace, producers map[uint16]*pipeline.Producer) {
	t.Helper()
	tr.emit(t, producers)
}

func eventsOf(t *testing.T, as ...*Aggregator) float64 {
	var n float64
	for _, a := range as {
		n += testenv.MetricSum(t, a.reg, "poplimit_aggregator_events_total")
	}
	return n
}

func tallyOf(r judge.Report) judge.DecisionTally {
	return judge.DecisionTally{Decisions: r.Enforced.Decisions, WronglyAllowed: r.Enforced.WronglyAllowed, WronglyLimited: r.Enforced.WronglyLimited}
}

func addTally(a, b judge.DecisionTally) judge.DecisionTally {
	return judge.DecisionTally{Decisions: a.Decisions + b.Decisions, WronglyAllowed: a.WronglyAllowed + b.WronglyAllowed,
		WronglyLimited: a.WronglyLimited + b.WronglyLimited}
}

// TestTwoAggregatorsSplitTheJudging runs one aggregator alone (group
// "single") and two in another group ("pair") on the same stream: the two
// split the partitions, each judges some of the decisions, every decision
// is judged once, and their figures add up to the single one's, which are
// the trace's known answer.
func TestTwoAggregatorsSplitTheJudging(t *testing.T) {
	t.Parallel()
	_, addr := testenv.Broker(t, 0, groupPartitions, topic)
	single := startAggregator(t, groupConfig(t, addr, "single"))
	p1 := startAggregator(t, groupConfig(t, addr, "pair"))
	p2 := startAggregator(t, groupConfig(t, addr, "pair"))
	waitStable(t, addr, "single", 1)
	waitStable(t, addr, "pair", 2)

	phases, want := groupTrace(64)
	producers := map[uint16]*pipeline.Producer{1: newProducer(t, []string{addr}), 2: newProducer(t, []string{addr})}
	emitPhase(t, phases[0], producers)
	emitPhase(t, phases[1], producers)
	n := float64(want.Decisions)
	testenv.WaitFor(t, 30*time.Second, "every event consumed by each group", func() bool {
		return eventsOf(t, single) >= n && eventsOf(t, p1, p2) >= n
	})
	rs, r1, r2 := getReport(t, single, true), getReport(t, p1, true), getReport(t, p2, true)
	if got := tallyOf(rs); got != want {
		t.Errorf("single aggregator: %+v, want the known answer %+v", got, want)
	}
	if got := addTally(tallyOf(r1), tallyOf(r2)); got != tallyOf(rs) {
		t.Errorf("two aggregators: %+v + %+v = %+v, want the single one's %+v", tallyOf(r1), tallyOf(r2), got, tallyOf(rs))
	}
	if r1.Events+r2.Events != rs.Events || r1.Judged+r2.Judged != rs.Judged || r1.Late+r2.Late != 0 {
		t.Errorf("events %d + %d, judged %d + %d, late %d + %d; want %d events and judged (each once), none late",
			r1.Events, r2.Events, r1.Judged, r2.Judged, r1.Late, r2.Late, rs.Events)
	}
	if r1.Judged == 0 || r2.Judged == 0 {
		t.Errorf("judged %d and %d: want the pair to split the judging", r1.Judged, r2.Judged)
	}
	t.Logf("single %+v; pair %+v and %+v", tallyOf(rs), tallyOf(r1), tallyOf(r2))
}

// TestRebalanceMidStream stops one of two aggregators of a group in the
// middle of the stream (gracefully, as SIGTERM does: it commits the batch
// in hand, judges what it buffered and leaves the group); its partitions
// move to the other, which judges the rest. Nothing is judged twice or
// lost: the decisions add up exactly. The verdicts add up within what a
// move can cost: a moved key's decisions after the move, within one window
// of its last one before it, are judged without the history the stopped
// aggregator held (at most one verdict each). Phase 1, three windows
// after phase 0, adds up exactly.
func TestRebalanceMidStream(t *testing.T) {
	t.Parallel()
	_, addr := testenv.Broker(t, 0, groupPartitions, topic)
	var mu sync.Mutex
	applied := [2]map[uint64]int{{}, {}} // key -> events applied, by aggregator
	cfgOf := func(i int) Config {
		cfg := groupConfig(t, addr, "pair")
		cfg.Consumer.MaxBatch = 16
		cfg.onApply = func(b []event.Event) {
			mu.Lock()
			for _, e := range b {
				applied[i][e.KeyHash]++
			}
			mu.Unlock()
			if i == 1 {
				time.Sleep(20 * time.Millisecond) // the aggregator to stop is slow: it is stopped mid-stream
			}
		}
		return cfg
	}
	p1 := startAggregator(t, cfgOf(0))
	p2 := startAggregator(t, cfgOf(1))
	waitStable(t, addr, "pair", 2)

	phases, want := groupTrace(64)
	producers := map[uint16]*pipeline.Producer{1: newProducer(t, []string{addr}), 2: newProducer(t, []string{addr})}
	emitPhase(t, phases[0], producers)
	testenv.WaitFor(t, 30*time.Second, "the aggregator to stop in the middle of its partitions", func() bool {
		return eventsOf(t, p2) >= 64
	})
	stopAggregator(t, p2)
	r2 := p2.judge.Report()
	mu.Lock()
	before := maps.Clone(applied[0])
	mu.Unlock()
	waitStable(t, addr, "pair", 1)
	n0 := float64(len(phases[0].events))
	testenv.WaitFor(t, 30*time.Second, "phase 0 consumed", func() bool { return eventsOf(t, p1, p2) >= n0 })

	// The keys that moved: applied by both. Their events the survivor
	// judged after the move bound how much the verdicts may differ.
	mu.Lock()
	moved, slack := 0, int64(0)
	for k, n := range applied[1] {
		if m := applied[0][k] - before[k]; m > 0 && n > 0 {
			moved++
			slack += int64(m)
		}
	}
	mu.Unlock()

	emitPhase(t, phases[1], producers)
	n := float64(want.Decisions)
	testenv.WaitFor(t, 30*time.Second, "phase 1 consumed by the survivor", func() bool { return eventsOf(t, p1, p2) >= n })
	r1 := getReport(t, p1, true)
	got := addTally(tallyOf(r1), tallyOf(r2))
	t.Logf("stopped aggregator judged %d; %d keys moved mid-window, %d of their events judged after the move; figures %+v, known answer %+v",
		r2.Judged, moved, slack, got, want)
	if r2.Judged == 0 {
		t.Errorf("the stopped aggregator judged nothing: the pair did not split the stream")
	}
	if got.Decisions != want.Decisions || r1.Events+r2.Events != want.Decisions || r1.Late+r2.Late != 0 {
		t.Errorf("decisions %d (events %d + %d, late %d + %d); want %d, each judged once",
			got.Decisions, r1.Events, r2.Events, r1.Late, r2.Late, want.Decisions)
	}
	if d := abs(got.WronglyAllowed-want.WronglyAllowed) + abs(got.WronglyLimited-want.WronglyLimited); d > slack {
		t.Errorf("verdicts differ from the known answer by %d, more than the %d events of moved keys judged after the move", d, slack)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
