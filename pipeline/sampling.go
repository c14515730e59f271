package pipeline

import "github.com/poplimit/poplimit/internal/mix"

// mix64 spreads the bits of a key hash (internal/mix: the SplitMix64
// finalizer, a bijection), so that sampling does not follow whatever
// structure the hash that placed the key on a partition or a shard left in
// its bits.
func mix64(x uint64) uint64 { return mix.Mix64(x) }

// SampleKey reports whether the events of the key whose hash is keyHash are
// kept at the given rate, exactly as a Producer with that SampleRate decides.
// Every edge decides alike, so a sampled key's events from all edges reach
// the aggregator and the others' never do.
func SampleKey(keyHash uint64, rate float64) bool {
	if rate >= 1 {
		return true
	}
	if !(rate > 0) {
		return false
	}
	return mix64(keyHash) < uint64(rate*(1<<64))
}
