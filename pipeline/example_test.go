package pipeline_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/policy"
)

// A frame carries many events of one edge, numbered in its (edge,
// partition) stream; a consumer reads its header and its events at once.
// Here a frame is written by hand, as FORMAT.md lays it out: the header
// (format byte, edge, number, event count), then each event after its
// length.
func ExampleDecodeFrame() {
	evs := []event.Event{
		{Edge: 4, Rule: []byte("api"), KeyHash: 1, Limit: 10, Burst: 10, Decision: event.Allowed},
		{Edge: 4, Rule: []byte("api"), KeyHash: 1, Limit: 10, Burst: 10, Decision: event.Limited},
		{Edge: 4, Rule: []byte("upload"), KeyHash: 2, Limit: 5, Burst: 20, Algorithm: policy.LeakyBucket,
			Delayed: true, DelayMicros: 1500},
	}
	b := []byte{0x80 | pipeline.FrameVersion, 0, 4, 0, 0, 0, 0, 0, 0, 0, 41, 0, byte(len(evs))}
	for i := range evs {
		b = binary.AppendUvarint(b, uint64(event.EncodedLen(&evs[i])))
		var err error
		if b, err = event.Append(b, &evs[i]); err != nil {
			log.Fatal(err)
		}
	}
	var h pipeline.FrameHeader
	got, err := pipeline.DecodeFrame(b, &h, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("frame of edge %d, number %d, %d events in %d bytes\n", h.Edge, h.Seq, h.Count, len(b))
	for _, e := range got {
		fmt.Printf("%s %s %s delayed=%v %dµs\n", e.Rule, e.Algorithm, e.Decision, e.Delayed, e.DelayMicros)
	}
	// Output:
	// frame of edge 4, number 41, 3 events in 123 bytes
	// api sliding_window allowed delayed=false 0µs
	// api sliding_window limited delayed=false 0µs
	// upload leaky_bucket allowed delayed=true 1500µs
}

func ExampleProducerConfig_Validate() {
	cfg := pipeline.DefaultProducerConfig()
	cfg.Brokers = []string{"kafka-1:9092"}
	cfg.BatchTimeout = 0 // kafka-go would silently wait a second
	cfg.SampleRate = 2
	err := cfg.Validate()
	fmt.Println(errors.Is(err, pipeline.ErrConfig))
	fmt.Println(err)
	// Output:
	// true
	// pipeline: invalid config: ProducerConfig.Topic = "": required
	// pipeline: invalid config: ProducerConfig.SampleRate = 2: must be in (0, 1]
	// pipeline: invalid config: ProducerConfig.BatchTimeout = 0s: must be positive (kafka-go turns 0 into 1s)
}

func ExampleSampleKey() {
	kept := 0
	for k := range uint64(100_000) {
		if pipeline.SampleKey(k, 0.1) {
			kept++
		}
	}
	fmt.Printf("about %d%% of keys kept\n", (kept+500)/1000)
	// Output: about 10% of keys kept
}

// An edge builds one Producer at start-up and emits an event per decision.
func ExampleNewProducer() {
	cfg := pipeline.DefaultProducerConfig()
	cfg.Brokers = []string{"kafka-1:9092", "kafka-2:9092"}
	cfg.Topic = "poplimit-decisions"
	p, err := pipeline.NewProducer(cfg, prometheus.DefaultRegisterer)
	if err != nil {
		log.Fatal(err)
	}
	rule := []byte("api") // from configuration: never modified, so Emit need not copy it

	// On the request path, after each decision:
	p.Emit(&event.Event{
		Time: time.Now().UnixNano(), Edge: 1, Rule: rule, KeyHash: 0x1234,
		Cost: 1, Limit: 100, WindowMillis: 60_000, Estimate: 42,
	})

	// At shutdown, after the server stopped taking requests:
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		log.Print(err) // some queued events were counted as failed
	}
}

// The aggregator consumes as a group until it is told to stop.
func ExampleNewConsumer() {
	cfg := pipeline.DefaultConsumerConfig()
	cfg.Brokers = []string{"kafka-1:9092"}
	cfg.Topic = "poplimit-decisions"
	cfg.GroupID = "poplimit-aggregator"
	c, err := pipeline.NewConsumer(cfg, prometheus.DefaultRegisterer)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err = c.Run(ctx, func(batch []event.Event) error {
		for _, e := range batch {
			_ = e // judge the decision; copy e.Rule if it is kept
		}
		return nil // only now are the batch's offsets committed
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Events go from a producer, through an embedded Kafka-protocol broker, to a
// consumer group.
func Example() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "decisions"))
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()

	pcfg := pipeline.DefaultProducerConfig()
	pcfg.Brokers, pcfg.Topic = addr, "decisions"
	p, err := pipeline.NewProducer(pcfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, d := range []event.Admission{event.Allowed, event.Allowed, event.Limited} {
		p.Emit(&event.Event{Time: int64(i), Rule: []byte("api"), KeyHash: 7, Limit: 2, Estimate: float32(i + 1), Decision: d})
	}
	if err := p.Close(context.Background()); err != nil {
		log.Fatal(err)
	}

	ccfg := pipeline.DefaultConsumerConfig()
	ccfg.Brokers, ccfg.Topic, ccfg.GroupID = addr, "decisions", "judge"
	ccfg.SessionTimeout = 6 * time.Second // kfake's minimum
	c, err := pipeline.NewConsumer(ccfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := 0
	err = c.Run(ctx, func(batch []event.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			fmt.Printf("%s %s: estimate %.0f, limit %d\n", e.Rule, e.Decision, e.Estimate, e.Limit)
		}
		if seen += len(batch); seen == 3 {
			cancel()
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// api allowed: estimate 1, limit 2
	// api allowed: estimate 2, limit 2
	// api limited: estimate 3, limit 2
}
