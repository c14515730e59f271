package faults

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
)

const (
	eventsTopic = "poplimit.decisions"
	partitions  = 4
)

// broker is a kfake broker on a fixed port that keeps its log and the
// groups' offsets in a directory, so that it can be stopped and started
// again as "the same" broker.
type broker struct {
	port int
	dir  string
	mu   sync.Mutex
	c    *kfake.Cluster
}

func startBroker(t testing.TB) *broker {
	t.Helper()
	b := &broker{port: testenv.FreePort(t), dir: t.TempDir()}
	b.start(t)
	t.Cleanup(b.stop)
	return b
}

func (b *broker) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

func (b *broker) start(t testing.TB) {
	t.Helper()
	var err error
	for try := 0; try < 50; try++ { // the port may linger a moment after a stop
		var c *kfake.Cluster
		c, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(b.port), kfake.DataDir(b.dir),
			kfake.SeedTopics(partitions, eventsTopic))
		if err == nil {
			b.mu.Lock()
			b.c = c
			b.mu.Unlock()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("kfake on port %d: %v", b.port, err)
}

func (b *broker) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
	}
}

// pipelineEdges starts two in-process edges over one memcached shard whose
// decisions go to Kafka through a producer each, configured as cmd/edge
// configures them (pipeline.DefaultProducerConfig).
func pipelineEdges(t *testing.T, brokerAddr string) (edges []*inEdge, prods []*pipeline.Producer, targets []string) {
	t.Helper()
	_, shards := testenv.Shards(t, 1)
	for id := 1; id <= 2; id++ {
		reg := prometheus.NewRegistry()
		pc := pipeline.DefaultProducerConfig()
		pc.Brokers, pc.Topic = []string{brokerAddr}, eventsTopic
		p, err := pipeline.NewProducer(pc, reg)
		if err != nil {
			t.Fatal(err)
		}
		e := newEdge(t, edgeSpec{id: id, rules: "rules: [{name: api, limit: 20, window: 2s}]", servers: shardsNamed(shards...),
			events: p, reg: reg})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.Close(ctx)
		})
		edges, prods, targets = append(edges, e), append(prods, p), append(targets, serve(t, e).addr)
	}
	return edges, prods, targets
}

// producerCounts sums the producers' outcome counters over edges.
type producerCounts struct {
	emitted, delivered, dropped, failed, sampled float64
}

func countsOf(t testing.TB, edges []*inEdge) producerCounts {
	var c producerCounts
	for _, e := range edges {
		c.emitted += testenv.MetricSum(t, e.reg, "poplimit_pipeline_events_emitted_total")
		c.delivered += testenv.MetricSum(t, e.reg, "poplimit_pipeline_events_delivered_total")
		c.dropped += testenv.MetricSum(t, e.reg, "poplimit_pipeline_events_dropped_total")
		c.failed += testenv.MetricSum(t, e.reg, "poplimit_pipeline_events_failed_total")
		c.sampled += testenv.MetricSum(t, e.reg, "poplimit_pipeline_events_sampled_out_total")
	}
	return c
}

func (c producerCounts) String() string {
	return fmt.Sprintf("emitted %.0f, delivered %.0f, dropped %.0f, failed %.0f", c.emitted, c.delivered, c.dropped, c.failed)
}

// pipelineLoad is the traffic of the pipeline tests: 100 clients at 8
// requests per second (800 per second), each alternating between the edges.
func pipelineLoad(d time.Duration) []loadtest.TraceRequest {
	var clients []client
	for i := range 100 {
		clients = append(clients, client{ip: clientIP(500 + i), path: "/", rate: 8})
	}
	reqs, _ := steady(clients, d, 4)
	return reqs
}

// perSecond counts completed requests in each second of a replay.
func perSecond(results []loadtest.Result, start time.Time, n int) []int {
	out := make([]int, n)
	for _, r := range results {
		if r.Err != nil || r.Status == 0 {
			continue
		}
		if s := int(r.Done.Sub(start) / time.Second); s >= 0 && s < n {
			out[s]++
		}
	}
	return out
}

