package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency summarizes a histogram, in milliseconds (microsecond resolution,
// three significant digits).
type Latency struct {
	Count      int64   `json:"count"`
	P50Millis  float64 `json:"p50_ms"`
	P90Millis  float64 `json:"p90_ms"`
	P99Millis  float64 `json:"p99_ms"`
	P999Millis float64 `json:"p99_9_ms"`
	MaxMillis  float64 `json:"max_ms"`
	MeanMillis float64 `json:"mean_ms"`
}

// RuleCount counts one rule's decisions as the responses told them.
type RuleCount struct {
	Rule    string `json:"rule"` // "" for responses that named no rule
	Allowed int64  `json:"allowed"`
	Limited int64  `json:"limited"`
}

// ReplayReport is the summary of one replay. Rates are per second over the
// span of what they count: the scheduled rate over (first due, last due),
// the sent rate over (first sent, last sent), each as intervals (n−1 of
// them for n requests), so a perfectly paced replay shows equal rates.
type ReplayReport struct {
	Targets []string  `json:"targets"`
	Spread  string    `json:"spread"`
	Speed   float64   `json:"speed"`
	Start   time.Time `json:"start"` // wall time of the trace's offset 0
	// AlignMillis and PhaseMillis are the window grid the start was put on
	// (ReplayConfig.Align, Phase): Start is PhaseMillis past a multiple of
	// AlignMillis since the Unix epoch. AlignMillis 0: not aligned.
	AlignMillis    float64 `json:"align_ms"`
	PhaseMillis    float64 `json:"phase_ms"`
	Stopped        string  `json:"stopped"`         // why dispatch ended
	ElapsedSeconds float64 `json:"elapsed_seconds"` // from Start to the last response

	Scheduled int64            `json:"scheduled"` // requests due within the bounds
	Sent      int64            `json:"sent"`
	NotSent   int64            `json:"not_sent"`  // due while MaxOutstanding were outstanding
	Completed int64            `json:"completed"` // answered with an HTTP status
	Errors    map[string]int64 `json:"errors,omitempty"`
	BadLines  int64            `json:"bad_lines"` // trace lines skipped

	ScheduledRate float64 `json:"scheduled_per_second"`
	SentRate      float64 `json:"sent_per_second"`
	CompletedRate float64 `json:"completed_per_second"` // over (first sent, last response)

	// SendLag is how late requests left against their schedule: the
	// pacer's own error. Latency runs from the scheduled send time to the
	// response, so time spent waiting to be sent (coordinated omission)
	// is counted, not hidden.
	SendLag Latency `json:"send_lag"`
	Latency Latency `json:"latency"`

	Statuses map[string]int64 `json:"statuses"`
	Rules    []RuleCount      `json:"rules"`

	Aggregator      json.RawMessage `json:"aggregator,omitempty"`
	AggregatorError string          `json:"aggregator_error,omitempty"`

	// ResultsLines counts the lines written to ReplayConfig.Results (the
	// header excluded): one per request due. ResultsError is why writing
	// them failed, if it did.
	ResultsLines int64  `json:"results_lines,omitempty"`
	ResultsError string `json:"results_error,omitempty"`
}

// startProgress writes the progress line until the returned func is called.
func (rp *replayer) startProgress(start time.Time) (stop func()) {
	w := rp.cfg.Progress
	if w == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(rp.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				rp.progressLine(w, start)
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		fmt.Fprint(w, "\r\033[K")
	}
}

func (rp *replayer) progressLine(w io.Writer, start time.Time) {
	el := time.Since(start)
	if el <= 0 {
		fmt.Fprintf(w, "\r\033[Kstarting in %.1fs", -el.Seconds())
		return
	}
	var lat *hdrhistogram.Histogram
	for i := range rp.shards {
		sh := &rp.shards[i]
		sh.mu.Lock()
		if lat == nil {
			lat = sh.lat.Clone()
		} else {
			lat.Merge(sh.lat)
		}
		sh.mu.Unlock()
	}
	var errs int64
	for i := range rp.errs {
		errs += rp.errs[i].Load()
	}
	sent := rp.sent.Load()
	fmt.Fprintf(w, "\r\033[K%6.1fs  due %d  sent %d (%.0f/s)  outstanding %d  2xx %d  429 %d  errors %d  not sent %d  p99 %.2fms",
		el.Seconds(), rp.scheduled.Load(), sent, float64(sent)/el.Seconds(), len(rp.sem),
		rp.count2xx(), rp.statuses[429].Load(), errs, rp.notSent.Load(), float64(lat.ValueAtQuantile(99))/1000)
}

func (rp *replayer) count2xx() int64 {
	var n int64
	for s := 200; s < 300; s++ {
		n += rp.statuses[s].Load()
	}
	return n
}

func (rp *replayer) report(start time.Time, stopped string, firstDue, lastDue time.Time, badLines int64) *ReplayReport {
	cfg := &rp.cfg
	r := &ReplayReport{
		Targets: cfg.Targets, Spread: cfg.Spread.String(), Speed: cfg.Speed, Start: start.Round(0), Stopped: stopped,
		AlignMillis: float64(cfg.Align) / 1e6, PhaseMillis: float64(cfg.Phase) / 1e6,
		Scheduled: rp.scheduled.Load(), Sent: rp.sent.Load(), NotSent: rp.notSent.Load(), Completed: rp.completed.Load(),
		BadLines: badLines, Statuses: map[string]int64{},
	}
	if last := rp.lastDone.Load(); last > 0 {
		r.ElapsedSeconds = time.Unix(0, last).Sub(start).Seconds()
	}
	r.ScheduledRate = rate(r.Scheduled-1, lastDue.Sub(firstDue))
	first, lastSent := rp.firstSent.Load(), rp.lastSent.Load()
	r.SentRate = rate(r.Sent-1, time.Duration(lastSent-first))
	r.CompletedRate = rate(r.Completed, time.Duration(rp.lastDone.Load()-first))
	for i, k := range errKinds {
		if n := rp.errs[i].Load(); n > 0 {
			if r.Errors == nil {
				r.Errors = map[string]int64{}
			}
			r.Errors[k] = n
		}
	}
	lat := hdrhistogram.New(1, histMaxUsec, 3)
	lag := hdrhistogram.New(1, histMaxUsec, 3)
	for i := range rp.shards {
		lat.Merge(rp.shards[i].lat)
		lag.Merge(rp.shards[i].lag)
	}
	r.Latency, r.SendLag = summarize(lat), summarize(lag)
	for s := range rp.statuses {
		if n := rp.statuses[s].Load(); n > 0 {
			r.Statuses[strconv.Itoa(s)] = n
		}
	}
	if n := rp.otherStatus.Load(); n > 0 {
		r.Statuses["other"] = n
	}
	for name, c := range rp.rules {
		r.Rules = append(r.Rules, RuleCount{Rule: name, Allowed: c.allowed.Load(), Limited: c.limited.Load()})
	}
	sort.Slice(r.Rules, func(i, j int) bool { return r.Rules[i].Rule < r.Rules[j].Rule })
	return r
}

func rate(n int64, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func summarize(h *hdrhistogram.Histogram) Latency {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	if h.TotalCount() == 0 {
		return Latency{}
	}
	return Latency{
		Count:      h.TotalCount(),
		P50Millis:  ms(h.ValueAtQuantile(50)),
		P90Millis:  ms(h.ValueAtQuantile(90)),
		P99Millis:  ms(h.ValueAtQuantile(99)),
		P999Millis: ms(h.ValueAtQuantile(99.9)),
		MaxMillis:  ms(h.Max()),
		MeanMillis: h.Mean() / 1000,
	}
}

// maxAggregatorBytes bounds the aggregator's report read.
const maxAggregatorBytes = 4 << 20

// fetchAggregator GETs url after wait and returns its JSON body, or why not.
func fetchAggregator(ctx context.Context, u string, wait time.Duration) (json.RawMessage, string) {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err.Error()
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAggregatorBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Sprintf("GET %s: %v", u, err)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Sprintf("GET %s: status %s", u, resp.Status)
	case len(body) > maxAggregatorBytes:
		return nil, fmt.Sprintf("GET %s: report larger than %d bytes", u, maxAggregatorBytes)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, body); err != nil {
		return nil, fmt.Sprintf("GET %s: not JSON: %v", u, err)
	}
	return json.RawMessage(buf.Bytes()), ""
}
