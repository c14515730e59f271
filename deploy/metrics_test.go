package deploy

import (
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/aggstate"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/shardproxy"
)

// recorder is a Registerer that remembers what it registered, so that the
// test can ask every collector for its descriptions, children or not.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// metricSet is the metric names a PoP exports, with their types where a
// sample shows them.
type metricSet struct {
	names map[string]bool
	types map[string]dto.MetricType
}

var (
	codeMetricsOnce sync.Once
	codeMetrics     metricSet
	codeMetricsErr  error
)

// exportedMetrics builds the parts of an edge and of the aggregator as
// cmd/edge and package aggregator do, each registering its metrics with its
// registry as there, and returns every metric name they describe. Nothing
// is served and nothing connects anywhere but loopback port 1 (refused).
func exportedMetrics(t *testing.T) metricSet {
	t.Helper()
	codeMetricsOnce.Do(func() { codeMetrics, codeMetricsErr = buildMetricSet() })
	if codeMetricsErr != nil {
		t.Fatalf("building the components to list their metrics: %v", codeMetricsErr)
	}
	return codeMetrics
}

func buildMetricSet() (metricSet, error) {
	reg := prometheus.NewRegistry()
	rec := &recorder{Registry: reg}
	closers := []func(){}
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The edge, as cmd/edge builds it (edge.Build), with a store and a
	// broker that refuse connections.
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o := edge.Options{Brokers: []string{"127.0.0.1:1"}, Pop: "pop1", Registry: rec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.Memcache.Servers = []shardproxy.Server{{Addr: "127.0.0.1:1"}}
	o.BlockCache.MaxEntries = 1024
	o.XDS.Server = "127.0.0.1:1" // the rate limit configuration over xDS, refused likewise
	e, err := edge.Build(o)
	if err != nil {
		return metricSet{}, err
	}
	closers = append(closers, func() { e.Close(ctx) })

	// The aggregator, as package aggregator builds it (aggregator.Start), in a
	// registry of its own.
	areg := prometheus.NewRegistry()
	arec := &recorder{Registry: areg}
	if _, err := judge.New(judge.DefaultConfig(), arec); err != nil {
		return metricSet{}, err
	}
	cc := pipeline.DefaultConsumerConfig()
	cc.Brokers, cc.Topic, cc.GroupID = []string{"127.0.0.1:1"}, "poplimit.decisions", "poplimit-aggregator"
	cons, err := pipeline.NewConsumer(cc, arec)
	if err != nil {
		return metricSet{}, err
	}
	closers = append(closers, func() { cons.Close() })
	if _, err := global.NewPublisher(global.NewTally(global.TallyConfig{}), global.KafkaConfig{Brokers: cc.Brokers}, time.Second, nil, arec); err != nil {
		return metricSet{}, err
	}
	aggstate.NewProducers(slog.New(slog.DiscardHandler), arec)
	arec.MustRegister(aggstate.TallyDropped(global.NewTally(global.TallyConfig{})))

	ms := metricSet{names: map[string]bool{}, types: map[string]dto.MetricType{}}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, cs := range [][]prometheus.Collector{rec.collectors, arec.collectors} {
		for _, c := range cs {
			ch := make(chan *prometheus.Desc, 64)
			go func() { c.Describe(ch); close(ch) }()
			for d := range ch {
				if m := fqName.FindStringSubmatch(d.String()); m != nil {
					ms.names[m[1]] = true
				}
			}
		}
	}
	for _, g := range []prometheus.Gatherer{reg, areg} {
		mfs, err := g.Gather()
		if err != nil {
			return metricSet{}, err
		}
		for _, mf := range mfs {
			ms.names[mf.GetName()] = true
			ms.types[mf.GetName()] = mf.GetType()
		}
	}
	// Series that Prometheus itself writes.
	for _, n := range []string{"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS", "ALERTS_FOR_STATE"} {
		ms.names[n] = true
	}
	return ms, nil
}

// known reports whether name is an exported metric, or a histogram's or a
// summary's _bucket, _sum or _count series of one.
func (ms metricSet) known(name string) bool {
	if ms.names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok || !ms.names[base] {
			continue
		}
		typ, seen := ms.types[base]
		if !seen || typ == dto.MetricType_HISTOGRAM || typ == dto.MetricType_GAUGE_HISTOGRAM ||
			(typ == dto.MetricType_SUMMARY && suffix != "_bucket") {
			return true
		}
	}
	return false
}

func TestExportedMetricsAreListed(t *testing.T) {
	ms := exportedMetrics(t)
	// A few of each component, so that a change in how they are built does
	// not silently empty the list the other tests check names against.
	for _, name := range []string{
		"poplimit_edge_requests_total", "poplimit_edge_ready", "poplimit_edge_rules_last_reload_ok",
		"poplimit_window_fallbacks_total", "poplimit_window_flush_duration_seconds",
		"poplimit_blockcache_hits_total", "poplimit_shardproxy_op_duration_seconds",
		"poplimit_shardproxy_shards_ejected", "poplimit_pipeline_events_dropped_total",
		"poplimit_pipeline_consumer_lag_messages", "poplimit_aggregator_decisions_total",
		"poplimit_aggregator_watermark_timestamp_seconds", "process_resident_memory_bytes",
	} {
		if !ms.names[name] {
			t.Errorf("%s is not among the %d exported metrics", name, len(ms.names))
		}
	}
	if !ms.known("poplimit_shardproxy_op_duration_seconds_bucket") {
		t.Error("poplimit_shardproxy_op_duration_seconds_bucket: want it known (a histogram)")
	}
	if ms.known("poplimit_edge_requests_total_bucket") {
		t.Error("poplimit_edge_requests_total_bucket: want it unknown (a counter)")
	}
}
