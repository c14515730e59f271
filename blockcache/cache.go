package blockcache

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/internal/mix"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxEntries is Config.MaxEntries when it is 0: 100,000 blocked keys,
// about 18 MB when full (measured: 4.5 MB of ristretto's counters and
// buffers, 130 bytes per entry).
const DefaultMaxEntries = 100_000

// maxMaxEntries bounds Config.MaxEntries (2^30 keys, already some 250 GB):
// ristretto is given 10 × MaxEntries counters, which must not overflow.
const maxMaxEntries = 1 << 30

// bufferItems is ristretto's per-stripe access buffer, in keys; 64 is its
// documented value for "rare use cases do otherwise".
const bufferItems = 64

// filterBits sizes the release filter: 2^14 slots of 8 bytes (128 KiB). A
// slot holds the latest release time of any key Block has mapped to it, so
// a lookup whose slot has passed can answer "not blocked" without touching
// ristretto. With b keys blocked at once, a key that is not blocked finds
// its slot busy with probability about b / 2^14 (6 % at 1,000); once the
// slots are all busy (far more blocked keys than slots) every lookup goes
// to ristretto as it would without the filter.
const filterBits = 14

// Config configures a Cache. The zero value is ready to use: every field
// states its default.
type Config struct {
	// MaxEntries bounds the number of blocked keys held at once (ristretto's
	// MaxCost, at cost 1 per entry, with 10 × MaxEntries frequency
	// counters). When the cache is full a new key may displace a less
	// frequently looked-up one or be refused (see the package doc). Memory
	// when full is roughly 180 to 260 bytes per entry, counters included
	// (18 MB for 100,000; 260 MB for 1,000,000). 0 means DefaultMaxEntries
	// (100,000); at most 2^30.
	MaxEntries int64
}

