package shardproxy

import (
	"math/rand/v2"
	"testing"
	"time"
)

// slow is the Timeout of tests that are not about timeouts: long enough that
// a loaded machine (go test runs packages side by side) never trips it.
const slow = 2 * time.Second

// newClient returns a Client for cfg, closed in t.Cleanup.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// keyOn returns a key whose counters ring places on shard.
func keyOn(t testing.TB, ring *Ring, shard int, seed uint64) uint64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	for range 100_000 {
		k := rng.Uint64()
		if ring.Lookup(AppendCounterKey(nil, k, 0)) == shard {
			return k
		}
	}
	t.Fatalf("no key on shard %d", shard)
	return 0
}

func counterKey(key uint64, start int64) string { return string(AppendCounterKey(nil, key, start)) }
