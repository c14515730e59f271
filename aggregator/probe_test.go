package aggregator

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scrape GETs /metrics, wants 200 and returns the body.
func scrape(t *testing.T, a *Aggregator) string {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: got status %d (%.300s), want 200", resp.StatusCode, b)
	}
	return string(b)
}

// promtoolCheck runs `promtool check metrics` on a scrape, if promtool is
// on PATH.
func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not on PATH: scrape not linted by it")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: got %v: %s, want no problem", err, out)
	}
}

// TestScrapeAfterAlgorithmReload sends a rule's events through the
// pipeline, then the same rule's after a reload changed its algorithm (as
// the edges emit them: same rule name, keys and edges, another
// Algorithm): /metrics answers 200 with one series per label set, and
// promtool finds nothing to say.
func TestScrapeAfterAlgorithmReload(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Judge.AllowedLateness = time.Minute // the trace is emitted at once
	a := startAggregator(t, cfg)
	tr := newTrace()
	tr.add(0, 12, 100, 1, event.Allowed, nil) // sliding_window
	tr.add(0, 5, 100, 2, event.Allowed, nil)
	bucket := func(e *event.Event) { e.Algorithm = policy.TokenBucket }
	tr.add(2000, 12, 100, 1, event.Allowed, bucket) // the reloaded rule
	tr.add(2000, 5, 100, 2, event.Allowed, bucket)
	p := newProducer(t, a.Brokers())
	tr.emit(t, map[uint16]*pipeline.Producer{1: p, 2: p})
	closeProducer(t, p)
	testenv.WaitFor(t, 30*time.Second, "every event consumed", func() bool {
		return getReport(t, a, false).Events >= int64(len(tr.events))
	})
	r := getReport(t, a, true)
	if r.Judged != int64(len(tr.events)) || len(r.ByAlgorithm) != 2 {
		t.Fatalf("judged, algorithms: got %d, %d; want %d, 2", r.Judged, len(r.ByAlgorithm), len(tr.events))
	}

	body := scrape(t, a)
	problems, err := testutil.GatherAndLint(a.reg)
	if err != nil {
		t.Fatalf("gather: got %v, want no error", err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	promtoolCheck(t, body)
	// One series per edge and verdict, the algorithms added up.
	if got := strings.Count(body, `poplimit_aggregator_decisions_total{class="enforced",`); got != 2*3 {
		t.Errorf("decisions_total series: got %d, want 6 (2 edges × 3 verdicts)", got)
	}
	for _, c := range []struct {
		labels []string
		want   int64
	}{
		{[]string{"rule", "api"}, r.Judged},
		{[]string{"rule", "api", "verdict", "wrongly_allowed"}, r.Enforced.WronglyAllowed},
	} {
		if got := testenv.MetricSum(t, a.reg, "poplimit_aggregator_decisions_total", c.labels...); got != float64(c.want) {
			t.Errorf("decisions_total%v: got %v, want %d", c.labels, got, c.want)
		}
	}
	if r.Enforced.WronglyAllowed == 0 {
		t.Errorf("wrongly allowed: got 0, want the sliding window's and the bucket's overshoots")
	}
}

// TestClockBoundsThroughPipeline injects an event 100 years ahead and one
// 100 years behind into a live stream through the pipeline, between two
// phases the aggregator judges after its idle flush: both are counted
// invalid (in /report and on /metrics), and the second phase is judged
// against the first, as without them. Phase 1 leaves key 1 at 9 of 10
// admissions, key 2 at 10, key 3 at 9; phase 2 admits 2 of key 1 (the
// second wrongly), refuses key 2 (rightly) and admits 1 of key 3
// (rightly).
func TestClockBoundsThroughPipeline(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.IdleFlush = 200 * time.Millisecond
	a := startAggregator(t, cfg)
	p := newProducer(t, a.Brokers())
	producers := map[uint16]*pipeline.Producer{1: p, 2: p}
	sent := int64(0)
	phase := func(what string, tr *trace) {
		t.Helper()
		tr.emit(t, producers)
		sent += int64(len(tr.events))
		testenv.WaitFor(t, 30*time.Second, what+" consumed and judged after the idle flush", func() bool {
			r := getReport(t, a, false)
			return r.Events >= sent && r.Buffered == 0
		})
	}

	tr := newTrace()
	tr.add(0, 9, 100, 1, event.Allowed, nil)
	tr.add(0, 10, 100, 2, event.Allowed, nil)
	tr.add(0, 9, 100, 3, event.Allowed, nil)
	phase("phase 1", tr)

	bad := &trace{base: tr.base}
	bad.add(3000, 1, 0, 1, event.Allowed, func(e *event.Event) { e.Time += int64(100 * 365 * 24 * time.Hour) })
	bad.add(3000, 1, 0, 3, event.Allowed, func(e *event.Event) { e.Time -= int64(100 * 365 * 24 * time.Hour) })
	phase("the injected events", bad)

	tr2 := &trace{base: tr.base}
	tr2.add(5000, 2, 100, 1, event.Allowed, nil)
	tr2.add(5000, 1, 0, 2, event.Limited, nil)
	tr2.add(5000, 1, 0, 3, event.Allowed, nil)
	phase("phase 2", tr2)
	closeProducer(t, p)

	r := getReport(t, a, true)
	got := judge.DecisionTally{Decisions: r.Enforced.Decisions, WronglyAllowed: r.Enforced.WronglyAllowed, WronglyLimited: r.Enforced.WronglyLimited}
	if want := (judge.DecisionTally{Decisions: 32, WronglyAllowed: 1}); got != want || r.Late != 0 {
		t.Errorf("enforced, late: got %+v, %d; want %+v, 0", got, r.Late, want)
	}
	if r.Invalid != 2 || r.InvalidBreakdown["future"] != 1 || r.InvalidBreakdown["past"] != 1 {
		t.Errorf("invalid: got %d %v, want 2: 1 future, 1 past", r.Invalid, r.InvalidBreakdown)
	}
	if now := time.Now().UnixNano(); r.Watermark > now {
		t.Errorf("watermark: got %v, want behind the clock (%v)", time.Unix(0, r.Watermark), time.Unix(0, now))
	}
	body := scrape(t, a)
	for _, want := range []string{
		`poplimit_aggregator_invalid_events_total{reason="future"} 1`,
		`poplimit_aggregator_invalid_events_total{reason="past"} 1`,
		`poplimit_aggregator_invalid_events_total{reason="parameters"} 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
