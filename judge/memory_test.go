package judge

import (
	"runtime"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// heapInUse returns the heap in use after two collections: the live heap.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestMemoryBound floods judges with the decisions of clients that choose
// their keys (a random X-API-Key): 1.2 x MaxKeys unique keys, then the
// same keys again, as 1.2 M + 1.2 M events do at the defaults, with the
// bounds scaled down 64 times. Each judge's heap stays within
// Config.MemoryBound, the bytes per key within the documented figures,
// and what did not fit is evicted and counted.
func TestMemoryBound(t *testing.T) {
	const scale = 64
	for _, tc := range []struct {
		name string
		alg  policy.Algorithm
		// the logs bind before the key table: each key logs more units
		perKey int
	}{
		{"sliding_window keys", policy.SlidingWindow, 1},
		{"sliding_log keys with many units", policy.SlidingLog, 12},
		{"token_bucket keys", policy.TokenBucket, 1},
		{"fixed_window keys", policy.FixedWindow, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxKeys = (1 << 20) / scale
			cfg.MaxLogEntries = (1 << 24) / scale
			cfg.MaxBuffered = (1 << 20) / scale
			cfg.Dedup = (1 << 18) / scale
			cfg.MaxWrongKeys = 10000 / scale
			cfg.Hold = 0
			before := heapInUse()
			j, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			keys := cfg.MaxKeys * 12 / 10
			now := time.Now().UnixNano()
			batch := make([]event.Event, 0, 256)
			var n int64
			for pass := range 2 {
				for k := range keys {
					for u := range tc.perKey {
						n++
						e := event.Event{Time: now + n*int64(time.Microsecond), KeyHash: uint64(k)*0x9E3779B97F4A7C15 + 1,
							Rule: []byte("api"), Cost: 1, Limit: 10, WindowMillis: 60_000, Algorithm: tc.alg,
							Edge: 1, Decision: event.Allowed}
						if u+pass%2 == 0 {
							e.Decision = event.Limited // some wrongly limited
						}
						batch = append(batch, e)
						if len(batch) == cap(batch) {
							j.Add(e.Time, batch...)
							batch = batch[:0]
						}
					}
				}
			}
			j.Add(now+n*int64(time.Microsecond), batch...)
			used := heapInUse() - before
			bound := cfg.MemoryBound()
			j.mu.Lock()
			held, slots, buffered, evicted := j.keys.len(), j.keys.slots, j.buf.len(), j.evicted
			j.mu.Unlock()
			t.Logf("%d events: heap %d KiB, bound %d KiB; keys %d, log slots %d, buffered %d, evicted %v",
				n, used>>10, bound>>10, held, slots, buffered, evicted)
			if used > bound {
				t.Errorf("heap in use: %d KiB, over Config.MemoryBound %d KiB", used>>10, bound>>10)
			}
			// Bytes per key: what the heap holds beyond the buffer, the
			// dedup set and the wrong keys, over the keys held.
			other := int64(cfg.MaxBuffered)*BytesPerBuffered + int64(cfg.Dedup)*BytesPerDedup + 2*int64(cfg.MaxWrongKeys)*BytesPerWrongKey
			perKey := float64(used-other) / float64(held)
			want := float64(BytesPerKey) + float64(slots)/float64(held)*BytesPerLogEntry
			t.Logf("bytes per key: %.0f, documented %.0f (%d + %.1f log slots x %d)", perKey, want, BytesPerKey, float64(slots)/float64(held), BytesPerLogEntry)
			if perKey > want {
				t.Errorf("bytes per key: %.0f, over the documented %.0f", perKey, want)
			}
			if held > cfg.MaxKeys || slots > cfg.MaxLogEntries+32 {
				t.Errorf("keys %d, log slots %d: over MaxKeys %d, MaxLogEntries %d", held, slots, cfg.MaxKeys, cfg.MaxLogEntries)
			}
			if evicted[evictMaxKeys]+evicted[evictMaxEntries] < int64(keys-held) {
				t.Errorf("evicted %v: want at least %d keys counted (1.2 x the bounds)", evicted, keys-held)
			}
			runtime.KeepAlive(j)
		})
	}
}