// TestBrokerOutage stops the Kafka broker for 5 s under 800 requests per
// second through two edges, then starts it again (same port, same log on
// disk). The edges' throughput and latency do not change, the producers
// pause and hold what they cannot deliver (nothing is lost), deliver again
// by themselves, and the aggregator (the binary) catches up with every event
// in the topic (at least once: a batch whose commit the outage cut off is
// judged again).
func TestBrokerOutage(t *testing.T) {
	b := startBroker(t)
	agg := startAggregatorProc(t, "-brokers", b.addr(), "-topic", eventsTopic, "-group", "faults", "-idle-flush", "500ms")
	edges, prods, targets := pipelineEdges(t, b.addr())

	before, outage, after := 4*time.Second, 5*time.Second, 6*time.Second
	total := before + outage + after
	reqs := pipelineLoad(total)
	start := alignedStart(time.Second)
	var atStop, atStart producerCounts
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(start.Add(before)))
		atStop = countsOf(t, edges)
		b.stop()
		time.Sleep(outage)
		atStart = countsOf(t, edges)
		b.start(t)
	}()
	results, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin, Align: time.Second}, reqs)
	<-done
	end := countsOf(t, edges)
	t.Logf("replay: %d sent, %d completed, errors %v, statuses %v", rep.Sent, rep.Completed, rep.Errors, rep.Statuses)
	if rep.Completed != rep.Sent || len(rep.Errors) > 0 {
		t.Errorf("replay: %d sent, %d completed, errors %v: want every request answered", rep.Sent, rep.Completed, rep.Errors)
	}

	// Throughput and service time per phase.
	secs := perSecond(results, start, int(total/time.Second))
	t.Logf("completed per second: %v (broker down in seconds %d to %d)", secs, before/time.Second, (before+outage)/time.Second-1)
	phaseRate := func(from, to time.Duration) float64 {
		n := 0
		for s := int(from / time.Second); s < int(to/time.Second); s++ {
			n += secs[s]
		}
		return float64(n) / (to - from).Seconds()
	}
	rb, rd, ra := phaseRate(time.Second, before), phaseRate(before, before+outage), phaseRate(before+outage, total)
	lat := [3]latencies{}
	for _, r := range results {
		if r.Err != nil || r.Status == 0 {
			continue
		}
		ph := 0
		switch {
		case r.Sent.After(start.Add(before + outage)):
			ph = 2
		case r.Sent.After(start.Add(before)):
			ph = 1
		}
		lat[ph] = append(lat[ph], r.Done.Sub(r.Sent))
	}
	t.Logf("throughput: %.0f/s before, %.0f/s with the broker down, %.0f/s after; latency before %v; down %v; after %v", rb, rd, ra, lat[0], lat[1], lat[2])
	if why := overloaded(rep); why == "" && (rd < 0.9*rb || ra < 0.9*rb) {
		t.Errorf("throughput %.0f/s before, %.0f/s down, %.0f/s after: want within noise (10%%)", rb, rd, ra)
	}

	// The producers: what the outage cost, and recovery.
	t.Logf("producers when the broker stopped: %v; when it came back: %v; at the end of the replay: %v", atStop, atStart, end)
	lost := (atStart.dropped - atStop.dropped) + (atStart.failed - atStop.failed)
	if lost == 0 && atStart.delivered == atStop.delivered && atStart.emitted-atStart.delivered < 1000 {
		t.Errorf("the outage cost nothing and delivered nothing: want undelivered events queued, dropped or failed, and counted")
	}
	testenv.WaitFor(t, 30*time.Second, "the producers delivering again", func() bool {
		return countsOf(t, edges).delivered > atStart.delivered+1000
	})
	for _, p := range prods {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := p.Close(ctx); err != nil {
			t.Errorf("closing a producer after the outage: %v", err)
		}
		cancel()
	}
	final := countsOf(t, edges)
	t.Logf("producers closed: %v", final)
	if final.emitted != final.delivered+final.dropped+final.failed+final.sampled {
		t.Errorf("producers: %v: want every event delivered, dropped or failed, and counted", final)
	}
	// The producers pause while the broker is away: the queue (65,536
	// events each) carries the 4,000 of a 5 s outage, and the events of
	// the writes that failed are sent again.
	if final.failed != 0 || final.dropped != 0 {
		t.Errorf("producers: %v: want nothing failed or dropped, the outage carried by the queues", final)
	}

	// The aggregator catches up with everything in the topic.
	logged := testenv.TopicEvents(t, b.addr(), eventsTopic, partitions)
	caught := time.Now()
	testenv.WaitFor(t, 60*time.Second, "the aggregator to catch up", func() bool {
		r := agg.report(t, false)
		return r.Events+r.Duplicates >= logged
	})
	t.Logf("the topic holds %d events (%.0f delivered); the aggregator had them all %v after the producers closed, %v after the broker returned",
		logged, final.delivered, time.Since(caught).Round(10*time.Millisecond), time.Since(start.Add(before+outage)).Round(10*time.Millisecond))
	if logged < int64(final.delivered) {
		t.Errorf("the topic holds %d events, fewer than the %.0f delivered", logged, final.delivered)
	}
	time.Sleep(500 * time.Millisecond)
	// The consumer is at-least-once: a batch whose commit failed because
	// the broker had gone is read again when it returns. The judge drops
	// such copies (-dedup), and a producer's retried batch alike, so each
	// delivered event is judged exactly once.
	r := agg.report(t, true)
	am := scrape(t, "http://"+agg.addr+"/metrics")
	t.Logf("the aggregator took %d events for the %d in the topic and the %.0f delivered, and dropped %d copies; consumer commit errors %v, fetch errors %v",
		r.Events, logged, final.delivered, r.Duplicates, am.sum("poplimit_pipeline_commit_errors_total"), am.sum("poplimit_pipeline_fetch_errors_total"))
	if r.Events != int64(final.delivered) || r.Events+r.Duplicates < logged {
		t.Errorf("the aggregator judged %d events (and dropped %d copies), the producers delivered %.0f and the topic holds %d: want each delivered event judged once",
			r.Events, r.Duplicates, final.delivered, logged)
	}
}

