package httpedge_test

import (
	"testing"
	"time"
)

// A cost header within its bounds spends that many units; one out of its
// bounds or not a number is refused with 400 and spends nothing.
func TestCostHeaderThroughTheEdge(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: metered, key: ["header:K"], limit: 10, window: 1m, cost_header: X-Cost, max_cost: 5}
`})
	cost := func(c string) int {
		hdr := []string{"K", "k1"}
		if c != "" {
			hdr = append(hdr, "X-Cost", c)
		}
		return get(t, e.addr, "/check/", hdr...).StatusCode
	}
	for _, tc := range []struct {
		cost string
		want int
	}{{"5", 200}, {"6", 400}, {"0", 400}, {"-1", 400}, {"abc", 400}, {"4", 200}, {"", 200}, {"1", 429}} {
		if got := cost(tc.cost); got != tc.want {
			t.Errorf("cost %q: %d, want %d (5 + 4 + 1 of 10 spent by then)", tc.cost, got, tc.want)
		}
	}
	if n := sumBad(t, e); n != 4 {
		t.Errorf("bad cost requests counted %v, want 4", n)
	}
}

func sumBad(t *testing.T, e *testEdge) float64 {
	t.Helper()
	return metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "bad_cost")
}

// The block action counts every request, those answered from the block
// cache too: a client that keeps sending stays blocked across timeouts,
// one that stops is released when its timeout ends.
func TestBlockActionCountedFromTheBlockCache(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: mitigate, key: ["header:K"], limit: 5, window: 2s, action: block, timeout: 500ms}
`})
	send := func(k string) int { return get(t, e.addr, "/check/", "K", k).StatusCode }
	// Both clients go over: 10 requests at once.
	for _, k := range []string{"keeps", "stops"} {
		for i := 0; i < 10; i++ {
			send(k)
			e.blocks.Wait()
		}
		if s := send(k); s != 429 {
			t.Fatalf("%s after 10 quick requests: %d, want 429 (blocked)", k, s)
		}
	}
	// "keeps" sends 20 requests a second for 1.5 s (three timeouts): every
	// one is counted, so its rate stays over the limit and it stays blocked.
	start := time.Now()
	allowed := 0
	for time.Since(start) < 1500*time.Millisecond {
		if send("keeps") == 200 {
			allowed++
		}
		e.blocks.Wait()
		time.Sleep(50 * time.Millisecond)
	}
	if allowed > 1 {
		t.Errorf("a client sending 20/s against 5 per 2 s was admitted %d times across three timeouts, want at most 1", allowed)
	}
	// "stops" sends nothing more: its block (500 ms) ends, and once its
	// burst has slid out of the trailing 2 s window (two windows after it
	// at most), its next request is admitted. (Polling would not do: the
	// block action counts every attempt.)
	time.Sleep(time.Until(start.Add(4500 * time.Millisecond)))
	if s := send("stops"); s != 200 {
		t.Errorf("a client that stopped, 4.5 s later: %d, want 200 (released)", s)
	}
	if n := metricSum(t, e, "poplimit_edge_requests_total", "rule", "mitigate", "source", "blockcache"); n < 20 {
		t.Errorf("block-cache answers counted %v, want the ~30 of the blocked requests", n)
	}
}
