package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/poplimit/poplimit/internal/plotpage"
)

// pageAccuracy is the part of the aggregator's /report the page shows; the
// field names are the aggregator's JSON (judge.Report).
type pageAccuracy struct {
	accuracy
	ByRule []struct {
		Name     string `json:"name"`
		Enforced struct {
			Decisions      int64 `json:"decisions"`
			WronglyAllowed int64 `json:"wrongly_allowed"`
			WronglyLimited int64 `json:"wrongly_limited"`
		} `json:"enforced"`
	} `json:"by_rule"`
}

// Totals are the headline figures of a replay, as its text report gives
// them; the page shows these and carries them as data attributes.
type Totals struct {
	Scheduled, Sent, Completed, NotSent int64
	Allowed                             int64 // 2xx
	Limited                             int64 // 429
	OtherStatus                         int64
	Errors                              int64
}

// Totals returns r's headline counts.
func (r *ReplayReport) Totals() Totals {
	t := Totals{Scheduled: r.Scheduled, Sent: r.Sent, Completed: r.Completed, NotSent: r.NotSent, Errors: sumValues(r.Errors)}
	for k, n := range r.Statuses {
		s, err := strconv.Atoi(k)
		switch {
		case err == nil && s >= 200 && s < 300:
			t.Allowed += n
		case s == 429:
			t.Limited += n
		}
	}
	t.OtherStatus = t.Completed - t.Allowed - t.Limited
	return t
}

