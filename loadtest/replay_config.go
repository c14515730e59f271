package loadtest

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/rules"
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
	// Timeline, when not nil, records the replay over time (requests by
	// outcome and latency per second, the rules' worst keys in their
	// windows) for loadtest's HTML page; Replay sets its start. Memory is
	// bounded (see Timeline). Default nil.
	Timeline *TimelineRecorder
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
