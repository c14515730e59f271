package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/rules"

	"github.com/poplimit/poplimit/loadtest"
)

// client is one client of a generated trace.
type client struct {
	ip   netip.Addr
	path string
	rate float64 // requests per second
}

// ruleKey returns the rule a client of the async/sync tests sends to
// ("sync" on path /s, else "async") and its key under that rule in rs.
func (c client) ruleKey(rs *rules.Rules) (rule string, key uint64) {
	rule = "async"
	if c.path == "/s" {
		rule = "sync"
	}
	return rule, rs.Lookup(rule).Hash(c.ip.AppendTo(nil))
}

// clientIP returns the i-th client address of a test (10.x.y.z).
func clientIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// steady returns a trace in which every client sends at its rate, evenly
// spaced with ±20 % jitter from a random phase, for d; and the client index
// of each request, by its index in the replay (each request has Count 1).
func steady(clients []client, d time.Duration, seed uint64) ([]loadtest.TraceRequest, []int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	type item struct {
		r loadtest.TraceRequest
		c int
	}
	var items []item
	for ci, c := range clients {
		gap := float64(time.Second) / c.rate
		at := rng.Float64() * gap
		for at < float64(d) {
			items = append(items, item{loadtest.TraceRequest{At: time.Duration(at), IP: c.ip, Path: c.path}, ci})
			at += gap * (0.8 + 0.4*rng.Float64())
		}
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].r.At < items[j].r.At })
	reqs := make([]loadtest.TraceRequest, len(items))
	owner := make([]int, len(items))
	for i, it := range items {
		reqs[i], owner[i] = it.r, it.c
	}
	return reqs, owner
}

// traceOf returns reqs as a trace.
func traceOf(reqs []loadtest.TraceRequest) loadtest.Trace {
	return func(yield func(loadtest.TraceRequest, error) bool) {
		for _, r := range reqs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

// replay replays reqs against targets and returns every request's result,
// by index, with the report. MaxOutstanding stays modest: under the race
// detector each outstanding request is a goroutine.
func replay(t testing.TB, ctx context.Context, cfg loadtest.ReplayConfig, reqs []loadtest.TraceRequest) ([]loadtest.Result, *loadtest.ReplayReport) {
	t.Helper()
	results := make([]loadtest.Result, len(reqs))
	if cfg.MaxOutstanding == 0 {
		cfg.MaxOutstanding = 2000
	}
	if cfg.ConnsPerTarget == 0 {
		cfg.ConnsPerTarget = 32
	}
	cfg.OnResult = func(r loadtest.Result) {
		if r.Index >= 0 && int(r.Index) < len(results) {
			results[r.Index] = r
		}
	}
	rep, err := loadtest.Replay(ctx, cfg, traceOf(reqs))
	if err != nil { // t.Error: replay may run on a goroutine of the test
		t.Errorf("replay: %v", err)
	}
	if rep == nil {
		rep = &loadtest.ReplayReport{}
	}
	return results, rep
}

// alignedStart returns the instant a replay with Align a started now will
// start at: the next multiple of a since the Unix epoch.
func alignedStart(a time.Duration) time.Time {
	now := time.Now()
	return now.Add(a - time.Duration(now.UnixNano()%int64(a)))
}

// overloaded says why a replay shows that this shared machine could not
// keep its pace (requests not sent, or sent late), or "" if it kept it.
// Accuracy figures measured while it could not are the machine's, not the
// limiter's: tests log them but do not judge them.
func overloaded(rep *loadtest.ReplayReport) string {
	switch {
	case rep.NotSent > 0:
		return fmt.Sprintf("%d requests not sent (too many outstanding)", rep.NotSent)
	case rep.SendLag.P99Millis > 100:
		return fmt.Sprintf("requests sent late: p99 lag %.0f ms", rep.SendLag.P99Millis)
	}
	return ""
}

// latencies summarises service times (sent to answered) in ms.
type latencies []time.Duration

func (l latencies) String() string {
	if len(l) == 0 {
		return "no requests"
	}
	s := slices.Clone(l)
	slices.Sort(s)
	q := func(p float64) float64 { return ms(s[min(len(s)-1, int(p*float64(len(s))))]) }
	return fmt.Sprintf("n=%d p50 %.1f ms, p99 %.1f ms, max %.1f ms", len(s), q(0.5), q(0.99), ms(s[len(s)-1]))
}

func (l latencies) quantile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return slices.Max(l)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// table formats rows of cells as aligned text for the test log.
func table(rows [][]string) string {
	widths := map[int]int{}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.WriteString("\n  ")
		for i, c := range r {
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-len([]rune(c))+2))
		}
	}
	return b.String()
}