// WritePage writes the replay's page: one self-contained HTML file with
// its settings, requests per second by outcome, latency over time, and per
// rule the judged decisions and the worst keys' admitted count in every
// trailing window against the limit, on the window grid. tl is the
// replay's Timeline (ReplayConfig.Timeline or ReadResults).
func WritePage(w io.Writer, r *ReplayReport, tl *Timeline) error {
	if tl == nil {
		tl = &Timeline{Start: r.Start, StepSeconds: 1}
	}
	tot := r.Totals()
	var acc *pageAccuracy
	if len(r.Aggregator) > 0 {
		acc = &pageAccuracy{}
		if err := json.Unmarshal(r.Aggregator, acc); err != nil {
			acc = nil
		}
	}
	pg := &plotpage.Page{
		Title: fmt.Sprintf("poplimit replay: %d requests over %s", r.Scheduled, seconds(r.ElapsedSeconds)),
		Data: map[string]string{
			"scheduled": itoa(tot.Scheduled), "sent": itoa(tot.Sent), "completed": itoa(tot.Completed),
			"not-sent": itoa(tot.NotSent), "allowed": itoa(tot.Allowed), "limited": itoa(tot.Limited),
			"other-status": itoa(tot.OtherStatus), "errors": itoa(tot.Errors),
			"latency-p50-ms": ftoa(r.Latency.P50Millis), "latency-p99-ms": ftoa(r.Latency.P99Millis),
			"latency-max-ms": ftoa(r.Latency.MaxMillis),
		},
	}
	spread := r.Spread
	if spread == "" {
		spread = "unknown (not in the results file)"
	}
	speed := "unknown (not in the results file)"
	if r.Speed > 0 {
		speed = strconv.FormatFloat(r.Speed, 'g', -1, 64) + "×"
	}
	pg.Settings = [][2]string{
		{"targets", strings.Join(r.Targets, ", ")},
		{"spread", spread},
		{"speed", speed},
		{"start", r.startText()},
		{"phase", phaseText(r)},
		{"stopped", orUnknown(r.Stopped)},
		{"rules", rulesText(tl)},
	}

	// Totals, as the text report gives them.
	totals := plotpage.FigureTable{ID: "totals",
		Head: []string{"requests due", "sent", "completed", "allowed (2xx)", "limited (429)", "other statuses", "transport errors", "not sent (outstanding bound)"},
		Rows: [][]string{{itoa(tot.Scheduled), itoa(tot.Sent), itoa(tot.Completed), itoa(tot.Allowed), itoa(tot.Limited), itoa(tot.OtherStatus), itoa(tot.Errors), itoa(tot.NotSent)}}}
	summary := plotpage.Section{Heading: "Requests", Tables: []plotpage.FigureTable{totals}, Text: []string{
		"Latency " + r.Latency.text() + " (from the scheduled send time); send lag " + r.SendLag.text() + ".",
		fmt.Sprintf("Throughput: scheduled %.1f/s, sent %.1f/s, completed %.1f/s.", r.ScheduledRate, r.SentRate, r.CompletedRate),
	}}

	step := tl.StepSeconds
	xs := make([]float64, len(tl.Steps))
	per := func(get func(*Step) int64) ([]float64, []int64) {
		ys, ns := make([]float64, len(tl.Steps)), make([]int64, len(tl.Steps))
		for i := range tl.Steps {
			ns[i] = get(&tl.Steps[i])
			ys[i] = float64(ns[i]) / step
		}
		return ys, ns
	}
	for i := range xs {
		xs[i] = float64(i) * step
	}
	// A step function needs its last step closed: one more point.
	closed := func(ys []float64) ([]float64, []float64) {
		if len(ys) == 0 {
			return nil, nil
		}
		return append(xs[:len(xs):len(xs)], float64(len(xs))*step), append(ys[:len(ys):len(ys)], ys[len(ys)-1])
	}
	outcomes := plotpage.Chart{ID: "outcomes", Title: "Requests per second by outcome", XLabel: "seconds since the start",
		YLabel: "requests/s", YZero: true, Data: map[string]string{"step-seconds": ftoa(step)},
		Caption: fmt.Sprintf("By each request's scheduled time, in steps of %s. Allowed: 2xx; limited: 429; errors: transport errors (no answer).", seconds(step))}
	for _, o := range []struct {
		name   string
		color  int
		get    func(*Step) int64
		total  int64
		always bool
	}{
		{"allowed", 1, func(s *Step) int64 { return s.Allowed }, tot.Allowed, true},
		{"limited", 2, func(s *Step) int64 { return s.Limited }, tot.Limited, true},
		{"errors", 3, func(s *Step) int64 { return s.Errors }, tot.Errors, true},
		{"other status", 4, func(s *Step) int64 { return s.OtherStatus }, tot.OtherStatus, false},
		{"not sent", 6, func(s *Step) int64 { return s.NotSent }, tot.NotSent, false},
	} {
		ys, ns := per(o.get)
		outcomes.Data[plotpage.AttrName(o.name)] = plotpage.Ints(ns)
		if !o.always && o.total == 0 {
			continue
		}
		x, y := closed(ys)
		outcomes.Series = append(outcomes.Series, plotpage.Series{Name: o.name, X: x, Y: y, Step: true, Color: o.color})
	}
	latency := plotpage.Chart{ID: "latency", Title: "Latency (from the scheduled send time)", XLabel: "seconds since the start",
		YLabel: "milliseconds", YZero: true, Data: map[string]string{},
		Caption: "Per step, of the requests answered: p50, p99 and max (HDR histograms of two significant digits per step)."}
	for i, q := range []struct {
		name string
		get  func(*Step) float64
	}{{"p50", func(s *Step) float64 { return s.P50Millis }}, {"p99", func(s *Step) float64 { return s.P99Millis }},
		{"max", func(s *Step) float64 { return s.MaxMillis }}} {
		ys := make([]float64, len(tl.Steps))
		for j := range tl.Steps {
			ys[j] = q.get(&tl.Steps[j])
		}
		latency.Data[q.name+"-ms"] = plotpage.Floats(ys)
		x, y := closed(ys)
		latency.Series = append(latency.Series, plotpage.Series{Name: q.name, X: x, Y: y, Step: true, Color: 4 + i})
	}
	summary.Charts = []plotpage.Chart{outcomes, latency}
	pg.Sections = append(pg.Sections, summary)
	rs := rulesSection(r, tl, acc)
	if tl.Truncated > 0 {
		rs.Text = append(rs.Text, fmt.Sprintf("The keys' windows leave out %d admitted requests: more than %d were kept, the bound of the page's memory.", tl.Truncated, MaxTimelineAdmits))
	}
	pg.Sections = append(pg.Sections, rs)
	for i := range tl.Rules {
		if s, ok := keysSection(r, tl, &tl.Rules[i]); ok {
			pg.Sections = append(pg.Sections, s)
		}
	}
	return pg.WriteHTML(w)
}

