package blockcache

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counterStripes is the number of cache-line-padded cells a stripedCounter
// spreads its adds over (a power of two).
const counterStripes = 16

// stripedCounter is a counter for the hot path: adds go to one of
// counterStripes padded atomics chosen by key, so cores looking up different
// keys do not contend on one cache line; reads sum the cells. The zero value
// is 0. Safe for concurrent use.
type stripedCounter struct {
	cells [counterStripes]struct {
		n atomic.Uint64
		_ [56]byte // pad to a 64-byte cache line
	}
}

func (s *stripedCounter) inc(key uint64) {
	// Fibonacci hashing: the top bits of key × 2^64/φ.
	s.cells[(key*0x9e3779b97f4a7c15)>>(64-4)].n.Add(1)
}

func (s *stripedCounter) load() uint64 {
	var sum uint64
	for i := range s.cells {
		sum += s.cells[i].n.Load()
	}
	return sum
}

// newCollectors returns c's metrics: functions of its atomics, read at scrape
// time, so counting costs the hot path nothing but the atomic add.
func (c *Cache) newCollectors() []prometheus.Collector {
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "poplimit", Subsystem: "blockcache", Name: name, Help: help,
		}, func() float64 { return float64(f()) })
	}
	gauge := func(name, help string, f func() int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "poplimit", Subsystem: "blockcache", Name: name, Help: help,
		}, func() float64 { return float64(f()) })
	}
	return []prometheus.Collector{
		counter("hits_total", "Lookups that found the key blocked and were answered from memory.", c.hits.load),
		counter("misses_total", "Lookups that found no live block and went to the limiter.", c.misses.load),
		counter("blocks_total", "Blocks whose Set ristretto accepted into its buffer.", c.blocks.Load),
		counter("sets_dropped_total", "Blocks whose Set ristretto dropped because its set buffer was full; each costs one trip through the limiter.", c.dropped.Load),
		counter("sets_rejected_total", "Accepted Sets that ristretto's admission policy then refused; each costs one trip through the limiter.", c.rejected.Load),
		counter("evictions_total", "Entries removed by the capacity policy before their release time.", c.evictions.Load),
		counter("expirations_total", "Entries removed after their release time.", c.expirations.Load),
		gauge("entries", "Blocked keys held, expired ones not yet removed included.", c.Len),
		gauge("max_entries", "The bound on blocked keys held (Config.MaxEntries).", func() int64 { return c.maxEntries }),
	}
}
