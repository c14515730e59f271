package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/poplimit/poplimit/rules"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
)

// Spread is how a replay spreads requests over its targets.
type Spread uint8

const (
	// ByClient sends each client to one target, chosen by a hash of its
	// address, as anycast routing pins a client to one PoP edge.
	ByClient Spread = iota
	// RoundRobin sends successive requests to successive targets.
	RoundRobin
)

func (s Spread) String() string {
	if s == RoundRobin {
		return "round-robin"
	}
	return "by-client"
}

// ReplayConfig configures Replay. The zero value of each field means the
// default written beside it; Targets is required.
type ReplayConfig struct {
	// Targets are the edges' host:port addresses, plain HTTP.
	Targets []string
	Spread  Spread // default ByClient
	// Speed divides the trace's offsets: 2 replays twice as fast. Default 1.
	Speed float64
	// ConnsPerTarget bounds the connections to each target (fasthttp's
	// pool); a request that finds them all busy waits for one, and the wait
	// counts in its latency. Default 64.
	ConnsPerTarget int
	// MaxOutstanding bounds the requests sent and not yet answered. A
	// request due while that many are outstanding is not sent, and counted
	// as NotSent: the replay stays open-loop and its memory bounded. Default
	// 10,000 (under the race detector keep it below 8,000: one goroutine per
	// outstanding request).
	MaxOutstanding int
	// Timeout bounds each request, connection wait included. Default 5s.
	Timeout time.Duration
	// Duration stops sending after this much time from the start; 0
	// (default) replays the whole trace.
	Duration time.Duration
	// MaxRequests stops after this many requests were due; 0 (default) is
	// no bound.
	MaxRequests int64
	// Align starts the replay at the next wall-clock multiple of Align since
	// the Unix epoch, so that trace offsets that are multiples of a rule's
	// window fall on its window edges (which start at multiples of the
	// window). Default 0: start at once, at whatever phase the clock is.
	Align time.Duration
	// Phase, with Align, starts the replay Phase past such a multiple
	// instead: the trace's offset 0 lands Phase into the window grid (a
	// sliding-window estimate errs differently at each phase; offline's
	// -phases measures them all). 0 ≤ Phase < Align. Default 0.
	Phase time.Duration
	// ClientIPHeader carries each request's client address, for edges that
	// trust the replayer as a proxy (edge -trusted-proxies). Default
	// "X-Forwarded-For"; OmitClientIP sends none.
	ClientIPHeader string
	OmitClientIP   bool
	// PathPrefix is put before every path (e.g. "/check" for an edge in
	// decision mode behind Envoy's ext_authz). Default none.
	PathPrefix string
	// AggregatorURL, when set, is fetched (GET) at the end, after
	// AggregatorWait, and its JSON body embedded in the report.
	AggregatorURL  string
	AggregatorWait time.Duration // default 0
	// Progress, when not nil, receives a progress line every
	// ProgressInterval, rewritten in place with "\r" (give it a terminal).
	Progress         io.Writer
	ProgressInterval time.Duration // default 1s
	// OnResult, when not nil, is called with every request's outcome, from
	// many goroutines at once: it must be safe for concurrent use, and
	// quick, since it runs on the request's goroutine.
	OnResult func(Result)
	// Results, when not nil, receives one tab-separated line per request
	// due, after a header line (ResultsHeader; the columns are described in
	// the package doc and RESULTS.md): its schedule, send and answer times,
	// client, method and target, status, and the deciding rule and quota
	// from the response's headers. Lines are in the order requests end, not
	// by index. It is written in 64 KiB chunks by one goroutine, off the
	// request path. Replay does not close it.
	Results io.Writer
	// OnStart, when not nil, is called once the start (the wall time of the
	// trace's offset 0, after Align and Phase) is fixed, before waiting for
	// it.
	OnStart func(start time.Time)
}