// rulesSection is the rules' decisions, as the responses told them and as
// the aggregator judged them.
func rulesSection(r *ReplayReport, tl *Timeline, acc *pageAccuracy) plotpage.Section {
	s := plotpage.Section{Heading: "Rules"}
	t := plotpage.FigureTable{ID: "rules", Head: []string{"rule", "limit", "allowed", "limited", "limited %", "judged", "wrongly allowed", "wrongly limited"}}
	var bars plotpage.Bars
	wa, wl := plotpage.BarSet{Name: "wrongly allowed", Color: 2}, plotpage.BarSet{Name: "wrongly limited", Color: 3}
	for _, rc := range r.Rules {
		name := rc.Rule
		if name == "" {
			name = "(none)"
		}
		limit := "-"
		for _, rt := range tl.Rules {
			if rt.Rule == rc.Rule && rt.Limit >= 0 && rt.WindowSeconds > 0 {
				limit = fmt.Sprintf("%d per %s", rt.Limit, windowText(rt.WindowSeconds))
			}
		}
		row := []string{name, limit, itoa(rc.Allowed), itoa(rc.Limited), fmt.Sprintf("%.2f", pct(rc.Limited, rc.Allowed+rc.Limited)), "-", "-", "-"}
		data := map[string]string{"rule": rc.Rule, "allowed": itoa(rc.Allowed), "limited": itoa(rc.Limited)}
		if acc != nil {
			for _, br := range acc.ByRule {
				if br.Name == rc.Rule && rc.Rule != "" {
					e := br.Enforced
					row[5], row[6], row[7] = itoa(e.Decisions), itoa(e.WronglyAllowed), itoa(e.WronglyLimited)
					data["judged"], data["wrongly-allowed"], data["wrongly-limited"] = itoa(e.Decisions), itoa(e.WronglyAllowed), itoa(e.WronglyLimited)
					bars.Categories = append(bars.Categories, rc.Rule)
					wa.Values = append(wa.Values, float64(e.WronglyAllowed))
					wl.Values = append(wl.Values, float64(e.WronglyLimited))
				}
			}
		}
		t.Rows = append(t.Rows, row)
		t.Data = append(t.Data, data)
	}
	s.Tables = []plotpage.FigureTable{t}
	switch {
	case r.AggregatorError != "":
		s.Text = append(s.Text, "The aggregator's report was unavailable: "+r.AggregatorError+". The decisions were not judged.")
	case acc == nil:
		s.Text = append(s.Text, "No aggregator report (replay -aggregator URL): the decisions were not judged.")
	default:
		e := acc.Enforced
		s.Text = append(s.Text, fmt.Sprintf("The aggregator judged %d decisions (%d late): wrongly allowed %d, wrongly limited %d, wrong %.4f%%; mean relative error of the estimate %.2f%%; keys wrongly allowed %d, wrongly limited %d.",
			e.Decisions, acc.Late, e.WronglyAllowed, e.WronglyLimited, 100*e.WrongRatio, 100*acc.MeanRelativeError, acc.FalseNegativeKeys, acc.FalsePositiveKeys))
		bars.Sets = []plotpage.BarSet{wa, wl}
		s.Charts = []plotpage.Chart{{ID: "judged", Title: "Judged decisions: wrong ones per rule", YLabel: "decisions", Bars: &bars, Height: 240,
			Data:    map[string]string{"judged": itoa(e.Decisions), "wrongly-allowed": itoa(e.WronglyAllowed), "wrongly-limited": itoa(e.WronglyLimited)},
			Caption: "From the aggregator's report (by_rule, enforced): each decision replayed against the exact count of its key."}}
	}
	return s
}

