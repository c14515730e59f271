package faults

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

type globalNoEvents struct{}

func (globalNoEvents) Emit(*event.Event) bool { return true }

// TestGlobalTwoAggregatorsOneKilled runs two aggregator binaries in one
// consumer group, both publishing the counts (signed, -global-key-file)
// under their own -global-publisher, and an edge of PoP a reading them;
// PoP b's events come from a producer. Each aggregator publishes the keys
// of its partitions, and the edge hears both. Killed (SIGKILL: no
// farewell), one leaves the edge cut off, held to -global-share and
// counted, not silently stale, until the edge forgets it; by then the
// other has its partitions (the group's session timeout is shorter) and
// publishes keys from them. The survivor's
// SIGTERM says farewell: the edge stops waiting for it at once.
func TestGlobalTwoAggregatorsOneKilled(t *testing.T) {
	port := testenv.FreePort(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port),
		kfake.SeedTopics(partitions, eventsTopic), kfake.SeedTopics(1, global.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]
	keyPath := filepath.Join(t.TempDir(), "global.key")
	if err := os.WriteFile(keyPath, bytes.Repeat([]byte{'s'}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	aggs := map[string]*aggProc{}
	for _, name := range []string{"agg-1", "agg-2"} {
		aggs[name] = startAggregatorProc(t, "-brokers", broker, "-topic", eventsTopic, "-group", "two",
			"-global-interval", "100ms", "-global-key-file", keyPath, "-global-publisher", name, "-idle-flush", "1s")
	}
	// Forgotten after 15 × 1 s: longer than the group's session timeout
	// (10 s), as at the defaults (30 s).
	const stale = time.Second
	var o edge.Options
	o.Pop, o.Brokers, o.Events, o.GlobalKeyFile, o.GlobalStale = "a", []string{broker}, globalNoEvents{}, keyPath, stale
	o.BlockCache.MaxEntries = 1 << 10
	e := edgetest.New(t, "rules: [{name: g, limit: 100, window: 1m, scope: global}]", o)

	pc := pipeline.DefaultProducerConfig()
	pc.Brokers, pc.Topic = []string{broker}, eventsTopic
	prod, err := pipeline.NewProducer(pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		prod.Close(ctx)
	})
	// PoP b counts 20 of 100 for each key, over and over (the events of
	// a key go to its partition).
	emit := func(keys []uint64) {
		for _, k := range keys {
			prod.Emit(&event.Event{Time: time.Now().UnixNano(), KeyHash: k, Rule: []byte("g"), Pop: []byte("b"), Cost: 20,
				Limit: 100, Burst: 100, WindowMillis: 60_000, Edge: 9, Decision: event.Allowed, Global: true})
		}
	}
	keysFrom := func(base uint64) []uint64 {
		ks := make([]uint64, 32)
		for i := range ks {
			ks[i] = base + uint64(i)*0x9e3779b97f4a7c15
		}
		return ks
	}
	metric := func(name string) float64 { return testenv.MetricSum(t, e.Registry, name) }
	// until polls cond every 100 ms, emitting keys' events, for up to d.
	until := func(what string, d time.Duration, keys []uint64, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (publishers %v, fresh %v)", what, d, metric("poplimit_edge_global_publishers"), metric("poplimit_edge_global_feed_fresh"))
			}
			emit(keys)
			time.Sleep(100 * time.Millisecond)
		}
	}
	// inTable: every key's counts reached the edge.
	inTable := func(keys []uint64) func() bool {
		return func() bool {
			now := time.Now().UnixNano()
			for _, k := range keys {
				if n, _ := e.Global.Others(k, now, int64(time.Minute)); n == 0 {
					return false
				}
			}
			return true
		}
	}
	first := keysFrom(1)
	until("both publishers heard", 60*time.Second, first, func() bool {
		return metric("poplimit_edge_global_publishers") == 2 && metric("poplimit_edge_global_feed_fresh") == 1
	})
	until("every key's counts from PoP b", 60*time.Second, first, inTable(first))
	published := func(name string) float64 {
		return scrape(t, "http://"+aggs[name].addr+"/metrics").sum("poplimit_aggregator_global_counts_published_total")
	}
	until("both aggregators publish counts (each its partitions' keys)", 60*time.Second, first, func() bool {
		return published("agg-1") > 0 && published("agg-2") > 0
	})
	t.Logf("published counts: agg-1 %v, agg-2 %v", published("agg-1"), published("agg-2"))

	// agg-2 dies without a farewell.
	killed := time.Now()
	if err := aggs["agg-2"].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("agg-2 exited cleanly on SIGKILL")
	}
	until("cut off after agg-2 died", 10*time.Second, nil, func() bool { return metric("poplimit_edge_global_feed_fresh") == 0 })
	t.Logf("cut off %v after agg-2 died", time.Since(killed))
	if _, fresh := e.Global.Others(first[0], time.Now().UnixNano(), int64(time.Minute)); fresh {
		t.Error("a key's counts fresh while agg-2 is waited for")
	}
	second := keysFrom(1 << 50) // keys agg-1 only can publish: some on agg-2's partitions
	until("agg-2 forgotten", 60*time.Second, second, func() bool {
		return metric("poplimit_edge_global_publishers") == 1 && metric("poplimit_edge_global_feed_fresh") == 1
	})
	if d := time.Since(killed); d < global.ForgetStales*stale-200*time.Millisecond {
		t.Errorf("agg-2 forgotten %v after it died, want ≥ %v", d, global.ForgetStales*stale)
	}
	t.Logf("agg-2 forgotten %v after it died", time.Since(killed))
	// By then agg-1 has agg-2's partitions: their keys come within a
	// few publishes.
	until("agg-1 publishes the keys of agg-2's partitions", 5*time.Second, second, inTable(second))
	t.Logf("every new key published %v after agg-2 died", time.Since(killed))

	// agg-1 stops cleanly: its farewell, not ForgetStales × stale.
	stopped := time.Now()
	if err := aggs["agg-1"].stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("agg-1 on SIGTERM: %v", err)
	}
	until("agg-1's farewell", 5*time.Second, nil, func() bool { return metric("poplimit_edge_global_publishers") == 0 })
	t.Logf("agg-1 removed %v after its SIGTERM", time.Since(stopped))
	if d := time.Since(stopped); d >= global.ForgetStales*stale {
		t.Errorf("agg-1 removed %v after a clean stop: not by its farewell", d)
	}
}