// Validate reports every problem with c, each naming the field and its bad
// value, or nil when there is none.
func (c Config) Validate() error {
	var errs []error
	if c.MaxEntries < 0 {
		errs = append(errs, fmt.Errorf("blockcache: Config.MaxEntries %d: must be ≥ 0 (0 means %d)", c.MaxEntries, DefaultMaxEntries))
	}
	if c.MaxEntries > maxMaxEntries {
		errs = append(errs, fmt.Errorf("blockcache: Config.MaxEntries %d: must be ≤ %d", c.MaxEntries, maxMaxEntries))
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of a Cache's counters, the same numbers as its
// metrics. The counters are cumulative since New.
type Stats struct {
	Hits         uint64 // Blocked found the key blocked
	Misses       uint64 // Blocked did not
	Blocks       uint64 // Block calls whose Set was accepted into ristretto's buffer
	SetsDropped  uint64 // Block calls whose Set was dropped (buffer full)
	SetsRejected uint64 // accepted Sets then refused by the admission policy
	Evictions    uint64 // entries removed by the capacity policy before their release
	Expirations  uint64 // entries removed after their release (TTL or capacity)
	Entries      int64  // entries held now (expired ones not yet removed included)
	MaxEntries   int64  // the bound
}

// Cache is a bounded set of blocked keys with their release times. Create one
// with New; the zero value is not usable.
//
// Every method is safe for concurrent use, except Close (see Close).
type Cache struct {
	rc         *ristretto.Cache[uint64, int64]
	maxEntries int64

	// filter[slot(key)] ≥ the release time of every entry of a key mapped
	// there: Block raises it before its Set, so an entry ristretto holds is
	// never behind its slot, and a slot at or before now means every key
	// mapped to it is released. Slots only rise (Clear zeroes them), and a
	// key Unblock removed only costs its slot's keys a ristretto lookup
	// until the slot passes.
	filter [1 << filterBits]atomic.Int64

	hits, misses stripedCounter // the hot path's counters
	blocks       atomic.Uint64
	dropped      atomic.Uint64
	rejected     atomic.Uint64
	evictions    atomic.Uint64
	expirations  atomic.Uint64

	clearing atomic.Bool // set while Clear empties ristretto: its evictions are not counted
	closed   atomic.Bool

	reg        prometheus.Registerer // nil: no metrics
	collectors []prometheus.Collector

	// mu serializes Clear and Close.
	mu sync.Mutex
}

// New returns a Cache configured by cfg, its metrics registered with reg (nil
// registers none). It fails if cfg is invalid or a metric cannot be
// registered (for instance because another Cache's metrics are registered
// with reg: Close unregisters them).
func New(cfg Config, reg prometheus.Registerer) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxEntries := cfg.MaxEntries
	if maxEntries == 0 {
		maxEntries = DefaultMaxEntries
	}
	c := &Cache{maxEntries: maxEntries, reg: reg}
	rc, err := ristretto.NewCache(&ristretto.Config[uint64, int64]{
		NumCounters:        10 * maxEntries,
		MaxCost:            maxEntries,
		BufferItems:        bufferItems,
		IgnoreInternalCost: true, // cost 1 per entry, so MaxCost counts entries
		KeyToHash:          keyToHash,
		OnEvict:            c.onEvict,
		OnReject:           c.onReject,
	})
	if err != nil {
		return nil, fmt.Errorf("blockcache: %w", err)
	}
	c.rc = rc
	if reg != nil {
		c.collectors = c.newCollectors()
		for i, col := range c.collectors {
			if err := reg.Register(col); err != nil {
				for _, done := range c.collectors[:i] {
					reg.Unregister(done)
				}
				rc.Close()
				return nil, fmt.Errorf("blockcache: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// keyToHash hands ristretto the key mixed by a bijection (the SplitMix64
// finalizer), so that keys that are not well-spread hashes still spread over
// ristretto's shards and sketch; being a bijection, it cannot collide, and no
// conflict hash is needed.
func keyToHash(key uint64) (uint64, uint64) { return mix.Mix64(key), 0 }

// slot is key's release filter slot: the top bits of its mix (the low bits
// pick ristretto's shard), so that keys that are not well-spread hashes still
// spread over the slots.
func slot(key uint64) uint64 { return mix.Mix64(key) >> (64 - filterBits) }

// raise lifts key's filter slot to releaseAt if it is below.
func (c *Cache) raise(key uint64, releaseAt int64) {
	f := &c.filter[slot(key)]
	for {
		cur := f.Load()
		if cur >= releaseAt || f.CompareAndSwap(cur, releaseAt) {
			return
		}
	}
}

// Block records that key is blocked until releaseAt (Unix nanoseconds), as
// of now (Unix nanoseconds). It never
// shortens a block: if key is already blocked until releaseAt or later, it
// changes nothing and returns true (Unblock first to shorten one).
//
// It returns false when releaseAt ≤ now (nothing to block) or when ristretto
// dropped the Set because its set buffer was full. The Set is asynchronous:
// even when Block returns true, the admission policy may still refuse a new
// key when the cache is full, and a lookup racing the Set may miss. A lost
// Block never causes a wrong decision: it costs the key's next request one
// trip through the limiter, which blocks it again.
func (c *Cache) Block(key uint64, releaseAt, now int64) bool {
	if releaseAt <= now || c.closed.Load() {
		return false
	}
	if cur, ok := c.rc.Get(key); ok && cur >= releaseAt {
		return true
	}
	// Raise the slot before the Set: no entry is ever ahead of its slot.
	c.raise(key, releaseAt)
	if !c.rc.Set(key, releaseAt, 1) { // no TTL: see the package doc
		c.dropped.Add(1)
		return false
	}
	c.blocks.Add(1)
	return true
}

// Blocked reports whether key is blocked at now (Unix nanoseconds) and until
// when: ok is true and releaseAt > now when a Block for key is held with a
// release time after now. An entry whose release time is at or before now is
// a miss even if it has not been evicted yet.
//
// Blocked is the request path's lookup: it takes no lock of this package
// and allocates nothing of its own. A key whose filter slot has passed is a
// miss at the cost of one atomic load; otherwise ristretto's Get takes a
// read lock on one of its 256 shards.
func (c *Cache) Blocked(key uint64, now int64) (releaseAt int64, ok bool) {
	if c.filter[slot(key)].Load() <= now {
		c.misses.inc(key)
		return 0, false
	}
	if v, found := c.rc.Get(key); found && v > now {
		c.hits.inc(key)
		return v, true
	}
	c.misses.inc(key)
	return 0, false
}

// Unblock removes key's block, if any, at once. A Block of key still in
// ristretto's set buffer is removed too (ristretto orders the delete after
// it).
func (c *Cache) Unblock(key uint64) {
	if c.closed.Load() {
		return
	}
	c.rc.Del(key)
}

// Clear removes every block, for when the rules change and old release times
// may not hold under the new limits. A Block that races Clear may survive
// it. Clear is slow (it stops ristretto's goroutine and walks its maps) and
// is not meant for the request path; the entries it removes are not counted
// as evictions.
func (c *Cache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return
	}
	c.clearing.Store(true)
	c.rc.Clear()
	for i := range c.filter {
		c.filter[i].Store(0)
	}
	c.clearing.Store(false)
}

// Wait blocks until every Set accepted before the call has been applied, so
// that a following Blocked sees it. It is meant for tests.
func (c *Cache) Wait() {
	if c.closed.Load() {
		return
	}
	c.rc.Wait()
}

// Len returns the number of entries held, expired ones not yet removed
// included. Sets not yet applied are not counted (see Wait).
func (c *Cache) Len() int64 {
	if c.closed.Load() {
		return 0
	}
	return c.rc.MaxCost() - c.rc.RemainingCost()
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Hits:         c.hits.load(),
		Misses:       c.misses.load(),
		Blocks:       c.blocks.Load(),
		SetsDropped:  c.dropped.Load(),
		SetsRejected: c.rejected.Load(),
		Evictions:    c.evictions.Load(),
		Expirations:  c.expirations.Load(),
		Entries:      c.Len(),
		MaxEntries:   c.maxEntries,
	}
}

// Close stops ristretto's goroutines, drops every entry and unregisters the
// metrics. It must be called once every other call on c has returned (it is
// not safe to call concurrently with them: ristretto closes its channels).
// After Close, Blocked misses and Block returns false. Calling Close again
// does nothing.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return
	}
	c.clearing.Store(true)
	c.rc.Close()
	c.closed.Store(true)
	if c.reg != nil {
		for _, col := range c.collectors {
			c.reg.Unregister(col)
		}
	}
}

// onEvict is ristretto's callback for an entry leaving the cache other than
// by Unblock: by the capacity policy, or by Clear (not counted). It runs on
// ristretto's goroutine. Whether the entry had reached its release is judged
// by the wall clock.
func (c *Cache) onEvict(item *ristretto.Item[int64]) {
	if c.clearing.Load() {
		return
	}
	if item.Value > time.Now().UnixNano() {
		c.evictions.Add(1)
	} else {
		c.expirations.Add(1)
	}
}

// onReject is ristretto's callback for a Set the admission policy refused.
// (ristretto also calls it for a second Set of a key whose first Set was
// still in its buffer; the first one is kept.)
func (c *Cache) onReject(*ristretto.Item[int64]) {
	c.rejected.Add(1)
}