// keysSection draws a rule's worst keys in their trailing windows.
func keysSection(r *ReplayReport, tl *Timeline, rt *RuleTimeline) (plotpage.Section, bool) {
	if len(rt.Keys) == 0 || rt.WindowSeconds <= 0 {
		return plotpage.Section{}, false
	}
	win := time.Duration(rt.WindowSeconds) * time.Second
	wt := windowText(rt.WindowSeconds)
	s := plotpage.Section{Heading: fmt.Sprintf("Rule %s: the worst keys in every trailing %s window", rt.Rule, wt)}
	c := plotpage.Chart{ID: "keys-" + plotpage.AttrName(rt.Rule), Title: fmt.Sprintf("%s: admitted in the trailing %s, worst %d keys", rt.Rule, wt, len(rt.Keys)),
		XLabel: "seconds since the start", YLabel: "admitted in the window", YZero: true,
		Data:    map[string]string{"rule": rt.Rule, "limit": itoa(rt.Limit), "window-seconds": itoa(rt.WindowSeconds)},
		Caption: fmt.Sprintf("Requests the rule allowed, by the time they were sent, within the %s ending at each instant; the dashed line is the limit, the grey lines the window grid (multiples of %s since the Unix epoch).", wt, wt)}
	if rt.Limit >= 0 {
		c.HLines = []plotpage.Marker{{At: float64(rt.Limit), Label: fmt.Sprintf("limit %d", rt.Limit), Color: 3}}
	}
	t := plotpage.FigureTable{ID: "keys-table-" + plotpage.AttrName(rt.Rule), Head: []string{"key (client)", "admitted", "most in a trailing window", "limit", "× limit"}}
	var xmax float64
	var worst int64
	for i, k := range rt.Keys {
		c.Series = append(c.Series, plotpage.Series{Name: k.Key, X: k.T, Y: k.Count, Step: true, Color: 4 + i})
		if n := len(k.T); n > 0 {
			xmax = math.Max(xmax, k.T[n-1])
		}
		worst = max(worst, k.MaxInWindow)
		ratio := "-"
		if rt.Limit > 0 {
			ratio = fmt.Sprintf("%.3f", float64(k.MaxInWindow)/float64(rt.Limit))
		}
		t.Rows = append(t.Rows, []string{k.Key, itoa(k.Admitted), itoa(k.MaxInWindow), itoa(rt.Limit), ratio})
		t.Data = append(t.Data, map[string]string{"key": k.Key, "admitted": itoa(k.Admitted), "max-in-window": itoa(k.MaxInWindow)})
	}
	c.Data["worst-max-in-window"] = itoa(worst)
	// The window grid: multiples of the window since the epoch, from the
	// start's, in seconds since the start.
	w := int64(win)
	st := tl.Start.UnixNano()
	first := (st/w + 1) * w
	if st%w == 0 {
		first = st
	}
	for at := first; float64(at-st)/1e9 <= xmax && len(c.Grid) < 2000; at += w {
		c.Grid = append(c.Grid, float64(at-st)/1e9)
	}
	s.Tables = []plotpage.FigureTable{t}
	s.Charts = []plotpage.Chart{c}
	return s, true
}

func phaseText(r *ReplayReport) string {
	if r.AlignMillis <= 0 {
		return "not aligned to a window grid"
	}
	return fmt.Sprintf("%s against a %s window grid", time.Duration(math.Round(r.PhaseMillis*1e6)), time.Duration(math.Round(r.AlignMillis*1e6)))
}

func rulesText(tl *Timeline) string {
	var parts []string
	for _, rt := range tl.Rules {
		if rt.Rule == "" {
			continue
		}
		if rt.Limit >= 0 && rt.WindowSeconds > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d per %s", rt.Rule, rt.Limit, windowText(rt.WindowSeconds)))
		} else {
			parts = append(parts, rt.Rule+": quota not in the responses")
		}
	}
	if len(parts) == 0 {
		return "none named in the responses"
	}
	return strings.Join(parts, "; ") + " (from the responses' RateLimit-Policy fields)"
}

// windowText is a window of sec seconds as a rules file writes it: 10s,
// 1m, 1h.
func windowText(sec int64) string {
	switch {
	case sec >= 3600 && sec%3600 == 0:
		return itoa(sec/3600) + "h"
	case sec >= 60 && sec%60 == 0:
		return itoa(sec/60) + "m"
	}
	return itoa(sec) + "s"
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown (not in the results file)"
	}
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
