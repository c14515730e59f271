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
	// Stale is how long without a publisher's heartbeat before the view
	// is cut off (Others reports it not fresh); a message stamped longer
	// ago than Stale by the edge's clock is dropped. Default DefaultStale.
	Stale time.Duration
	// MaxSkew is how far ahead of the edge's clock a message's stamp, or
	// the window of its counts, may be: further, it is dropped. Default
	// DefaultMaxSkew.
	MaxSkew time.Duration
	// Forget is how long a publisher that left without a farewell (a
	// crash, a cut) is waited for: until then the view is not fresh,
	// since that publisher's keys are no longer counted. Default
	// ForgetStales × Stale.
	Forget time.Duration
	// MaxKeys bounds the keys held (about 200 bytes each); past it, a new
	// key's counts are not kept until an old one expires, and a key not
	// held is decided as if cut off while the table is full. Default
	// DefaultMaxKeys.
	MaxKeys int
	// Now is the edge's clock, Unix ns. Default time.Now.
	Now func() int64
}

// DefaultStale is TableConfig.Stale's default: twenty of the aggregator's
// default publish intervals. DefaultMaxSkew is TableConfig.MaxSkew's.
const (
	DefaultStale   = 2 * time.Second
	DefaultMaxSkew = time.Second
)

// DefaultMaxKeys is TableConfig.MaxKeys's default: 262,144 keys, about
// 50 MiB.
const DefaultMaxKeys = 1 << 18

// ForgetStales is TableConfig.Forget's default in Stales: 30 s at the
// default Stale, more than a consumer group takes to hand a stopped
// member's partitions to the others.
const ForgetStales = 15

// maxPublishers bounds the publishers a Table tracks.
const maxPublishers = 64

func (c TableConfig) withDefaults() TableConfig {
	if c.Stale <= 0 {
		c.Stale = DefaultStale
	}
	if c.MaxSkew <= 0 {
		c.MaxSkew = DefaultMaxSkew
	}
	if c.Forget <= 0 {
		c.Forget = ForgetStales * c.Stale
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.Now == nil {
		c.Now = func() int64 { return time.Now().UnixNano() }
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

// publisher is what a Table knows of one publisher (by name).
type publisher struct {
	instance uint64
	last     int64 // the highest stamp of its messages, its clock
	heard    int64 // its last message's arrival, the edge's clock
	beat     int64 // its last heartbeat: its stamp, at most its arrival
	beats    int   // heartbeats of this instance, up to 2: with 2, a whole publish was read between them
}

// Drop is why a message of the topic changed nothing (Kept: it did not).
type Drop uint8

// Why a message is dropped: the values of the reason label of
// poplimit_edge_global_feed_dropped_total.
const (
	Kept           Drop = iota
	DropUnsigned        // no MAC, and the edge has a key
	DropBadMAC          // a MAC that the edge's key did not make
	DropMalformed       // does not decode
	DropFuture          // stamped, or its counts' window starts, beyond the edge's clock + MaxSkew
	DropStale           // stamped more than Stale ago, or counts of a window that no longer weighs
	DropReplay          // stamped before the same publisher's previous message
	DropTableFull       // counts of a new key while the table held MaxKeys
	DropPublishers      // a heartbeat of a new publisher while the table tracked 64
	numDrops
)

var dropNames = [numDrops]string{"", "unsigned", "bad_mac", "malformed", "future", "stale", "replay", "table_full", "publishers"}

func (d Drop) String() string { return dropNames[d] }

// Table is an edge's view of what the other PoPs counted for the keys of
// global rules, fed by a Feed. Others does not allocate. It is safe for
// concurrent use.
type Table struct {
	cfg    TableConfig
	shards [tableShards]tableShard
	n      atomic.Int64
	// freshUntil is when the view goes stale, the edge's clock, Unix ns:
	// the oldest heartbeat of the publishers it tracks plus Stale; 0
	// while it tracks none, or one whose whole publish it has not read.
	freshUntil atomic.Int64
	// fullAt is when a key was last refused for want of room (0: never);
	// heldFull counts the decisions held to share for it.
	fullAt   atomic.Int64
	heldFull atomic.Uint64

	pmu   sync.Mutex
	pubs  map[string]*publisher
	sweep int // the shard Sweep expires next
}

// NewTable returns an empty Table, cut off until it has read a whole
// publish.
func NewTable(cfg TableConfig) *Table {
	t := &Table{cfg: cfg.withDefaults(), pubs: make(map[string]*publisher)}
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]remote)
	}
	return t
}

func (t *Table) now() int64 { return t.cfg.Now() }

func (t *Table) shard(key uint64) *tableShard { return &t.shards[key%tableShards] }

// Fresh reports whether, at now (Unix ns), every publisher the table
// tracks beat within Stale, and the table has read a whole publish of each.
func (t *Table) Fresh(now int64) bool { return now <= t.freshUntil.Load() }

