package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the report for an operator: throughput, latency,
// decisions, and the headline of the aggregator's accuracy report (the
// whole of it is in the JSON form).
func (r *ReplayReport) WriteText(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "replay: %d requests due over %s to %s (%s), speed %g×, stopped: %s\n",
		r.Scheduled, seconds(r.ElapsedSeconds), strings.Join(r.Targets, ", "), r.Spread, r.Speed, r.Stopped)
	if !r.Start.IsZero() {
		fmt.Fprintf(&b, "  start        %s\n", r.startText())
	}
	fmt.Fprintf(&b, "  throughput   scheduled %.1f/s  sent %.1f/s  completed %.1f/s\n", r.ScheduledRate, r.SentRate, r.CompletedRate)
	fmt.Fprintf(&b, "  requests     sent %d  completed %d  not sent (outstanding bound) %d  errors %d  bad trace lines %d\n",
		r.Sent, r.Completed, r.NotSent, sumValues(r.Errors), r.BadLines)
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(&b, "    error %s: %d\n", k, r.Errors[k])
	}
	fmt.Fprintf(&b, "  latency      %s  (from the scheduled send time)\n", r.Latency.text())
	fmt.Fprintf(&b, "  send lag     %s\n", r.SendLag.text())
	b.WriteString("  statuses    ")
	keys := slices.Sorted(maps.Keys(r.Statuses))
	if len(keys) == 0 {
		b.WriteString(" none")
	}
	for _, k := range keys {
		fmt.Fprintf(&b, " %s: %d", k, r.Statuses[k])
	}
	b.WriteString("\n")
	if len(r.Rules) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "  rule\tallowed\tlimited\tlimited %%\t\n")
		for _, rc := range r.Rules {
			name := rc.Rule
			if name == "" {
				name = "(none)"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%.2f\t\n", name, rc.Allowed, rc.Limited, pct(rc.Limited, rc.Allowed+rc.Limited))
		}
		tw.Flush()
	}
	switch {
	case r.AggregatorError != "":
		fmt.Fprintf(&b, "  aggregator   unavailable: %s\n", r.AggregatorError)
	case len(r.Aggregator) > 0:
		writeAccuracy(&b, r.Aggregator)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// startText says when the replay started and at which phase of which
// window grid.
func (r *ReplayReport) startText() string {
	start := r.Start.UTC().Format(time.RFC3339Nano)
	if r.AlignMillis <= 0 {
		return start + ", not aligned to a window grid (-align W [-phase D] puts offset 0 D past a multiple of W)"
	}
	align := time.Duration(math.Round(r.AlignMillis * 1e6))
	phase := time.Duration(math.Round(r.PhaseMillis * 1e6))
	return fmt.Sprintf("%s, phase %s against a %s window grid (offset 0 is %s past a multiple of %s)", start, phase, align, phase, align)
}

func (l Latency) text() string {
	if l.Count == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (n=%d)",
		millis(l.P50Millis), millis(l.P90Millis), millis(l.P99Millis), millis(l.P999Millis), millis(l.MaxMillis), l.Count)
}

func millis(ms float64) string {
	switch {
	case ms >= 1000:
		return strconv.FormatFloat(ms/1000, 'f', 2, 64) + "s"
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64) + "ms"
	}
	return strconv.FormatFloat(ms, 'f', 3, 64) + "ms"
}

func seconds(s float64) string {
	return (time.Duration(s * 1e9)).Round(time.Millisecond).String()
}