// TestAggregatorRestart stops the aggregator binary with SIGTERM in the
// middle of a stream of decisions from two edges and starts another in the
// same consumer group: between them they take every event in the topic
// exactly once, and each judges all it took.
func TestAggregatorRestart(t *testing.T) {
	b := startBroker(t)
	args := []string{"-brokers", b.addr(), "-topic", eventsTopic, "-group", "faults", "-idle-flush", "500ms"}
	first := startAggregatorProc(t, args...)
	edges, prods, targets := pipelineEdges(t, b.addr())

	total := 9 * time.Second
	reqs := pipelineLoad(total)
	start := alignedStart(time.Second)
	var second *aggProc
	var firstEvents, firstDups, firstJudged, firstLate int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(start.Add(3 * time.Second)))
		if err := first.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("the first aggregator after SIGTERM: %v", err)
		}
		out := first.out.String()
		var ok1, ok2, ok3 bool
		firstEvents, ok1 = logField(out, "judged everything consumed", "events")
		firstDups, _ = logField(out, "judged everything consumed", "duplicates") // copies, dropped
		firstJudged, ok2 = logField(out, "judged everything consumed", "judged")
		firstLate, ok3 = logField(out, "judged everything consumed", "late")
		if !ok1 || !ok2 || !ok3 {
			t.Errorf("the first aggregator did not log its final counts:\n%s", out)
		}
		time.Sleep(time.Second)
		second = startAggregatorProc(t, args...)
	}()
	_, rep := replay(t, context.Background(), loadtest.ReplayConfig{Targets: targets, Spread: loadtest.RoundRobin, Align: time.Second}, reqs)
	<-done
	if rep.Completed != rep.Sent || len(rep.Errors) > 0 {
		t.Errorf("replay: %d sent, %d completed, errors %v", rep.Sent, rep.Completed, rep.Errors)
	}
	for _, p := range prods {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := p.Close(ctx); err != nil {
			t.Errorf("closing a producer: %v", err)
		}
		cancel()
	}
	c := countsOf(t, edges)
	logged := testenv.TopicEvents(t, b.addr(), eventsTopic, partitions)
	testenv.WaitFor(t, 60*time.Second, "the second aggregator to take the rest", func() bool {
		r := second.report(t, false)
		return firstEvents+firstDups+r.Events+r.Duplicates >= logged
	})
	time.Sleep(time.Second) // room for a replayed batch to show up
	if err := second.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("the second aggregator after SIGTERM: %v", err)
	}
	out := second.out.String()
	secondEvents, _ := logField(out, "judged everything consumed", "events")
	secondDups, _ := logField(out, "judged everything consumed", "duplicates")
	secondJudged, _ := logField(out, "judged everything consumed", "judged")
	secondLate, _ := logField(out, "judged everything consumed", "late")
	t.Logf("%d requests, %.0f events delivered, %d in the topic; first aggregator took %d (judged %d, late %d), second took %d (judged %d, late %d): %d in all",
		rep.Completed, c.delivered, logged, firstEvents, firstJudged, firstLate, secondEvents, secondJudged, secondLate, firstEvents+secondEvents)
	if firstEvents == 0 || secondEvents == 0 {
		t.Errorf("the restart was not mid-stream: %d and %d events", firstEvents, secondEvents)
	}
	if taken := firstEvents + firstDups + secondEvents + secondDups; taken != logged {
		t.Errorf("the two aggregators took %d (%d copies) + %d (%d copies) = %d events, the topic holds %d: want each exactly once",
			firstEvents, firstDups, secondEvents, secondDups, taken, logged)
	}
	if firstJudged+firstLate != firstEvents || secondJudged+secondLate != secondEvents {
		t.Errorf("judged + late: %d + %d of %d, %d + %d of %d: want every event taken judged or counted late",
			firstJudged, firstLate, firstEvents, secondJudged, secondLate, secondEvents)
	}
	if int64(c.delivered) > logged || int64(c.emitted) != int64(c.delivered+c.dropped+c.failed+c.sampled) {
		t.Errorf("producers %v, topic %d: want every event accounted for", c, logged)
	}
}
