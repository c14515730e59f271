package shardproxy

import (
	"fmt"
	"testing"
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
