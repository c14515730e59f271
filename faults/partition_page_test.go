package faults

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/plotpage"
	"github.com/poplimit/poplimit/internal/plotpage/pagetest"
	"github.com/poplimit/poplimit/loadtest"
)

// clientClass is a group of the partition's clients, by their rate
// against the limit.
type clientClass struct {
	name      string  // "within its limit", …
	id        string  // the chart's id
	rate      float64 // requests per second each sends
	allowance float64 // what each may be admitted per second: min(rate, limit)
	members   []int   // client indices whose counters sit on a shard one edge lost
}

// sideSeries is what one class was admitted per second per client,
// through edge 1, through edge 2 and in all, in steps of a second from the
// replay's start; and the whole run's counts.
type sideSeries struct {
	perSecond [3][]float64 // per client
	counts    [3][]int64   // all members
	total     [3]int64
}

// sides counts the 2xx answers of the class's clients per second and per
// edge (Result.Target: the edge it went to, 0 or 1), by scheduled time.
func sides(results []loadtest.Result, owner []int, cl *clientClass, start time.Time, total time.Duration) sideSeries {
	n := int(math.Ceil(total.Seconds()))
	var s sideSeries
	for k := range s.counts {
		s.counts[k] = make([]int64, n)
	}
	in := map[int]bool{}
	for _, ci := range cl.members {
		in[ci] = true
	}
	for i := range results {
		r := &results[i]
		if i >= len(owner) || !in[owner[i]] || r.Status < 200 || r.Status >= 300 || r.Scheduled.IsZero() {
			continue
		}
		sec := int(r.Scheduled.Sub(start) / time.Second)
		if sec < 0 || sec >= n || r.Target < 0 || r.Target > 1 {
			continue
		}
		s.counts[r.Target][sec]++
		s.counts[2][sec]++
		s.total[r.Target]++
		s.total[2]++
	}
	for k := range s.counts {
		s.perSecond[k] = make([]float64, n)
		for i, c := range s.counts[k] {
			s.perSecond[k][i] = float64(c) / float64(max(1, len(cl.members)))
		}
	}
	return s
}

// partitionPage draws, per class of client, the admitted per second per
// client through each side of the split and in all, against the
// allowance, with the partition shaded and the heal marked.
func partitionPage(classes []clientClass, series []sideSeries, settings [][2]string, splitAt, healAt, settled float64,
	phases []string, phaseTable map[string][][]string) *plotpage.Page {
	pg := &plotpage.Page{Title: "poplimit: a partition of the shared store, as each client saw it", Settings: settings, Data: map[string]string{}}
	for i, cl := range classes {
		s := series[i]
		x := make([]float64, len(s.perSecond[0])+1)
		for j := range x {
			x[j] = float64(j)
		}
		closed := func(ys []float64) []float64 {
			if len(ys) == 0 {
				return ys
			}
			return append(ys[:len(ys):len(ys)], ys[len(ys)-1])
		}
		c := plotpage.Chart{ID: cl.id, Title: fmt.Sprintf("Clients %s (%g requests/s each, limit 10/s): admitted per second per client", cl.name, cl.rate),
			XLabel: "seconds since the start", YLabel: "admitted per second", YZero: true, Height: 230,
			Series: []plotpage.Series{
				{Name: "through edge 1 (lost shard 2)", X: x, Y: closed(s.perSecond[0]), Step: true, Color: 4},
				{Name: "through edge 2 (lost shard 0)", X: x, Y: closed(s.perSecond[1]), Step: true, Color: 7},
				{Name: "both edges", X: x, Y: closed(s.perSecond[2]), Step: true, Color: 1},
			},
			HLines: []plotpage.Marker{{At: cl.allowance, Label: fmt.Sprintf("allowance %g/s", cl.allowance), Color: 3}},
			VLines: []plotpage.Marker{{At: splitAt, Label: "partition", Color: 5}, {At: healAt, Label: "heal", Color: 5}, {At: settled, Label: "rings whole + 1 window", Color: 6}},
			Spans:  []plotpage.Span{{From: splitAt, To: healAt, Label: "partitioned"}},
			Data: map[string]string{"clients": strconv.Itoa(len(cl.members)), "allowance": strconv.FormatFloat(cl.allowance, 'g', -1, 64),
				"edge-1": plotpage.Ints(s.counts[0]), "edge-2": plotpage.Ints(s.counts[1]), "both": plotpage.Ints(s.counts[2]),
				"admitted": strconv.FormatInt(s.total[2], 10)},
			Caption: fmt.Sprintf("The %d clients of this class whose counters sat on a shard one edge lost (shard 0 or 2), each dealt round-robin over both edges; per second of scheduled time, the 2xx answers divided by the clients.", len(cl.members)),
		}
		pg.Data["admitted-"+cl.id] = strconv.FormatInt(s.total[2], 10)
		pg.Sections = append(pg.Sections, plotpage.Section{
			Heading: "Clients " + cl.name,
			Tables:  []plotpage.FigureTable{{ID: "table-" + cl.id, Head: append([]string{"per client, admitted per second"}, phases...), Rows: phaseTable[cl.id]}},
			Charts:  []plotpage.Chart{c},
		})
	}
	return pg
}

// writePartitionPage writes the page to POPLIMIT_PARTITION_PAGE (or the
// test's directory), opens it in Chromium, and checks that each chart's
// counts sum to want (the class's admitted requests, counted from the
// edges' decision events). POPLIMIT_PARTITION_SCREENSHOT keeps the
// browser's picture of it (faults/partition.png is one).
func writePartitionPage(t *testing.T, pg *plotpage.Page, classes []clientClass, want []int64) {
	t.Helper()
	path := os.Getenv("POPLIMIT_PARTITION_PAGE")
	if path == "" {
		path = filepath.Join(t.TempDir(), "partition.html")
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.WriteHTML(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the partition drawn: %s", path)
	b := pagetest.Open(t, path, 1000, 1000, len(classes))
	for i, cl := range classes {
		var sums [3]int64
		for k, attr := range []string{"data-edge-1", "data-edge-2", "data-both"} {
			for _, f := range splitInts(b.Attr("#"+cl.id, attr)) {
				sums[k] += f
			}
		}
		if sums[0]+sums[1] != sums[2] || sums[2] != want[i] {
			t.Errorf("the %s chart plots %d + %d = %d admitted; the edges' events say %d", cl.name, sums[0], sums[1], sums[2], want[i])
		}
	}
	if p := os.Getenv("POPLIMIT_PARTITION_SCREENSHOT"); p != "" {
		if err := os.WriteFile(p, b.FullScreenshot(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func splitInts(s string) []int64 {
	var out []int64
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				n, _ := strconv.ParseInt(s[start:i], 10, 64)
				out = append(out, n)
			}
			start = i + 1
		}
	}
	return out
}
