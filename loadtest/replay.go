package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
)

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
	req    TraceRequest
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
func Replay(ctx context.Context, cfg ReplayConfig, trace Trace) (*ReplayReport, error) {
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

	rp.detail = cfg.OnResult != nil || cfg.Results != nil || cfg.Timeline != nil
	if cfg.Results != nil {
		var err error
		if rp.results, err = newResultsWriter(cfg.Results); err != nil {
			return nil, fmt.Errorf("loadtest: write results: %w", err)
		}
	}

	start := AlignedStart(time.Now(), cfg.Align, cfg.Phase)
	if cfg.Timeline != nil {
		cfg.Timeline.begin(start)
	}
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
	if j.req.ContentType != "" {
		req.Header.SetContentType(j.req.ContentType)
	}
	if j.req.Body != "" {
		req.SetBodyString(j.req.Body)
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
	if rp.cfg.Timeline != nil {
		rp.cfg.Timeline.Add(res)
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
