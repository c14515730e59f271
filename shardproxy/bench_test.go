package shardproxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchKeys returns n counter keys of random-looking key hashes.
func benchKeys(n int) [][]byte {
	keys := make([][]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range keys {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		keys[i] = AppendCounterKey(nil, x, 1_700_000_000_000)
	}
	return keys
}

func BenchmarkRingLookup(b *testing.B) {
	keys := benchKeys(1024)
	for _, h := range []Hash{HashFNV1a64, HashMurmur, HashMD5} {
		for _, n := range []int{4, 16, 64} {
			b.Run(fmt.Sprintf("%s/servers=%d", h, n), func(b *testing.B) {
				r := mustRing(b, testServers(n), h, "{}")
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r.Lookup(keys[i&1023])
					i++
				}
			})
		}
	}
}

func BenchmarkPickServer(b *testing.B) {
	r := mustRing(b, testServers(16), HashFNV1a64, "{}")
	key := string(benchKeys(1)[0])
	b.ReportAllocs()
	for b.Loop() {
		r.PickServer(key)
	}
}

func BenchmarkAppendCounterKey(b *testing.B) {
	var buf [MaxCounterKeyLen]byte
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		AppendCounterKey(buf[:0], uint64(i)*0x9e3779b97f4a7c15, 1_700_000_000_000)
	}
}

// BenchmarkNewRing is the cost of an ejection or a restoration: one ring
// rebuild, 40 MD5 digests per server.
func BenchmarkNewRing(b *testing.B) {
	servers := testServers(16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewRing(servers, HashFNV1a64, "{}"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClientIncr(b *testing.B) {
	ps := startShards(b, 2)
	c := newClient(b, Config{Servers: serversOf(ps)})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := rand.Uint64()
		for pb.Next() {
			if _, err := c.Incr(context.Background(), k, 0, 1, time.Minute); err != nil {
				b.Error(err)
				return
			}
			k++
		}
	})
}

func BenchmarkClientDoBatch(b *testing.B) {
	ps := startShards(b, 4)
	c := newClient(b, Config{Servers: serversOf(ps)})
	ops := make([]Op, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range ops {
			ops[j] = Op{Key: uint64(j), Start: int64(i % 4), Delta: int64(j % 2), TTL: time.Minute}
		}
		c.Do(context.Background(), ops)
		if ops[0].Err != nil {
			b.Fatal(ops[0].Err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/op-in-batch")
}

// BenchmarkClientDoBatch256 is a flush as the edge sends it: 256 ops over 3
// shards, mostly increments of keys that exist, some decrements and reads.
func BenchmarkClientDoBatch256(b *testing.B) {
	ps := startShards(b, 3)
	c := newClient(b, Config{Servers: serversOf(ps)})
	ops := make([]Op, 256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range ops {
			delta := int64(1 + j%3)
			switch j % 16 {
			case 5:
				delta = -1
			case 11, 13:
				delta = 0
			}
			ops[j] = Op{Key: uint64(j) * 0x9e3779b97f4a7c15, Start: int64(i % 4), Delta: delta, TTL: time.Minute}
		}
		c.Do(context.Background(), ops)
		if ops[0].Err != nil {
			b.Fatal(ops[0].Err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/op-in-batch")
}
