package aggregator

import (
	"crypto/rand"
	"runtime"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/segmentio/kafka-go"
)

// heapAllocated returns the live heap after a collection.
func heapAllocated() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestEmbeddedBrokerBounded floods the embedded broker's topic of decision
// events, and the topic of the counts, with 64 MiB each of messages nobody
// signed (random bytes: the aggregator skips them, as it would a
// forger's): the broker keeps what its retention bytes allow, about 2 MiB
// and 1 MiB, and the aggregator's live heap grows by a fraction of the
// flood, not by it.
func TestEmbeddedBrokerBounded(t *testing.T) {
	cfg := testConfig(t)
	cfg.GlobalTopic, cfg.GlobalInterval = "global", time.Second
	cfg.Consumer.QueueCapacity = 16 // the consumer's read-ahead, kept out of the figure
	cfg.EmbeddedRetentionBytes = 2 << 20
	cfg.EmbeddedGlobalRetentionBytes = 1 << 20
	cfg.EmbeddedRetentionCheck = 50 * time.Millisecond
	a := startAggregator(t, cfg)
	before := heapAllocated()

	const flood, size = 64 << 20, 8 << 10
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	for _, topic := range []string{topic, "global"} {
		w := &kafka.Writer{Addr: kafka.TCP(a.Brokers()...), Topic: topic, Balancer: &kafka.RoundRobin{},
			BatchTimeout: time.Millisecond, BatchSize: 128, RequiredAcks: kafka.RequireOne, Transport: tr}
		msgs := make([]kafka.Message, 256)
		for sent := 0; sent < flood; sent += len(msgs) * size {
			for i := range msgs {
				msgs[i].Value = make([]byte, size)
				msgs[i].Time = time.Now() // within the retention time: the bytes bound the topic
				_, _ = rand.Read(msgs[i].Value)
			}
			if err := w.WriteMessages(t.Context(), msgs...); err != nil {
				t.Fatal(err)
			}

		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	held := func(topic string) (n int64) {
		for _, p := range a.broker.PartitionInfos(topic) {
			n += p.NumBytes
		}
		return n
	}
	testenv.WaitFor(t, 20*time.Second, "the broker's retention applied", func() bool {
		return held(topic) <= 2<<20 && held("global") <= 1<<20
	})
	// What arrives after the flood is kept: retention drops the oldest.
	w := &kafka.Writer{Addr: kafka.TCP(a.Brokers()...), Topic: topic, Balancer: &kafka.RoundRobin{},
		BatchTimeout: time.Millisecond, BatchSize: 1, RequiredAcks: kafka.RequireOne, Transport: tr}
	defer w.Close()
	for i := range 2 * cfg.Partitions {
		if err := w.WriteMessages(t.Context(), kafka.Message{Value: []byte{byte(i)}, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * cfg.EmbeddedRetentionCheck)
	for _, p := range a.broker.PartitionInfos(topic) {
		if p.HighWatermark-p.LogStartOffset < 2 {
			t.Errorf("partition %d after the flood: offsets %d to %d kept, want the 2 messages written since", p.Partition, p.LogStartOffset, p.HighWatermark)
		}
	}
	grown := int64(heapAllocated()) - int64(before)
	t.Logf("flood of %d MiB on each topic: broker holds %d KiB of decisions and %d KiB of counts; live heap grew %d MiB",
		flood>>20, held(topic)>>10, held("global")>>10, grown>>20)
	if grown > 16<<20 {
		t.Errorf("live heap grew %d MiB after a flood of 2 × %d MiB, want at most 16 MiB (the retention bounds are 3 MiB)", grown>>20, flood>>20)
	}
}

// topicConfig returns the topic's setting name, as the broker at addrs
// describes it.
func topicConfig(t testing.TB, addrs []string, topic, name string) string {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 5 * time.Second, Transport: tr}
	resp, err := cl.DescribeConfigs(t.Context(), &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{
		{ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Resources {
		for _, c := range r.ConfigEntries {
			if c.ConfigName == name {
				return c.ConfigValue
			}
		}
	}
	return ""
}

// TestEmbeddedRetentionSettings: the embedded broker's topics get the
// retention the flags give, divided among partitions, with segments an
// eighth of it, and a restart on the same data directory with other
// bounds applies them to the topics it kept.
func TestEmbeddedRetentionSettings(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.EmbeddedDataDir = t.TempDir()
	cfg.GlobalTopic, cfg.GlobalInterval = "global", time.Second
	cfg.EmbeddedRetention, cfg.EmbeddedRetentionBytes, cfg.EmbeddedGlobalRetentionBytes = 10*time.Minute, 8<<20, 1<<20
	want := func(a *Aggregator, topic, name, value string) {
		t.Helper()
		if got := topicConfig(t, a.Brokers(), topic, name); got != value {
			t.Errorf("%s %s: got %q, want %q", topic, name, got, value)
		}
	}
	first := startAggregator(t, cfg)
	want(first, topic, "retention.bytes", "2097152") // 8 MiB over 4 partitions
	want(first, topic, "segment.bytes", "262144")
	want(first, topic, "retention.ms", "600000")
	want(first, "global", "retention.bytes", "1048576")
	stopAggregator(t, first)

	cfg.EmbeddedRetention, cfg.EmbeddedRetentionBytes = time.Hour, 4<<20
	second := startAggregator(t, cfg)
	want(second, topic, "retention.bytes", "1048576")
	want(second, topic, "segment.bytes", "131072")
	want(second, topic, "retention.ms", "3600000")
}