func (c *ReplayConfig) setDefaults() {
	if c.Speed == 0 {
		c.Speed = 1
	}
	if c.ConnsPerTarget == 0 {
		c.ConnsPerTarget = 64
	}
	if c.MaxOutstanding == 0 {
		c.MaxOutstanding = 10_000
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.ClientIPHeader == "" {
		c.ClientIPHeader = "X-Forwarded-For"
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = time.Second
	}
}

// Validate reports every invalid field of c, with its name and value.
func (c ReplayConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, why string) {
		errs = append(errs, fmt.Errorf("loadtest: replay: %s %v: %s", field, v, why))
	}
	if len(c.Targets) == 0 {
		bad("Targets", "[]", "at least one host:port is required")
	}
	for _, t := range c.Targets {
		if h, p, err := net.SplitHostPort(t); err != nil || h == "" || p == "" {
			bad("Targets", strconv.Quote(t), "not host:port")
		}
	}
	if c.Spread > RoundRobin {
		bad("Spread", c.Spread, "must be ByClient or RoundRobin")
	}
	if c.Speed < 0 || c.Speed > 1e6 || math.IsNaN(c.Speed) {
		bad("Speed", c.Speed, "must be above 0 (0 means 1) and at most 1,000,000")
	}
	if c.ConnsPerTarget < 0 || c.ConnsPerTarget > 100_000 {
		bad("ConnsPerTarget", c.ConnsPerTarget, "must be between 0 (default) and 100,000")
	}
	if c.MaxOutstanding < 0 || c.MaxOutstanding > 1_000_000 {
		bad("MaxOutstanding", c.MaxOutstanding, "must be between 0 (default) and 1,000,000")
	}
	if c.Timeout < 0 || c.Timeout > 10*time.Minute {
		bad("Timeout", c.Timeout, "must be between 0 (default) and 10m")
	}
	if c.Duration < 0 {
		bad("Duration", c.Duration, "must not be negative")
	}
	if c.MaxRequests < 0 {
		bad("MaxRequests", c.MaxRequests, "must not be negative")
	}
	if c.Align < 0 || c.Align > 24*time.Hour {
		bad("Align", c.Align, "must be between 0 and 24h")
	}
	if c.Phase < 0 || c.Phase > 0 && c.Phase >= c.Align {
		bad("Phase", c.Phase, "must be at least 0 and below Align (Phase needs Align)")
	}
	if c.ClientIPHeader != "" && !rules.IsToken(c.ClientIPHeader) {
		bad("ClientIPHeader", strconv.Quote(c.ClientIPHeader), "not a header name")
	}
	if c.PathPrefix != "" && (c.PathPrefix[0] != '/' || !printableASCII(c.PathPrefix)) {
		bad("PathPrefix", strconv.Quote(c.PathPrefix), `must start with "/" and be printable ASCII`)
	}
	if c.AggregatorURL != "" {
		if u, err := url.Parse(c.AggregatorURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("AggregatorURL", strconv.Quote(c.AggregatorURL), "not an http(s) URL")
		}
	}
	if c.AggregatorWait < 0 || c.AggregatorWait > 10*time.Minute {
		bad("AggregatorWait", c.AggregatorWait, "must be between 0 and 10m")
	}
	if c.ProgressInterval < 0 {
		bad("ProgressInterval", c.ProgressInterval, "must not be negative")
	}
	return errors.Join(errs...)
}

// Result is the outcome of one request of a replay.
type Result struct {
	Index     int64     // the request's number among those due, from 0 (each of a Count is one)
	Target    int       // index in Targets
	Scheduled time.Time // when it was due
	Sent      time.Time // when it was handed to the connection pool; zero if NotSent
	Done      time.Time // when its response (or error) came; zero if NotSent
	Status    int       // HTTP status; 0 on a transport error or NotSent
	// Rule is the rule that decided it: the policy named by the response's
	// RateLimit field, or the 429 body's "policy"; "" when none.
	Rule    string
	Err     error // the transport error, if any
	NotSent bool  // due while MaxOutstanding requests were outstanding
	// Client, Method, Host and Path are what was (or would have been)
	// sent, when OnResult or Results is set: the client address (in
	// ClientIPHeader), the method, the Host header and the request target
	// (PathPrefix and the trace's path).
	Client netip.Addr
	Method string
	Host   string
	Path   string
	// Quota is what the response's headers said of the deciding rule's
	// quota; every field -1 when not answered.
	Quota ResponseQuota
}

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

// Report is the summary of one replay. Rates are per second over the span
// of what they count: the scheduled rate over (first due, last due), the
// sent rate over (first sent, last sent), each as intervals (n−1 of them for
// n requests), so a perfectly paced replay shows equal rates.
type Report struct {
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

// Reasons a replay stops dispatching.
const (
	StopEnd        = "end of trace"
	StopDuration   = "duration bound"
	StopRequests   = "request bound"
	StopCanceled   = "canceled"
	StopTraceError = "trace error"
)

const (
	histShards  = 8
	histMaxUsec = 60_000_000 // 60 s; slower is recorded as 60 s
	maxRuleKeys = 1024       // distinct rule names counted; more go to "(other)"
)

// transport error kinds, a fixed set.
var errKinds = [...]string{"timeout", "no free connection", "connection refused", "connection closed", "other"}

func errKind(err error) int {
	var op *net.OpError
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, context.DeadlineExceeded):
		return 0
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return 1
	case errors.Is(err, syscall.ECONNREFUSED):
		return 2
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.As(err, &op):
		return 3
	}
	return 4
}