// Others returns the units the other PoPs counted for key in the sliding
// window of w ns ending at now (Unix ns), rounded up, and whether the view
// is fresh: every slot wholly in the trailing window, and the part of the
// slot it cuts that is inside it (its units taken as even within it). A
// key the publisher did not send counts 0 (its units across PoPs are below
// what matters), unless the table refused a key for want of room within
// Stale: then a key it does not hold is not fresh (it may be one refused).
func (t *Table) Others(key uint64, now, w int64) (units uint64, fresh bool) {
	fresh = t.Fresh(now)
	s := t.shard(key)
	s.mu.RLock()
	r, ok := s.m[key]
	s.mu.RUnlock()
	if !ok {
		if full := t.fullAt.Load(); fresh && full != 0 && now-full <= int64(t.cfg.Stale) {
			t.heldFull.Add(1)
			return 0, false
		}
		return 0, fresh
	}
	if r.win != w {
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

// take applies a decoded (and, with a key, verified) message arrived at
// now by the edge's clock, or says why it changed nothing.
func (t *Table) take(m *decoded, now int64) Drop {
	h := &m.h
	switch {
	case h.Stamp > now+int64(t.cfg.MaxSkew):
		return DropFuture
	case h.Stamp < now-int64(t.cfg.Stale):
		return DropStale
	}
	if m.kind == kindCounts {
		start, w := m.c.Start*int64(time.Millisecond), int64(m.c.WindowMs)*int64(time.Millisecond)
		switch {
		case start > now+int64(t.cfg.MaxSkew):
			return DropFuture
		case start+2*w <= now:
			return DropStale
		}
	}
	if d := t.hear(m, now); d != Kept {
		return d
	}
	if m.kind == kindCounts && !t.apply(&m.c, now) {
		return DropTableFull
	}
	return Kept
}

// hear records m's publisher: a heartbeat adds it, a farewell removes it.
// A message stamped before its publisher's previous one is a replay; one
// of another instance stamped after it, the publisher restarted.
func (t *Table) hear(m *decoded, now int64) Drop {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	h := &m.h
	p := t.pubs[h.Publisher]
	switch {
	case p == nil && m.kind != kindHeartbeat:
		return Kept // counts of a publisher not heard yet: its heartbeat will follow
	case p == nil:
		if len(t.pubs) >= maxPublishers {
			return DropPublishers
		}
		p = &publisher{instance: h.Instance, last: h.Stamp}
		t.pubs[h.Publisher] = p
	case p.instance == h.Instance && h.Stamp >= p.last:
	case p.instance != h.Instance && h.Stamp > p.last:
		*p = publisher{instance: h.Instance, last: h.Stamp}
	default:
		return DropReplay
	}
	p.last, p.heard = h.Stamp, now
	switch m.kind {
	case kindHeartbeat:
		p.beat, p.beats = min(h.Stamp, now), min(p.beats+1, 2)
		t.refresh(now)
	case kindFarewell:
		delete(t.pubs, h.Publisher)
		t.refresh(now)
	}
	return Kept
}

// refresh forgets the publishers not heard for Forget and sets when the
// view goes stale. t.pmu must be held.
func (t *Table) refresh(now int64) {
	until := int64(math.MaxInt64)
	for name, p := range t.pubs {
		switch {
		case now-p.heard > int64(t.cfg.Forget):
			delete(t.pubs, name)
		case p.beats < 2:
			until = 0
		default:
			until = min(until, p.beat+int64(t.cfg.Stale))
		}
	}
	if len(t.pubs) == 0 {
		until = 0
	}
	t.freshUntil.Store(until)
}

// Publishers returns how many publishers the table tracks.
func (t *Table) Publishers() int {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	return len(t.pubs)
}

// apply takes one key's counts: the other PoPs' units replace what the
// table held for the key, unless they are of an older window. It reports
// false if the key is new and the table full.
func (t *Table) apply(c *Counts, now int64) bool {
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
		return true
	case !ok && t.n.Load() >= int64(t.cfg.MaxKeys):
		t.expire(s, now)
		if t.n.Load() >= int64(t.cfg.MaxKeys) {
			t.fullAt.Store(now)
			return false
		}
	}
	if !ok {
		t.n.Add(1)
	}
	s.m[c.Key] = r
	return true
}

// Sweep expires, by the edge's clock at now, the keys of one shard whose
// counts no longer weigh (a Feed sweeps every shard in turn, whether
// messages come or not), and forgets the publishers unheard for Forget.
func (t *Table) Sweep(now int64) {
	t.pmu.Lock()
	t.refresh(now)
	i := t.sweep
	t.sweep = (t.sweep + 1) % tableShards
	t.pmu.Unlock()
	s := &t.shards[i]
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

// Keys returns the keys held and the most the table holds.
func (t *Table) Keys() (n, max int) { return int(t.n.Load()), t.cfg.MaxKeys }

// HeldFull returns how many times Others reported a key not fresh because
// the table, full, might have refused it.
func (t *Table) HeldFull() uint64 { return t.heldFull.Load() }
