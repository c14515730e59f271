package global

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// TableConfig configures an edge's view of the other PoPs.
type TableConfig struct {
	// Pop is this edge's PoP: its own counts in a message are skipped
	// (they are in the PoP's store already). Required.
	Pop string
	// Stale is how long without the publisher's heartbeat before the view
	// is cut off (Others reports it not fresh). Default DefaultStale.
	Stale time.Duration
	// MaxKeys bounds the keys held (about 200 bytes each); past it, a new
	// key's counts are not kept until an old one expires. Default 1<<18.
	MaxKeys int
}

// DefaultStale is TableConfig.Stale's default: twenty of the aggregator's
// default publish intervals.
const DefaultStale = 2 * time.Second

func (c TableConfig) withDefaults() TableConfig {
	if c.Stale <= 0 {
		c.Stale = DefaultStale
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1 << 18
	}
	return c
}

const tableShards = 64

// remote is one key's units counted by the other PoPs, per slot of its
// previous and current windows.
type remote struct {
	start int64 // the current window's start, Unix ns
	win   int64 // ns
	units [2 * Slots]uint32
}

type tableShard struct {
	mu sync.RWMutex
	m  map[uint64]remote
	_  [40]byte
}

// Table is an edge's view of what the other PoPs counted for the keys of
// global rules, fed by a Feed (or Apply). Others does not allocate. It is
// safe for concurrent use.
type Table struct {
	cfg    TableConfig
	shards [tableShards]tableShard
	n      atomic.Int64
	beat   atomic.Int64 // arrival of the last heartbeat, Unix ns (the edge's clock); 0: none yet
	now    func() int64
}

// NewTable returns an empty Table, cut off until the first heartbeat.
func NewTable(cfg TableConfig) *Table {
	t := &Table{cfg: cfg.withDefaults(), now: func() int64 { return time.Now().UnixNano() }}
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]remote)
	}
	return t
}

func (t *Table) shard(key uint64) *tableShard { return &t.shards[key%tableShards] }

// Fresh reports whether the publisher's heartbeat arrived within Stale of
// now (Unix ns).
func (t *Table) Fresh(now int64) bool {
	b := t.beat.Load()
	return b != 0 && now-b <= int64(t.cfg.Stale)
}

// Others returns the units the other PoPs counted for key in the sliding
// window of w ns ending at now (Unix ns), rounded up, and whether the view
// is fresh: every slot wholly in the trailing window, and the part of the
// slot it cuts that is inside it (its units taken as even within it). A
// key the publisher did not send counts 0 (its units across PoPs are below
// what matters).
func (t *Table) Others(key uint64, now, w int64) (units uint64, fresh bool) {
	fresh = t.Fresh(now)
	s := t.shard(key)
	s.mu.RLock()
	r, ok := s.m[key]
	s.mu.RUnlock()
	if !ok || r.win != w {
		return 0, fresh
	}
	sw := w / Slots
	from := now - w // the trailing window is (from, now]
	var n float64
	for i, u := range r.units {
		end := r.start - w + int64(i+1)*sw // slot i is [end-sw, end)
		switch {
		case u == 0 || end <= from:
		case end-sw >= from:
			n += float64(u)
		default:
			n += float64(u) * float64(end-from) / float64(sw)
		}
	}
	return uint64(math.Ceil(n)), fresh
}

// Apply takes one key's counts: the other PoPs' units replace what the
// table held for the key, unless they are of an older window.
func (t *Table) Apply(c *Counts) {
	var r remote
	r.win = int64(c.WindowMs) * int64(time.Millisecond)
	r.start = c.Start * int64(time.Millisecond)
	for _, p := range c.Pops {
		if p.Pop == t.cfg.Pop {
			continue
		}
		for i, u := range p.Units {
			r.units[i] = uint32(min(uint64(r.units[i])+u, math.MaxUint32))
		}
	}
	s := t.shard(c.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[c.Key]
	switch {
	case ok && old.win == r.win && old.start > r.start:
		return
	case !ok && t.n.Load() >= int64(t.cfg.MaxKeys):
		t.expire(s, t.now())
		if t.n.Load() >= int64(t.cfg.MaxKeys) {
			return
		}
	}
	if !ok {
		t.n.Add(1)
	}
	s.m[c.Key] = r
}

// Beat records a heartbeat arrived now (Unix ns), and drops from one shard
// the keys whose counts are two windows old.
func (t *Table) Beat(now int64) {
	t.beat.Store(now)
	s := &t.shards[(now/int64(time.Millisecond))%tableShards]
	s.mu.Lock()
	t.expire(s, now)
	s.mu.Unlock()
}

// expire drops s's keys whose counts no longer weigh at now. s.mu must be
// held.
func (t *Table) expire(s *tableShard, now int64) {
	for k, r := range s.m {
		if r.start+2*r.win <= now {
			delete(s.m, k)
			t.n.Add(-1)
		}
	}
}