type histShard struct {
	// mu protects the fields below.
	mu       sync.Mutex
	lat, lag *hdrhistogram.Histogram
}

type ruleCounter struct{ allowed, limited atomic.Int64 }

// replayer is the state of one Replay.
type replayer struct {
	cfg     ReplayConfig
	clients []*fasthttp.HostClient
	sem     chan struct{}
	wg      sync.WaitGroup
	shards  [histShards]histShard

	sent, completed, notSent, scheduled atomic.Int64
	statuses                            [600]atomic.Int64
	otherStatus                         atomic.Int64
	errs                                [len(errKinds)]atomic.Int64
	firstSent, lastSent, lastDone       atomic.Int64 // Unix ns

	// rulesMu protects rules.
	rulesMu sync.Mutex
	rules   map[string]*ruleCounter

	detail  bool           // fill Result's request and quota fields (OnResult or Results)
	results *resultsWriter // nil without Results
}

type job struct {
	idx    int64
	target int
	due    time.Time
	req    Request
}

// Replay sends the requests of trace to the targets on the trace's
// schedule, open-loop: each request leaves when it is due whether or not
// earlier ones have been answered, bounded only by MaxOutstanding. It stops
// at the end of the trace, at a bound, or when ctx is done, waits (at most
// Timeout) for the requests outstanding, fetches the aggregator's report if
// configured, and returns the summary. A canceled replay returns its report
// and no error; the error is for an invalid config or a trace that failed
// (the report then covers what was sent).
//
// Replay starts one goroutine per outstanding request and one for the
// progress line, and has stopped them all when it returns. It may be called
// concurrently; each call has its own connections.
func Replay(ctx context.Context, cfg ReplayConfig, trace Trace) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	rp := &replayer{cfg: cfg, sem: make(chan struct{}, cfg.MaxOutstanding), rules: map[string]*ruleCounter{}}
	for _, t := range cfg.Targets {
		rp.clients = append(rp.clients, &fasthttp.HostClient{
			Addr:               t,
			MaxConns:           cfg.ConnsPerTarget,
			MaxConnWaitTimeout: cfg.Timeout,
			ReadTimeout:        cfg.Timeout,
			WriteTimeout:       cfg.Timeout,
			// fasthttp's connection cleaner, which no one can stop, exits by
			// itself once the idle connections are gone: this bounds how long
			// it outlives a Replay.
			MaxIdleConnDuration:       time.Second,
			MaxIdemponentCallAttempts: 1, // a retry would be a request the trace did not send
			NoDefaultUserAgentHeader:  true,
			DisablePathNormalizing:    true,
			MaxResponseBodySize:       1 << 20,
		})
	}
	for i := range rp.shards {
		rp.shards[i].lat = hdrhistogram.New(1, histMaxUsec, 3)
		rp.shards[i].lag = hdrhistogram.New(1, histMaxUsec, 3)
	}

	rp.detail = cfg.OnResult != nil || cfg.Results != nil
	if cfg.Results != nil {
		var err error
		if rp.results, err = newResultsWriter(cfg.Results); err != nil {
			return nil, fmt.Errorf("loadtest: write results: %w", err)
		}
	}

	start := AlignedStart(time.Now(), cfg.Align, cfg.Phase)
	if cfg.OnStart != nil {
		cfg.OnStart(start)
	}
	stopProgress := rp.startProgress(start)
	stopped, firstDue, lastDue, badLines, traceErr := rp.dispatch(ctx, start, trace)
	rp.wg.Wait()
	for _, c := range rp.clients {
		c.CloseIdleConnections()
	}
	stopProgress()

	rep := rp.report(start, stopped, firstDue, lastDue, badLines)
	if rp.results != nil {
		var err error
		if rep.ResultsLines, err = rp.results.close(); err != nil {
			rep.ResultsError = err.Error()
		}
	}
	if cfg.AggregatorURL != "" {
		rep.Aggregator, rep.AggregatorError = fetchAggregator(ctx, cfg.AggregatorURL, cfg.AggregatorWait)
	}
	return rep, traceErr
}

