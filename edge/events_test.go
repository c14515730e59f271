package edge_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// TestDecisionEventsReachKafka sends requests through an edge whose events
// go to a real Kafka-protocol broker and reads them back through a consumer
// group: one event per decision, with the rule, key hash, decision and
// source the edge used.
func TestDecisionEventsReachKafka(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 2, "decisions")
	pc := pipeline.DefaultProducerConfig()
	pc.Brokers, pc.Topic = []string{broker}, "decisions"
	prod, err := pipeline.NewProducer(pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	var opts edge.Options
	opts.EdgeID = 7
	opts.Events = prod
	ed := edgetest.Start(t, "rules: [{name: evt, limit: 3, window: 1m}]", opts)
	for i := 0; i < 6; i++ {
		get(t, ed.Addr(), "/")
		ed.Blocks.Wait()
	}
	rs := ed.Rules()
	ed.Close(context.Background())
	if err := prod.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	cc := pipeline.DefaultConsumerConfig()
	cc.Brokers, cc.Topic, cc.GroupID = []string{broker}, "decisions", "test"
	cons, err := pipeline.NewConsumer(cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []event.Event
	go cons.Run(ctx, func(batch []event.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			e.Rule = append([]byte(nil), e.Rule...)
			got = append(got, e)
		}
		if len(got) >= 6 {
			cancel()
		}
		return nil
	})
	<-ctx.Done()
	cons.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 6 {
		t.Fatalf("consumed %d events, want 6", len(got))
	}
	key := rs.Rules[0].Hash(netip.MustParseAddr("127.0.0.1").AppendTo(nil))
	var allowed, limiter, cache int
	for _, e := range got {
		if string(e.Rule) != "evt" || e.KeyHash != key || e.Edge != 7 || e.Limit != 3 || e.WindowMillis != 60000 {
			t.Errorf("event %+v: want rule evt, key %x, edge 7, limit 3, window 60000", e, key)
		}
		switch {
		case e.Decision == event.Allowed:
			allowed++
		case e.FromBlockCache:
			cache++
		default:
			limiter++
		}
	}
	if allowed != 3 || limiter != 1 || cache != 2 {
		t.Errorf("allowed %d, refused by the limiter %d, from the block cache %d; want 3, 1, 2", allowed, limiter, cache)
	}
}
