package blockcache

import (
	"errors"
	"fmt"
	"runtime"
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

// frontBits sizes the front table: 2^14 slots of 32 bytes (512 KiB). A
// slot holds the latest release time of any key Block has mapped to it, so
// a lookup whose slot has passed can answer "not blocked" without touching
// ristretto, and the last key blocked there with its release, so a lookup
// of that key answers "blocked" without it too. With b keys blocked at
// once, a key that is not blocked finds its slot busy with probability
// about b / 2^14 (6 % at 1,000); once the slots are all busy (far more
// blocked keys than slots) every lookup that is not the slot's own key goes
// to ristretto as it would without the table.
const frontBits = 14

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

// WithDefaults returns c with every zero field set to its default: the one
// place they are applied (edge.Options shows them through it).
func (c Config) WithDefaults() Config {
	if c.MaxEntries == 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	return c
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

	// front[slot(key)] is the front table (frontSlot).
	front [1 << frontBits]frontSlot

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
	// life is held for reading by every call that reaches ristretto (all
	// but the front's answers) and for writing by Close, which closes
	// ristretto's channels: a call that outlives its caller's drain (a
	// request still in flight when the edge shuts down) finds the cache
	// closed instead of sending on a closed channel.
	life sync.RWMutex
}

// New returns a Cache configured by cfg, its metrics registered with reg (nil
// registers none). It fails if cfg is invalid or a metric cannot be
// registered (for instance because another Cache's metrics are registered
// with reg: Close unregisters them).
func New(cfg Config, reg prometheus.Registerer) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxEntries := cfg.WithDefaults().MaxEntries
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

// slot is key's front slot: the top bits of its mix (the low bits pick
// ristretto's shard), so that keys that are not well-spread hashes still
// spread over the slots.
func slot(key uint64) uint64 { return mix.Mix64(key) >> (64 - frontBits) }

// frontSlot is one slot of the front table.
//
// max ≥ the release time of every entry of a key mapped here: Block raises
// it before its Set, so an entry ristretto holds is never ahead of its
// slot, and max at or before now means every key mapped here is released.
// It only rises (Clear zeroes it); a key Unblock removed costs its slot's
// keys a ristretto lookup until max passes.
//
// key and rel are the last key Block recorded here and its release (rel 0:
// none), written and read under the sequence lock seq (odd while a writer
// holds it), so a reader never pairs one key with another's release. Every
// block it answers is one the limiter made and that has not yet been
// released; Unblock and Clear empty the slot.
type frontSlot struct {
	max atomic.Int64
	seq atomic.Uint32
	key atomic.Uint64
	rel atomic.Int64
}

// lock takes f's sequence lock and returns the even sequence it held. Its
// critical sections are two stores, so waiting spins.
func (f *frontSlot) lock() uint32 {
	for {
		if s := f.seq.Load(); s&1 == 0 && f.seq.CompareAndSwap(s, s+1) {
			return s
		}
		runtime.Gosched()
	}
}

// raise lifts f.max to releaseAt if it is below.
func (f *frontSlot) raise(releaseAt int64) {
	for {
		cur := f.max.Load()
		if cur >= releaseAt || f.max.CompareAndSwap(cur, releaseAt) {
			return
		}
	}
}

// record makes key, blocked until releaseAt, the slot's own key, unless it
// already is with a later release.
func (f *frontSlot) record(key uint64, releaseAt int64) {
	s := f.lock()
	if f.key.Load() != key || f.rel.Load() < releaseAt {
		f.key.Store(key)
		f.rel.Store(releaseAt)
	}
	f.seq.Store(s + 2)
}

// forget empties the slot if key is its own key (any key when all).
func (f *frontSlot) forget(key uint64, all bool) {
	s := f.lock()
	if all || f.key.Load() == key {
		f.key.Store(0)
		f.rel.Store(0)
	}
	f.seq.Store(s + 2)
}

// leave empties the slot of the key ristretto knows as h (its keyToHash)
// when ristretto lets the key go (evicted, or refused by admission), so
// that the front table holds no key ristretto does not: the cache's bound
// is ristretto's.
func (c *Cache) leave(h uint64) {
	f := &c.front[h>>(64-frontBits)] // slot(key), from mix.Mix64(key)
	if f.rel.Load() == 0 {
		return
	}
	s := f.lock()
	if f.rel.Load() != 0 && mix.Mix64(f.key.Load()) == h {
		f.key.Store(0)
		f.rel.Store(0)
	}
	f.seq.Store(s + 2)
}

// own returns the release of key if it is the slot's own key, blocked
// after now; ok is false otherwise, or when a writer holds the slot.
func (f *frontSlot) own(key uint64, now int64) (releaseAt int64, ok bool) {
	s := f.seq.Load()
	if s&1 != 0 {
		return 0, false
	}
	k, r := f.key.Load(), f.rel.Load()
	if f.seq.Load() != s || k != key || r <= now {
		return 0, false
	}
	return r, true
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
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return false
	}
	if cur, ok := c.rc.Get(key); ok && cur >= releaseAt {
		return true
	}
	// Raise the slot before the Set: no entry is ever ahead of its slot.
	// Record the key before it too, so that ristretto's refusal of the Set,
	// which comes later on its goroutine, always finds it to remove.
	f := &c.front[slot(key)]
	f.raise(releaseAt)
	f.record(key, releaseAt)
	if !c.rc.Set(key, releaseAt, 1) { // no TTL: see the package doc
		f.forget(key, false)
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
// Blocked is the request path's lookup: it allocates nothing of its own.
// A key whose front slot has passed is a miss at the cost of one atomic
// load, and the slot's own key (the last one blocked there) a hit at the
// cost of four, with no lock; any other key takes the cache's read lock
// (which only Close excludes) and ristretto's Get, which takes a read lock
// on one of its 256 shards.
func (c *Cache) Blocked(key uint64, now int64) (releaseAt int64, ok bool) {
	f := &c.front[slot(key)]
	if f.max.Load() <= now {
		c.misses.inc(key)
		return 0, false
	}
	if v, ok := f.own(key, now); ok {
		c.hits.inc(key)
		return v, true
	}
	if v, found := c.get(key); found && v > now {
		c.hits.inc(key)
		return v, true
	}
	c.misses.inc(key)
	return 0, false
}

// get is ristretto's Get under the read lock: a miss once c is closed.
func (c *Cache) get(key uint64) (v int64, ok bool) {
	c.life.RLock()
	if !c.closed.Load() {
		v, ok = c.rc.Get(key)
	}
	c.life.RUnlock()
	return v, ok
}

// Unblock removes key's block, if any, at once. A Block of key still in
// ristretto's set buffer is removed too (ristretto orders the delete after
// it).
func (c *Cache) Unblock(key uint64) {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return
	}
	c.front[slot(key)].forget(key, false)
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
	for i := range c.front {
		c.front[i].max.Store(0)
		c.front[i].forget(0, true)
	}
	c.clearing.Store(false)
}

// Wait blocks until every Set accepted before the call has been applied, so
// that a following Blocked sees it. It is meant for tests.
func (c *Cache) Wait() {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed.Load() {
		return
	}
	c.rc.Wait()
}

// Len returns the number of entries held, expired ones not yet removed
// included. Sets not yet applied are not counted (see Wait).
func (c *Cache) Len() int64 {
	c.life.RLock()
	defer c.life.RUnlock()
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
// metrics. Calls in flight finish first (those that reach ristretto hold a
// read lock that Close waits for); after Close, Blocked misses, Block
// returns false and the rest do nothing. Calling Close again does nothing.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.life.Lock()
	defer c.life.Unlock()
	if c.closed.Load() {
		return
	}
	c.clearing.Store(true)
	c.rc.Close()
	for i := range c.front {
		c.front[i].max.Store(0)
		c.front[i].forget(0, true)
	}
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
	c.leave(item.Key)
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
func (c *Cache) onReject(item *ristretto.Item[int64]) {
	c.leave(item.Key)
	c.rejected.Add(1)
}
