package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
)

// Cloudflare's published accuracy of its rate limiting, from the 2017
// Cloudflare blog post "How we built rate limiting capable of scaling to
// millions of domains": over 400 million requests, 0.003 % were wrongly
// allowed or blocked, and the sources wrongly allowed were under 15 % over
// their limit.
const (
	cloudflarePost       = `"How we built rate limiting capable of scaling to millions of domains" (Cloudflare blog, 2017)`
	cloudflareRequests   = 400_000_000
	cloudflareWrongRatio = 0.00003 // 0.003 %
	cloudflareOverLimit  = 1.15    // wrongly allowed sources under 15 % over their limit
)

// ruleAccuracy is one rule's line of the summary.
type ruleAccuracy struct {
	rule                          string
	decisions, wAllowed, wLimited int64
	wrongRatio                    float64
	worstKey                      float64 // the worst wrongly allowed key's exact count ÷ its limit; 0: none
	worstBounded                  bool    // worstKey is an upper bound: the rule's keys are past the listed ones
}

// accuracyByRule reads the judge's report, as the aggregator serves it, per
// rule: enforced decisions from ByRule, the worst key from the false
// negatives listed (most severe first, so a rule's first is its worst).
func accuracyByRule(r *judge.Report) (rows []ruleAccuracy, total ruleAccuracy) {
	worst := map[string]float64{}
	for _, k := range r.TopFalseNegatives {
		worst[k.Rule] = max(worst[k.Rule], k.Ratio)
	}
	// The list is cut at -top-keys: a rule absent from a full list had its
	// keys below the last one listed.
	floor := 0.0
	if n := len(r.TopFalseNegatives); n > 0 && int64(n) < r.FalseNegativeKeys {
		floor = r.TopFalseNegatives[n-1].Ratio
	}
	for _, b := range r.ByRule {
		e := b.Enforced
		ra := ruleAccuracy{rule: b.Name, decisions: e.Decisions, wAllowed: e.WronglyAllowed, wLimited: e.WronglyLimited,
			wrongRatio: e.WrongRatio, worstKey: worst[b.Name]}
		if ra.wAllowed > 0 && ra.worstKey == 0 && floor > 0 {
			ra.worstKey, ra.worstBounded = floor, true
		}
		rows = append(rows, ra)
	}
	e := r.Enforced
	total = ruleAccuracy{rule: "all rules", decisions: e.Decisions, wAllowed: e.WronglyAllowed, wLimited: e.WronglyLimited, wrongRatio: e.WrongRatio}
	for _, ra := range rows {
		if ra.worstKey > total.worstKey {
			total.worstKey, total.worstBounded = ra.worstKey, ra.worstBounded
		}
	}
	return rows, total
}

