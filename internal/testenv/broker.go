package testenv

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Broker starts an embedded Kafka-protocol broker (franz-go's kfake) on a
// loopback port with topics seeded at partitions, and stops it at cleanup.
// port 0 picks a free one; a fixed port lets a test restart "the same"
// broker.
func Broker(t testing.TB, port int, partitions int32, topics ...string) (*kfake.Cluster, string) {
	t.Helper()
	return BrokerWith(t, port, partitions, topics, nil)
}

// BrokerWith is Broker with more kfake options (TLS, SASL).
func BrokerWith(t testing.TB, port int, partitions int32, topics []string, more []kfake.Opt) (*kfake.Cluster, string) {
	t.Helper()
	opts := append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...)}, more...)
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()[0]
}
