package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/aggregator"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/plotpage/pagetest"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
)

// pageRules: a per-client rule that the near-limit clients are at and
// over, and an API rule of a longer window.
const pageRules = `
rules:
  - name: api
    path_prefix: /api
    limit: 40
    window: 4s
  - name: per-client
    limit: 10
    window: 2s
`

// startPoP starts an aggregator with its embedded broker and an edge that
// sends its decisions there, on loopback ports of their own.
func startPoP(t *testing.T) (target, reportURL string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	agg, err := aggregator.Start(ctx, aggregator.Config{Listen: "127.0.0.1:0", Embedded: "127.0.0.1:0", IdleFlush: 200 * time.Millisecond},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { agg.Close(); cancel() })
	var o edge.Options
	o.Brokers = agg.Brokers()
	o.Server.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	e := edgetest.Start(t, pageRules, o)
	return e.Addr(), "http://" + agg.Addr() + "/report"
}

// pageTrace is near-limit clients of the per-client rule, half of their
// requests under /api.
func pageTrace(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	tr, err := loadtest.NearLimit(loadtest.NearLimitConfig{Seed: 4, Clients: 30, Limit: 10, Window: 2 * time.Second, Duration: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	api := func(yield func(loadtest.TraceRequest, error) bool) {
		for r, err := range tr {
			if i++; i%2 == 0 {
				r.Path = "/api/x"
			}
			if !yield(r, err) {
				return
			}
		}
	}
	if _, _, err := loadtest.WriteTrace(&b, api); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// pageFigures are the figures the page carries as data attributes, read
// in the browser.
type pageFigures struct {
	Totals   map[string]string   `json:"totals"`
	Outcomes map[string]string   `json:"outcomes"`
	Rules    []map[string]string `json:"rules"`
	Judged   map[string]string   `json:"judged"`
	Keys     []map[string]string `json:"keys"`
}

const readFigures = `(() => {
	const d = e => {
		const o = {};
		if (e) for (const n of e.getAttributeNames()) if (n.startsWith('data-')) o[n.slice(5)] = e.getAttribute(n);
		return o;
	};
	return {
		totals: d(document.querySelector('main')),
		outcomes: d(document.getElementById('outcomes')),
		rules: Array.from(document.querySelectorAll('#rules tr[data-rule]')).map(d),
		judged: d(document.getElementById('judged')),
		keys: Array.from(document.querySelectorAll('figure[id^="keys-"]')).map(d),
	};
})()`

func sumList(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("series %q: %v", s, err)
		}
		n += v
	}
	return n
}

// checkPage opens the page in Chromium and checks that its figures, and
// the sums of the series it plots, are the report's and the aggregator's.
func checkPage(t *testing.T, path string, rep *loadtest.ReplayReport, shot string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d bytes", path, st.Size())
	b := pagetest.Open(t, path, 1100, 1400, 4)
	var f pageFigures
	b.Eval(readFigures, &f)
	tot := rep.Totals()
	want := map[string]int64{"scheduled": tot.Scheduled, "sent": tot.Sent, "completed": tot.Completed, "allowed": tot.Allowed,
		"limited": tot.Limited, "errors": tot.Errors, "not-sent": tot.NotSent, "other-status": tot.OtherStatus}
	for k, v := range want {
		if f.Totals[k] != strconv.FormatInt(v, 10) {
			t.Errorf("page total %s = %q, report %d", k, f.Totals[k], v)
		}
	}
	for _, k := range []string{"allowed", "limited", "errors", "not-sent", "other-status"} {
		if got := sumList(t, f.Outcomes[k]); got != want[k] {
			t.Errorf("the outcomes chart plots %d %s, the report says %d", got, k, want[k])
		}
	}
	if f.Totals["latency-p99-ms"] != strconv.FormatFloat(rep.Latency.P99Millis, 'g', -1, 64) {
		t.Errorf("page p99 %q, report %v ms", f.Totals["latency-p99-ms"], rep.Latency.P99Millis)
	}
	rules := map[string]loadtest.RuleCount{}
	for _, rc := range rep.Rules {
		rules[rc.Rule] = rc
	}
	if len(f.Rules) != len(rep.Rules) {
		t.Errorf("page rules %v, report %v", f.Rules, rep.Rules)
	}
	for _, r := range f.Rules {
		rc := rules[r["rule"]]
		if r["allowed"] != strconv.FormatInt(rc.Allowed, 10) || r["limited"] != strconv.FormatInt(rc.Limited, 10) {
			t.Errorf("page rule %v, report %+v", r, rc)
		}
	}
	// The judged decisions are the aggregator's, per rule and in all.
	var agg judge.Report // the aggregator's /report, read as the aggregator writes it
	if err := json.Unmarshal(rep.Aggregator, &agg); err != nil {
		t.Fatalf("the aggregator's report: %v (%s)", err, rep.AggregatorError)
	}
	if agg.Enforced.Decisions == 0 {
		t.Errorf("the aggregator judged nothing: %s", rep.Aggregator)
	}
	if f.Judged["judged"] != strconv.FormatInt(agg.Enforced.Decisions, 10) || f.Judged["wrongly-allowed"] != strconv.FormatInt(agg.Enforced.WronglyAllowed, 10) ||
		f.Judged["wrongly-limited"] != strconv.FormatInt(agg.Enforced.WronglyLimited, 10) {
		t.Errorf("page judged %v, aggregator %+v", f.Judged, agg.Enforced)
	}
	for _, br := range agg.ByRule {
		found := false
		for _, r := range f.Rules {
			if r["rule"] == br.Name {
				found = true
				if r["judged"] != strconv.FormatInt(br.Enforced.Decisions, 10) || r["wrongly-allowed"] != strconv.FormatInt(br.Enforced.WronglyAllowed, 10) ||
					r["wrongly-limited"] != strconv.FormatInt(br.Enforced.WronglyLimited, 10) {
					t.Errorf("page rule %v, aggregator %+v", r, br)
				}
			}
		}
		if !found {
			t.Errorf("rule %s judged by the aggregator is not on the page", br.Name)
		}
	}
	// Both rules drawn with their worst keys, on their windows.
	if len(f.Keys) != 2 {
		t.Errorf("key charts %v, want one per rule", f.Keys)
	}
	for _, k := range f.Keys {
		if k["rule"] == "per-client" && (k["limit"] != "10" || k["window-seconds"] != "2") || k["worst-max-in-window"] == "" || k["worst-max-in-window"] == "0" {
			t.Errorf("key chart %v", k)
		}
	}
	if shot != "" {
		if err := os.WriteFile(shot, b.Screenshot(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// replay -html draws a replay through a real edge and aggregator, and
// report -html the same page from its -results file; the figures of both
// pages are those of the text report and of the aggregator.
// POPLIMIT_PAGE_SCREENSHOT=FILE.png keeps the browser's screenshot of the
// page, POPLIMIT_PAGE_KEEP=FILE.html the page.
func TestReplayPage(t *testing.T) {
	target, reportURL := startPoP(t)
	dir := t.TempDir()
	results, page, page2, jsonRep := filepath.Join(dir, "results.tsv"), filepath.Join(dir, "replay.html"), filepath.Join(dir, "report.html"), filepath.Join(dir, "replay.json")
	out, errOut, err := runCmd(t, pageTrace(t), "replay", "-targets", target, "-aggregator", reportURL, "-aggregator-wait", "3s",
		"-align", "2s", "-phase", "500ms", "-results", results, "-html", page, "-json")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	var rep loadtest.ReplayReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if err := os.WriteFile(jsonRep, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	tot := rep.Totals()
	t.Logf("%d requests: %d allowed, %d limited, %d errors", rep.Scheduled, tot.Allowed, tot.Limited, tot.Errors)
	if tot.Allowed == 0 || tot.Limited == 0 || rep.Scheduled < 300 {
		t.Fatalf("the replay was not a test: %+v", tot)
	}
	checkPage(t, page, &rep, os.Getenv("POPLIMIT_PAGE_SCREENSHOT"))
	if p := os.Getenv("POPLIMIT_PAGE_KEEP"); p != "" {
		data, err := os.ReadFile(page)
		if err == nil {
			err = os.WriteFile(p, data, 0o644)
		}
		if err != nil {
			t.Error(err)
		}
	}

	// report -html: the same figures from the results file, and the same
	// text report but for what the file does not hold.
	text, errOut, err := runCmd(t, "", "report", "-results", results, "-replay-json", jsonRep, "-html", page2, "-json")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	var rebuilt loadtest.ReplayReport
	if err := json.Unmarshal([]byte(text), &rebuilt); err != nil {
		t.Fatalf("%v in %s", err, text)
	}
	// The histograms hold the same requests. A value may differ by a
	// microsecond: the replay measures durations on the monotonic clock,
	// the file holds wall-clock instants, and the wall clock may be slewed
	// meanwhile. The means differ in the fifth digit too (the replay
	// merges eight shards, whose sums round differently).
	for _, l := range [][2]loadtest.Latency{{rebuilt.Latency, rep.Latency}, {rebuilt.SendLag, rep.SendLag}} {
		got, want := l[0], l[1]
		if got.Count != want.Count {
			t.Errorf("rebuilt from the results file: %d durations, the replay's %d", got.Count, want.Count)
		}
		for i, m := range [][2]float64{{got.P50Millis, want.P50Millis}, {got.P90Millis, want.P90Millis}, {got.P99Millis, want.P99Millis},
			{got.P999Millis, want.P999Millis}, {got.MaxMillis, want.MaxMillis}, {got.MeanMillis, want.MeanMillis}} {
			if math.Abs(m[0]-m[1]) > max(0.002, 1e-3*m[1]) {
				t.Errorf("figure %d rebuilt from the results file %v ms, the replay's %v ms (%+v, %+v)", i, m[0], m[1], got, want)
			}
		}
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{{"totals", rebuilt.Totals(), tot},
		{"rules", rebuilt.Rules, rep.Rules}, {"statuses", rebuilt.Statuses, rep.Statuses}, {"errors", rebuilt.Errors, rep.Errors}} {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s rebuilt from the results file: %+v, the replay's %+v", c.what, c.got, c.want)
		}
	}
	checkPage(t, page2, &rep, "")
}
