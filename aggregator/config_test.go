package aggregator

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/pipeline"
)

// TestZeroConfigStarts: a Config that sets nothing but its two loopback
// ports (any free one) is an aggregator at the documented defaults: it
// consumes the default topic, deduplicates copies, judges a quiet stream
// after the default idle flush, and creates the counts' topic at its
// default bound and publishes there.
func TestZeroConfigStarts(t *testing.T) {
	t.Parallel()
	a, err := Start(context.Background(), Config{Listen: "127.0.0.1:0", Embedded: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatalf("Start of a zero Config: %v", err)
	}
	t.Cleanup(func() { stopAggregator(t, a) })
	c := a.cfg
	wantJudge := judge.DefaultConfig()
	wantJudge.Dedup = DefaultDedup
	if c.Partitions != DefaultPartitions || c.Consumer.Topic != pipeline.DefaultTopic || c.Consumer.GroupID != DefaultGroup ||
		c.Judge != wantJudge || c.IdleFlush != DefaultIdleFlush || c.ShutdownTimeout != DefaultShutdownTimeout ||
		c.GlobalTopic != global.DefaultTopic || c.GlobalInterval != global.DefaultInterval || c.GlobalMaxKeys != DefaultGlobalMaxKeys ||
		c.EmbeddedRetentionBytes != DefaultEmbeddedRetentionBytes || c.Consumer.MaxBatch != pipeline.DefaultConsumerConfig().MaxBatch {
		t.Errorf("a zero Config started with %+v; want every field at its documented default", c)
	}

	pc := pipeline.DefaultProducerConfig()
	pc.Brokers, pc.Topic, pc.BatchTimeout = a.Brokers(), pipeline.DefaultTopic, 5*time.Millisecond
	p, err := pipeline.NewProducer(pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	const n = 20
	for i := range n {
		e := event.Event{Time: now + int64(i)*int64(time.Millisecond), KeyHash: uint64(i%4 + 1), Rule: []byte("api"),
			Cost: 1, Limit: 10, WindowMillis: 10_000, Edge: 1, Decision: event.Allowed, Estimate: 1}
		if !p.Emit(&e) {
			t.Fatal("Emit: got false, want true")
		}
	}
	closeProducer(t, p)
	// No flush asked: the default idle flush judges the quiet stream.
	testenv.WaitFor(t, 30*time.Second, "every event judged by the idle flush", func() bool {
		r := a.Report(false)
		return r.Judged == n && r.Buffered == 0
	})
	if got := topicConfig(t, a.Brokers(), global.DefaultTopic, "retention.bytes"); got != strconv.Itoa(DefaultEmbeddedGlobalRetentionBytes) {
		t.Errorf("the counts' topic: retention.bytes %q, want it created with the default %d", got, DefaultEmbeddedGlobalRetentionBytes)
	}
	testenv.WaitFor(t, 30*time.Second, "the publisher's heartbeats in the counts' topic", func() bool {
		conn, err := kafka.DialLeader(t.Context(), "tcp", a.Brokers()[0], global.DefaultTopic, 0)
		if err != nil {
			return false
		}
		defer conn.Close()
		last, err := conn.ReadLastOffset()
		return err == nil && last > 0
	})
}

// TestValidateNamesEveryProblem: every bad field is reported at once,
// each with its field's name and the command's flag.
func TestValidateNamesEveryProblem(t *testing.T) {
	c := Config{Embedded: "0.0.0.0:1", Partitions: -1, ShutdownTimeout: -time.Second, GlobalMinShare: 2,
		GlobalMaxKeys: -1, GlobalPublisher: strings.Repeat("p", global.MaxPublisherLen+1), EmbeddedRetentionBytes: -1}
	c = c.WithDefaults()
	c.Judge.MaxKeys = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate: got nil, want every problem")
	}
	for _, want := range []string{"-embedded-broker \"0.0.0.0:1\" (Config.Embedded)", "-partitions -1 (Config.Partitions)",
		"(Config.ShutdownTimeout)", "-global-min-share 2 (Config.GlobalMinShare)", "-global-max-keys -1 (Config.GlobalMaxKeys)",
		"(Config.GlobalPublisher)", "EmbeddedRetentionBytes", "Config.MaxKeys = 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v\nlacks %q", err, want)
		}
	}
}

// TestWithDefaultsKeepsWhatIsSet: WithDefaults fills zeros only: a Judge
// or a Consumer set up is taken as it is (its zeros turn features off),
// Never stays never, and a Consumer naming only its topic gets the
// default tuning.
func TestWithDefaultsKeepsWhatIsSet(t *testing.T) {
	var c Config
	c.Judge = judge.DefaultConfig() // Dedup 0: off
	c.IdleFlush, c.GlobalInterval = Never, Never
	c.Consumer.Topic = "mine"
	d := c.WithDefaults()
	if d.Judge.Dedup != 0 || d.IdleFlush != Never || d.GlobalInterval != Never {
		t.Errorf("got dedup %d, idle flush %v, global interval %v; want 0, Never, Never as set", d.Judge.Dedup, d.IdleFlush, d.GlobalInterval)
	}
	if d.Consumer.Topic != "mine" || d.Consumer.MaxBatch != pipeline.DefaultConsumerConfig().MaxBatch || d.Consumer.GroupID != DefaultGroup {
		t.Errorf("consumer: got topic %q, max batch %d, group %q; want mine and the defaults", d.Consumer.Topic, d.Consumer.MaxBatch, d.Consumer.GroupID)
	}
	c.Consumer.MaxBatch = 7
	if got := c.WithDefaults().Consumer; got.MaxBatch != 7 || got.SessionTimeout != 0 {
		t.Errorf("a consumer set up: got max batch %d, session timeout %v; want it as given", got.MaxBatch, got.SessionTimeout)
	}
}

// TestPprof: /debug/pprof/ is served with Config.Pprof and not without.
func TestPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		a := &Aggregator{cfg: Config{Pprof: on}.WithDefaults(), reg: prometheus.NewRegistry()}
		rec := httptest.NewRecorder()
		a.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if rec.Code != want {
			t.Errorf("Pprof %v: GET /debug/pprof/ answered %d, want %d", on, rec.Code, want)
		}
	}
}