// writeSummary writes the PoP's end summary: per rule, the decisions the
// aggregator judged, the wrong ones, and the worst key, next to
// Cloudflare's published figures.
func writeSummary(w io.Writer, rep *loadtest.ReplayReport, windows map[string]time.Duration) error {
	var b bytes.Buffer
	b.WriteString("pop: summary: every enforced decision of both edges, judged by the aggregator against the exact count\n")
	if !rep.Start.IsZero() {
		fmt.Fprintf(&b, "pop:   replay start %s: %s\n", rep.Start.UTC().Format(time.RFC3339Nano), phaseText(rep, windows))
	}
	var jr judge.Report
	switch {
	case rep.AggregatorError != "":
		fmt.Fprintf(&b, "pop:   no accuracy report: %s\n", rep.AggregatorError)
		_, err := w.Write(b.Bytes())
		return err
	case len(rep.Aggregator) == 0:
		b.WriteString("pop:   no accuracy report\n")
		_, err := w.Write(b.Bytes())
		return err
	}
	if err := json.Unmarshal(rep.Aggregator, &jr); err != nil {
		fmt.Fprintf(&b, "pop:   accuracy report not understood: %v\n", err)
		_, err := w.Write(b.Bytes())
		return err
	}
	rows, total := accuracyByRule(&jr)
	const cfRow = "Cloudflare, 2017"
	width := len(cfRow)
	for _, ra := range rows {
		width = max(width, len(ra.rule))
	}
	row := func(name, decisions, wa, wl, wrong, worst string) {
		fmt.Fprintf(&b, "  %-*s %12s %16s %16s %9s %18s\n", width, name, decisions, wa, wl, wrong, worst)
	}
	line := func(ra ruleAccuracy) {
		row(ra.rule, strconv.FormatInt(ra.decisions, 10), strconv.FormatInt(ra.wAllowed, 10), strconv.FormatInt(ra.wLimited, 10),
			percent(ra.wrongRatio), worstText(ra))
	}
	row("rule", "decisions", "wrongly allowed", "wrongly limited", "wrong", "worst key÷limit")
	for _, ra := range rows {
		line(ra)
	}
	line(total)
	row(cfRow, groupDigits(cloudflareRequests), "", "", percent(cloudflareWrongRatio), "< "+ratio(cloudflareOverLimit))
	fmt.Fprintf(&b, "  Cloudflare's figures: %s: 0.003%% of 400 million requests wrongly allowed or blocked;\n", cloudflarePost)
	b.WriteString("  the sources wrongly allowed were under 15% over their limit.\n")
	verdict := "above"
	if total.wrongRatio <= cloudflareWrongRatio {
		verdict = "within"
	}
	keyVerdict := "no key was wrongly allowed"
	if total.worstKey > 0 {
		keyVerdict = fmt.Sprintf("the worst wrongly allowed key reached %s its limit (%s Cloudflare's 15%% over)",
			worstText(total), map[bool]string{true: "within", false: "beyond"}[total.worstKey < cloudflareOverLimit])
	}
	fmt.Fprintf(&b, "  this PoP: %s wrong over %d decisions, %s Cloudflare's 0.003%%; %s.\n", percent(total.wrongRatio), total.decisions, verdict, keyVerdict)
	if jr.Late > 0 || jr.WrongKeysTruncated {
		fmt.Fprintf(&b, "  (%d events arrived too late to be judged; wrong keys truncated: %v)\n", jr.Late, jr.WrongKeysTruncated)
	}
	writeScopes(&b, &jr)
	_, err := w.Write(b.Bytes())
	return err
}

// writeScopes adds, when the edges have PoPs, the decisions by scope (a
// global rule's keys judged across every PoP, a pop rule's in each) and
// by PoP.
func writeScopes(b *bytes.Buffer, jr *judge.Report) {
	if len(jr.ByPop) < 2 && !slices.ContainsFunc(jr.ByScope, func(s judge.Breakdown) bool { return s.Name == "global" }) {
		return
	}
	for _, s := range jr.ByScope {
		what := "each key judged within its PoP"
		if s.Name == "global" {
			what = "each key judged across every PoP: the limit held for clients that reach several"
		}
		e := s.Enforced
		fmt.Fprintf(b, "  scope %-6s %12d decisions, %s wrong (%d allowed, %d limited): %s\n", s.Name, e.Decisions,
			percent(e.WrongRatio), e.WronglyAllowed, e.WronglyLimited, what)
	}
	for _, p := range jr.ByPop {
		fmt.Fprintf(b, "  PoP %-8q %12d decisions, %s wrong\n", p.Name, p.Enforced.Decisions, percent(p.Enforced.WrongRatio))
	}
}

// phaseText says where the replay's start fell in each window grid of the
// rules: windows start at multiples of their length since the Unix epoch.
func phaseText(rep *loadtest.ReplayReport, windows map[string]time.Duration) string {
	var ws []time.Duration
	for _, w := range windows {
		if w > 0 && !slices.Contains(ws, w) {
			ws = append(ws, w)
		}
	}
	slices.Sort(ws)
	s := "not aligned (pop -align W -phase D sets it)"
	if rep.AlignMillis > 0 {
		s = fmt.Sprintf("-align %s -phase %s", time.Duration(rep.AlignMillis*1e6), time.Duration(rep.PhaseMillis*1e6))
	}
	for i, w := range ws {
		sep := "; phase "
		if i > 0 {
			sep = ", "
		}
		p := time.Duration(rep.Start.UnixNano() % int64(w)).Round(time.Millisecond)
		s += fmt.Sprintf("%s%s into the %s windows", sep, p, w)
	}
	return s
}

func worstText(ra ruleAccuracy) string {
	switch {
	case ra.worstKey == 0:
		return "-"
	case ra.worstBounded:
		return "≤ " + ratio(ra.worstKey)
	}
	return ratio(ra.worstKey)
}

func ratio(r float64) string { return strconv.FormatFloat(r, 'f', 3, 64) + "×" }

func percent(r float64) string { return strconv.FormatFloat(100*r, 'f', 4, 64) + "%" }

// groupDigits writes n with thin groups of three digits: 400,000,000.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