// AlignedStart returns the first instant after now that is phase past a
// multiple of align since the Unix epoch (the window grid of a rule whose
// window is align), or now when align is 0. A start exactly on now is
// taken one grid step later, so that there is time to prepare.
func AlignedStart(now time.Time, align, phase time.Duration) time.Time {
	a := int64(align)
	if a <= 0 {
		return now
	}
	wait := (int64(phase) - now.UnixNano()%a) % a
	if wait <= 0 {
		wait += a
	}
	return now.Add(time.Duration(wait))
}

// dispatch runs the schedule; it is the only goroutine that reads the trace.
func (rp *replayer) dispatch(ctx context.Context, start time.Time, trace Trace) (stopped string, firstDue, lastDue time.Time, badLines int64, traceErr error) {
	cfg := &rp.cfg
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if !sleepUntil(ctx, timer, start) {
		return StopCanceled, firstDue, lastDue, 0, nil
	}
	var idx int64
	var rr int
	stopped = StopEnd
outer:
	for r, err := range trace {
		if err != nil {
			if isLineError(err) {
				badLines++
				continue
			}
			stopped, traceErr = StopTraceError, err
			break
		}
		due := start.Add(time.Duration(float64(r.At) / cfg.Speed))
		if cfg.Duration > 0 && due.Sub(start) >= cfg.Duration {
			stopped = StopDuration
			break
		}
		target := 0
		if n := len(rp.clients); n > 1 && cfg.Spread == ByClient {
			b := r.IP.As16()
			target = int(xxhash.Sum64(b[:]) % uint64(n))
		}
		for c := r.count(); c > 0; c-- {
			if cfg.MaxRequests > 0 && idx >= cfg.MaxRequests {
				stopped = StopRequests
				break outer
			}
			if !sleepUntil(ctx, timer, due) {
				stopped = StopCanceled
				break outer
			}
			if cfg.Duration > 0 && time.Since(start) >= cfg.Duration {
				stopped = StopDuration
				break outer
			}
			if cfg.Spread == RoundRobin {
				target = rr
				rr = (rr + 1) % len(rp.clients)
			}
			if idx == 0 {
				firstDue = due
			}
			lastDue = due
			rp.scheduled.Add(1)
			j := job{idx: idx, target: target, due: due, req: r}
			idx++
			select {
			case rp.sem <- struct{}{}:
				rp.wg.Add(1)
				go rp.do(j)
			default:
				rp.notSent.Add(1)
				if rp.detail {
					res := Result{Index: j.idx, Target: j.target, Scheduled: due, NotSent: true, Quota: noQuota}
					rp.fillRequest(&res, &j)
					rp.record(&res)
				}
			}
		}
	}
	return stopped, firstDue, lastDue, badLines, traceErr
}

// sleepUntil waits for t on timer; false when ctx ended first.
func sleepUntil(ctx context.Context, timer *time.Timer, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// do sends one request and records its outcome; it runs on its own
// goroutine, holding one MaxOutstanding token.
func (rp *replayer) do(j job) {
	defer func() { <-rp.sem; rp.wg.Done() }()
	cfg := &rp.cfg
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) }()
	host := j.req.Host
	if host == "" {
		host = cfg.Targets[j.target]
	}
	path := j.req.Path
	if path == "" {
		path = "/"
	}
	// An absolute URI keeps the path exactly as the trace has it (a path
	// starting with "//" is not taken for an authority); the request line
	// sent is still the origin form.
	var ub [512]byte
	u := append(append(append(append(ub[:0], "http://"...), host...), cfg.PathPrefix...), path...)
	req.URI().DisablePathNormalizing = true
	req.SetRequestURIBytes(u)
	req.UseHostHeader = true
	req.Header.SetHost(host)
	if j.req.Method != "" {
		req.Header.SetMethod(j.req.Method)
	}
	for k, v := range j.req.Headers {
		req.Header.Set(k, v)
	}
	if !cfg.OmitClientIP {
		var b [64]byte
		req.Header.SetBytesV(cfg.ClientIPHeader, j.req.IP.AppendTo(b[:0]))
	}
	sent := time.Now()
	err := rp.clients[j.target].DoDeadline(req, resp, sent.Add(cfg.Timeout))
	done := time.Now()

	ns := sent.UnixNano()
	rp.sent.Add(1)
	storeMax(&rp.firstSent, ns, true)
	storeMax(&rp.lastSent, ns, false)
	storeMax(&rp.lastDone, done.UnixNano(), false)
	sh := &rp.shards[j.idx%histShards]
	lag := sent.Sub(j.due)
	lat := done.Sub(j.due)
	sh.mu.Lock()
	sh.lag.RecordValue(clampUsec(lag))
	if err == nil {
		sh.lat.RecordValue(clampUsec(lat))
	}
	sh.mu.Unlock()

	var status int
	var rule []byte
	if err != nil {
		rp.errs[errKind(err)].Add(1)
	} else {
		rp.completed.Add(1)
		status = resp.StatusCode()
		if status >= 0 && status < len(rp.statuses) {
			rp.statuses[status].Add(1)
		} else {
			rp.otherStatus.Add(1)
		}
		rule = ruleOf(resp)
		switch {
		case status == fasthttp.StatusTooManyRequests:
			rp.rule(rule).limited.Add(1)
		case status >= 200 && status < 300:
			rp.rule(rule).allowed.Add(1)
		}
	}
	if rp.detail {
		res := Result{Index: j.idx, Target: j.target, Scheduled: j.due, Sent: sent, Done: done,
			Status: status, Rule: string(rule), Err: err, Quota: noQuota}
		if err == nil {
			res.Quota = quotaOf(resp, done)
		}
		rp.fillRequest(&res, &j)
		rp.record(&res)
	}
}

