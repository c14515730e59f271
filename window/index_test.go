package window

import (
	"math/rand/v2"
	"testing"
)

// TestKeyIndexMatchesMap drives the index and a Go map with the same random
// puts, deletes and lookups, over key sets small enough that runs collide
// and wrap around the table's end, and checks every answer and the count.
func TestKeyIndexMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, keys := range []int{8, 40, 1000, 20000} {
		var x keyIndex
		ref := map[uint64]uint32{}
		pool := make([]uint64, keys)
		for i := range pool {
			switch i % 3 {
			case 0:
				pool[i] = uint64(i) // small, sequential keys
			case 1:
				pool[i] = uint64(i) << 6 // keys of one shard
			default:
				pool[i] = rng.Uint64()
			}
		}
		for step := range 200_000 {
			k := pool[rng.IntN(len(pool))]
			switch rng.IntN(3) {
			case 0:
				v := rng.Uint32() >> 1
				x.put(k, v)
				ref[k] = v
			case 1:
				x.del(k)
				delete(ref, k)
			}
			got, ok := x.get(k)
			want, wok := ref[k]
			if ok != wok || got != want {
				t.Fatalf("%d keys, step %d: get(%d) = %d, %v; want %d, %v", keys, step, k, got, ok, want, wok)
			}
			if x.n != len(ref) {
				t.Fatalf("%d keys, step %d: %d held, want %d", keys, step, x.n, len(ref))
			}
		}
		for k, want := range ref {
			if got, ok := x.get(k); !ok || got != want {
				t.Fatalf("%d keys: get(%d) = %d, %v at the end; want %d", keys, k, got, ok, want)
			}
		}
		for _, k := range pool {
			x.del(k)
		}
		if x.n != 0 {
			t.Fatalf("%d keys: %d held after deleting all", keys, x.n)
		}
		for i := range x.slots {
			if x.slots[i].ref != 0 {
				t.Fatalf("%d keys: slot %d still used after deleting all", keys, i)
			}
		}
	}
}

func BenchmarkKeyIndexGet(b *testing.B) {
	var x keyIndex
	m := map[uint64]uint32{}
	rng := rand.New(rand.NewPCG(1, 1))
	keys := make([]uint64, 4096)
	for i := range keys {
		keys[i] = rng.Uint64()
		x.put(keys[i], uint32(i))
		m[keys[i]] = uint32(i)
	}
	b.Run("index", func(b *testing.B) {
		var s uint32
		for i := 0; b.Loop(); i++ {
			v, _ := x.get(keys[i&4095])
			s += v
		}
		_ = s
	})
	b.Run("map", func(b *testing.B) {
		var s uint32
		for i := 0; b.Loop(); i++ {
			s += m[keys[i&4095]]
		}
		_ = s
	})
}
