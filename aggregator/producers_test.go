package aggregator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// emitRounds emits, in turns, n rounds of events from each producer, all
// stamped edge, far enough apart that each round is written in frames of
// its own: the producers' frames interleave on every partition, as two
// edges running side by side do.
func emitRounds(t *testing.T, edge uint16, rounds int, ps ...*pipeline.Producer) {
	t.Helper()
	now := time.Now().UnixNano()
	for r := range rounds {
		for i, p := range ps {
			for k := range 16 {
				e := event.Event{Time: now + int64(r*100+i*10+k)*int64(time.Millisecond), KeyHash: uint64(k + 1),
					Rule: []byte("api"), Cost: 1, Limit: 1000, WindowMillis: 60_000, Edge: edge, Decision: event.Allowed, Estimate: 1}
				if !p.Emit(&e) {
					t.Fatal("Emit: got false, want true")
				}
			}
			time.Sleep(30 * time.Millisecond) // the producer's BatchTimeout is 5 ms: the round is written
		}
	}
}

// TestProducersSharingAnEdgeID runs two producers (two edges, both started
// without -edge-id) that stamp edge 0, side by side: the aggregator counts
// both producer instances and logs it. A producer that stops and another
// that takes its id (an edge restarted) is not counted.
func TestProducersSharingAnEdgeID(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Judge.AllowedLateness = time.Minute
	var logs testenv.LockedBuffer
	a, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAggregator(t, a) })

	// Edge 7 restarts: one producer, then another.
	first := newProducer(t, a.Brokers())
	emitRounds(t, 7, 3, first)
	closeProducer(t, first)
	second := newProducer(t, a.Brokers())
	emitRounds(t, 7, 3, second)

	// Two edges both edge 0, side by side.
	p, q := newProducer(t, a.Brokers()), newProducer(t, a.Brokers())
	emitRounds(t, 0, 4, p, q)

	want := int64(2*3*16 + 4*2*16)
	testenv.WaitFor(t, 30*time.Second, "every event consumed", func() bool {
		return testenv.MetricSum(t, a.reg, "poplimit_aggregator_events_total") >= float64(want)
	})
	if got := testenv.MetricSum(t, a.reg, "poplimit_aggregator_shared_edge_id_producers_total"); got != 2 {
		t.Errorf("producers found sharing an edge id: got %v, want 2 (the two edges 0; edge 7's restart is not sharing)", got)
	}
	if got := testenv.MetricSum(t, a.reg, "poplimit_aggregator_shared_edge_id_producers_total", "edge", "7"); got != 0 {
		t.Errorf("edge 7 (restarted, never two at once): got %v producers sharing, want 0", got)
	}
	l := logs.String()
	if !strings.Contains(l, "producers write under one edge id") || !strings.Contains(l, "edge=0") {
		t.Errorf("log: want a line naming edge 0's shared id; got:\n%s", l)
	}
	if bytes.Contains([]byte(l), []byte("edge=7")) {
		t.Errorf("log: edge 7's restart reported as sharing:\n%s", l)
	}
}

// TestEdgesSharingAnEdgeID runs two real edges with one edge id, side by
// side, producing their decisions to the aggregator's embedded broker: the
// aggregator counts both producers as sharing edge 0.
func TestEdgesSharingAnEdgeID(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Judge.AllowedLateness = time.Minute
	a := startAggregator(t, cfg)
	var edges []*edge.Edge
	for range 2 {
		edges = append(edges, edgetest.Start(t, "", edge.Options{Brokers: a.Brokers(), Topic: topic, EdgeID: 0}))
	}
	client := &http.Client{Timeout: 5 * time.Second}
	sent := 0
	for round := range 4 {
		for i, e := range edges {
			for k := range 8 {
				req, _ := http.NewRequest("GET", "http://"+e.Addr()+"/", nil)
				req.Header.Set("X-API-Key", fmt.Sprintf("client-%d-%d-%d", round, i, k))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				sent++
			}
			time.Sleep(400 * time.Millisecond) // the edge seals its frames every 200 ms: this round's are written
		}
	}
	testenv.WaitFor(t, 30*time.Second, "every decision consumed", func() bool {
		return testenv.MetricSum(t, a.reg, "poplimit_aggregator_events_total") >= float64(sent)
	})
	if got := testenv.MetricSum(t, a.reg, "poplimit_aggregator_shared_edge_id_producers_total", "edge", "0"); got != 2 {
		t.Errorf("producers found sharing edge id 0: got %v, want 2 (two edges with one id)", got)
	}
}
