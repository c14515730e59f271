package loadtest

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// resultErr is the transport error a results line names.
type resultErr int

func (e resultErr) Error() string { return errKinds[e] }

// ReadResults reads the results file at path (ReplayConfig.Results) and
// rebuilds the replay's report as far as the file tells it, and its
// Timeline: the counts, statuses, rules, latency and send lag are the ones
// the replay reported (the same histograms of the same times). The file
// does not hold the replay's settings: base, when not nil (the replay's
// JSON report), gives the targets, spread, speed, start, window grid, why
// it stopped and the aggregator's report; without it the targets are the
// edges the lines name and the start is the first request's due time. The
// file is read twice, line by line; the memory is the Timeline's bound.
func ReadResults(path string, base *ReplayReport) (*ReplayReport, *Timeline, error) {
	var start int64
	if base != nil && !base.Start.IsZero() {
		start = base.Start.UnixNano()
	} else {
		first := int64(math.MaxInt64)
		if err := eachResult(path, func(r *Result, _ string) { first = min(first, r.Scheduled.UnixNano()) }); err != nil {
			return nil, nil, err
		}
		if first != math.MaxInt64 {
			start = first
		}
	}
	rep := &ReplayReport{Start: time.Unix(0, start).UTC(), Statuses: map[string]int64{}}
	if base != nil {
		rep.Targets, rep.Spread, rep.Speed, rep.Stopped = base.Targets, base.Spread, base.Speed, base.Stopped
		rep.AlignMillis, rep.PhaseMillis, rep.BadLines = base.AlignMillis, base.PhaseMillis, base.BadLines
		rep.Aggregator, rep.AggregatorError = base.Aggregator, base.AggregatorError
	}
	tr := NewTimelineRecorder(rep.Start)
	lat := hdrhistogram.New(1, histMaxUsec, 3)
	lag := hdrhistogram.New(1, histMaxUsec, 3)
	rules := map[string]*RuleCount{}
	edges := map[string]bool{}
	var firstDue, lastDue, firstSent, lastSent, lastDone int64
	minTo := func(a *int64, v int64) {
		if *a == 0 || v < *a {
			*a = v
		}
	}
	err := eachResult(path, func(r *Result, edge string) {
		tr.Add(r)
		edges[edge] = true
		rep.Scheduled++
		due := r.Scheduled.UnixNano()
		minTo(&firstDue, due)
		lastDue = max(lastDue, due)
		if r.NotSent {
			rep.NotSent++
			return
		}
		rep.Sent++
		sent := r.Sent.UnixNano()
		minTo(&firstSent, sent)
		lastSent = max(lastSent, sent)
		lastDone = max(lastDone, r.Done.UnixNano())
		lag.RecordValue(clampUsec(r.Sent.Sub(r.Scheduled)))
		if r.Err != nil {
			if rep.Errors == nil {
				rep.Errors = map[string]int64{}
			}
			rep.Errors[r.Err.Error()]++
			return
		}
		rep.Completed++
		lat.RecordValue(clampUsec(r.Done.Sub(r.Scheduled)))
		if r.Status >= 0 && r.Status < 600 {
			rep.Statuses[strconv.Itoa(r.Status)]++
		} else {
			rep.Statuses["other"]++
		}
		if r.Status == 429 || r.Status >= 200 && r.Status < 300 {
			rc := rules[r.Rule]
			if rc == nil {
				rc = &RuleCount{Rule: r.Rule}
				rules[r.Rule] = rc
			}
			if r.Status == 429 {
				rc.Limited++
			} else {
				rc.Allowed++
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	if len(rep.Targets) == 0 {
		for e := range edges {
			if e != "" {
				rep.Targets = append(rep.Targets, e)
			}
		}
		sort.Strings(rep.Targets)
	}
	if lastDone > 0 {
		rep.ElapsedSeconds = time.Duration(lastDone - start).Seconds()
	}
	rep.ScheduledRate = rate(rep.Scheduled-1, time.Duration(lastDue-firstDue))
	rep.SentRate = rate(rep.Sent-1, time.Duration(lastSent-firstSent))
	rep.CompletedRate = rate(rep.Completed, time.Duration(lastDone-firstSent))
	rep.Latency, rep.SendLag = summarize(lat), summarize(lag)
	for _, rc := range rules {
		rep.Rules = append(rep.Rules, *rc)
	}
	slices.SortFunc(rep.Rules, func(a, b RuleCount) int { return strings.Compare(a.Rule, b.Rule) })
	return rep, tr.Timeline(), nil
}

// eachResult calls f with every line of the results file at path.
func eachResult(path string, f func(r *Result, edge string)) error {
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("loadtest: results: %w", err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(bufio.NewReaderSize(fh, 256<<10))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if n == 1 {
			if line+"\n" != ResultsHeader {
				return fmt.Errorf("loadtest: results %s: line 1: not a results header (want %q)", path, strings.TrimSpace(ResultsHeader))
			}
			continue
		}
		var r Result
		edge, err := parseResultLine(line, &r)
		if err != nil {
			return fmt.Errorf("loadtest: results %s: line %d: %w", path, n, err)
		}
		f(&r, edge)
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		return fmt.Errorf("loadtest: results %s: %w", path, err)
	}
	if n == 0 {
		return fmt.Errorf("loadtest: results %s: empty file (no header)", path)
	}
	return nil
}

var resultsColumns = strings.Split(strings.TrimSpace(ResultsHeader), "\t")

// parseResultLine reads one results line into r and returns its edge.
func parseResultLine(line string, r *Result) (string, error) {
	f := strings.Split(line, "\t")
	if len(f) != len(resultsColumns) {
		return "", fmt.Errorf("%d fields, want %d", len(f), len(resultsColumns))
	}
	num := func(i int) (int64, error) {
		if f[i] == "-" {
			return -1, nil
		}
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: not an integer", resultsColumns[i], f[i])
		}
		return n, nil
	}
	ts := func(i int) (time.Time, error) {
		n, err := num(i)
		if err != nil || n < 0 {
			return time.Time{}, err
		}
		return time.Unix(0, n), nil
	}
	var err error
	if r.Index, err = num(0); err != nil {
		return "", err
	}
	if r.Scheduled, err = ts(2); err != nil {
		return "", err
	}
	if r.Scheduled.IsZero() {
		return "", fmt.Errorf("scheduled_ns: missing")
	}
	if r.Sent, err = ts(3); err != nil {
		return "", err
	}
	if r.Done, err = ts(4); err != nil {
		return "", err
	}
	if f[5] != "-" {
		if r.Client, err = netip.ParseAddr(f[5]); err != nil {
			return "", fmt.Errorf("client %q: %w", f[5], err)
		}
	}
	r.Method, r.Host, r.Path = dashless(f[6]), dashless(f[7]), dashless(f[8])
	st, err := num(9)
	if err != nil {
		return "", err
	}
	r.Status = int(st)
	switch o := f[10]; o {
	case OutcomeAnswered:
	case OutcomeNotSent:
		r.NotSent = true
	default:
		k := slices.Index(outcomeOfErr[:], o)
		if k < 0 {
			return "", fmt.Errorf("outcome %q: want %s, %s or a transport error (%s)", o, OutcomeAnswered, OutcomeNotSent, strings.Join(outcomeOfErr[:], ", "))
		}
		r.Err = resultErr(k)
	}
	if !r.NotSent && (r.Sent.IsZero() || r.Done.IsZero()) {
		return "", fmt.Errorf("outcome %s without sent_ns and answered_ns", f[10])
	}
	r.Rule = dashless(f[11])
	q := &r.Quota
	for i, p := range []*int64{&q.Limit, &q.Remaining, &q.ResetSeconds, &q.WindowSeconds, &q.RetryAfter} {
		if *p, err = num(12 + i); err != nil {
			return "", err
		}
	}
	return dashless(f[1]), nil
}

func dashless(s string) string {
	if s == "-" {
		return ""
	}
	return s
}