// fillRequest sets what res's request was (or would have been) sent with.
func (rp *replayer) fillRequest(res *Result, j *job) {
	cfg := &rp.cfg
	res.Client = j.req.IP
	res.Method = j.req.Method
	if res.Method == "" {
		res.Method = fasthttp.MethodGet
	}
	res.Host = j.req.Host
	if res.Host == "" {
		res.Host = cfg.Targets[j.target]
	}
	path := j.req.Path
	if path == "" {
		path = "/"
	}
	res.Path = path
	if cfg.PathPrefix != "" {
		res.Path = cfg.PathPrefix + path
	}
}

// record hands res to OnResult and to the results file.
func (rp *replayer) record(res *Result) {
	if rp.cfg.OnResult != nil {
		rp.cfg.OnResult(*res)
	}
	if rp.results == nil {
		return
	}
	var lb [512]byte
	line := appendResultLine(lb[:0], res, rp.cfg.Targets[res.Target])
	i := int(res.Index % histShards)
	sh := &rp.shards[i]
	sh.mu.Lock()
	rp.results.add(i, line)
	sh.mu.Unlock()
}

// storeMax stores v in a if v is above (or, with less, below) its value.
func storeMax(a *atomic.Int64, v int64, less bool) {
	for {
		cur := a.Load()
		if cur != 0 && (less && cur <= v || !less && cur >= v) {
			return
		}
		if a.CompareAndSwap(cur, v) {
			return
		}
	}
}

func clampUsec(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	return min(max(us, 1), histMaxUsec)
}

// rule returns the counter of the rule named name, creating it.
func (rp *replayer) rule(name []byte) *ruleCounter {
	rp.rulesMu.Lock()
	defer rp.rulesMu.Unlock()
	if c, ok := rp.rules[string(name)]; ok {
		return c
	}
	key := string(name)
	if len(rp.rules) >= maxRuleKeys {
		key = "(other)"
		if c, ok := rp.rules[key]; ok {
			return c
		}
	}
	c := &ruleCounter{}
	rp.rules[key] = c
	return c
}

var (
	hRateLimit = []byte("RateLimit")
	policyKey  = []byte(`"policy":"`)
)

// ruleOf returns the name of the rule that decided resp: the first policy
// of its RateLimit field (an sf-string), else the "policy" of a 429's
// problem body. The slice aliases resp.
func ruleOf(resp *fasthttp.Response) []byte {
	if v := resp.Header.PeekBytes(hRateLimit); len(v) > 0 {
		if name, ok := sfString(v); ok {
			return name
		}
	}
	if resp.StatusCode() == fasthttp.StatusTooManyRequests {
		body := resp.Body()
		if i := bytes.Index(body, policyKey); i >= 0 {
			rest := body[i+len(policyKey):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				return rest[:j]
			}
		}
	}
	return nil
}

// sfString returns the sf-string that v (a structured-field list) starts
// with, as the RateLimit fields name their policy: `"name";r=…`. Rule names
// need no escapes; an escaped one is returned as it stands.
func sfString(v []byte) ([]byte, bool) {
	v = bytes.TrimLeft(v, " ")
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return v[1:i], true
		}
	}
	return nil, false
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

func (rp *replayer) report(start time.Time, stopped string, firstDue, lastDue time.Time, badLines int64) *Report {
	cfg := &rp.cfg
	r := &Report{
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