func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func sumValues(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// WriteText writes the offline report for an operator: per rule, what it
// would have limited and whom.
func (r *OfflineReport) WriteText(w io.Writer) error {
	var b bytes.Buffer
	span := time.Duration(r.SpanMs * 1e6).Round(time.Millisecond)
	fmt.Fprintf(&b, "offline: %d requests over %s", r.Requests, span)
	if r.Absolute {
		fmt.Fprintf(&b, " from %s", r.Origin.Format(time.RFC3339))
	}
	fmt.Fprintf(&b, ": allowed %d, limited %d (%.2f%%), denied %d, no rule %d, bad trace lines %d\n",
		r.Allowed, r.Limited, pct(r.Limited, r.Requests), r.Denied, r.Unmatched, r.BadLines)
	if len(r.Accuracy) > 0 {
		writeAccuracy(&b, r.Accuracy)
	}
	for _, rr := range r.Rules {
		shadow := ""
		if rr.Shadow {
			shadow = ", shadow: would have"
		}
		fmt.Fprintf(&b, "\nrule %s (%s %s %s, %d per %s%s)\n", rr.Rule, rr.Mode, rr.Algorithm, rr.Action, rr.Limit, rr.Window, shadow)
		fmt.Fprintf(&b, "  matched %d  allowed %d  limited %d (%.2f%%, %d from the block cache)  keys limited %d\n",
			rr.Matched, rr.Allowed, rr.Limited, pct(rr.Limited, rr.Matched), rr.FromBlockCache, rr.KeysLimited)
		if rr.Approximate {
			b.WriteString("  (approximate: more keys were limited than tracked)\n")
		}
		if len(rr.TopKeys) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		if rr.Counting {
			// A rule that counts by response: the keys it would have
			// stopped (which accounts, for failed logins), and when.
			fmt.Fprintf(tw, "  counts by response; the keys it would have stopped:\n")
			fmt.Fprintf(tw, "  stopped key\trefused\tfirst refused\n")
		} else {
			fmt.Fprintf(tw, "  top key\tlimited\tfirst limited\n")
		}
		for _, k := range rr.TopKeys {
			first := "+" + time.Duration(k.FirstLimitedMillis*1e6).Round(time.Millisecond).String()
			if k.FirstLimitedAt != "" {
				first = k.FirstLimitedAt + " (" + first + ")"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\n", k.Key, k.Limited, first)
		}
		tw.Flush()
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteText writes the import summary: counts and bad lines by reason.
func (s ImportSummary) WriteText(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "import: %d lines, %d good, %d bad, %d placed late", s.Lines, s.Good, s.Bad, s.Late)
	if !s.First.IsZero() {
		fmt.Fprintf(&b, ", %s to %s", s.First.Format(time.RFC3339), s.Last.Format(time.RFC3339))
	}
	b.WriteString("\n")
	for _, k := range slices.Sorted(maps.Keys(s.Reasons)) {
		fmt.Fprintf(&b, "  %6d  %s\n", s.Reasons[k], k)
	}
	if s.Truncated > 0 {
		fmt.Fprintf(&b, "  cut off: %d good %s ended inside the last quoted field (user agent or referer), kept without it\n",
			s.Truncated, plural(s.Truncated, "line", "lines"))
	}
	if s.MaxDisorderMillis > 0 || s.Streamed {
		disorder := time.Duration(s.MaxDisorderMillis * 1e6).Round(time.Millisecond)
		if s.Streamed {
			fmt.Fprintf(&b, "  order: lines up to %s out of time order; more good lines than -max-lines, so sorted within a %s window\n",
				disorder, time.Duration(s.WindowMillis*1e6).Round(time.Millisecond))
		} else {
			fmt.Fprintf(&b, "  order: lines up to %s out of time order, sorted whole\n", disorder)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// accuracy is the part of the aggregator's /report that the text summary
// shows; the field names are the aggregator's JSON.
type accuracy struct {
	Judged   int64 `json:"judged"`
	Late     int64 `json:"late"`
	Enforced struct {
		Decisions      int64   `json:"decisions"`
		WronglyAllowed int64   `json:"wrongly_allowed"`
		WronglyLimited int64   `json:"wrongly_limited"`
		WrongRatio     float64 `json:"wrong_ratio"`
	} `json:"enforced"`
	MeanRelativeError float64 `json:"mean_relative_error"`
	FalseNegativeKeys int64   `json:"false_negative_keys"`
	FalsePositiveKeys int64   `json:"false_positive_keys"`
}

func writeAccuracy(b *bytes.Buffer, raw json.RawMessage) {
	var a accuracy
	if err := json.Unmarshal(raw, &a); err != nil {
		fmt.Fprintf(b, "  aggregator   report not understood: %v\n", err)
		return
	}
	e := a.Enforced
	fmt.Fprintf(b, "  accuracy     %d decisions judged (%d late): wrongly allowed %d, wrongly limited %d, wrong %.4f%%\n",
		e.Decisions, a.Late, e.WronglyAllowed, e.WronglyLimited, 100*e.WrongRatio)
	fmt.Fprintf(b, "               mean relative error of the estimate %.2f%%; keys wrongly allowed %d, wrongly limited %d\n",
		100*a.MeanRelativeError, a.FalseNegativeKeys, a.FalsePositiveKeys)
}
