package global

import (
	"sort"
	"sync"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// TallyConfig bounds a Tally and says which keys matter.
type TallyConfig struct {
	// MinShare is the part of a key's limit its units across PoPs, in its
	// current and previous windows, must reach for the key to be
	// published. Default DefaultMinShare (1/8).
	MinShare float64
	// MaxKeys bounds the keys counted; past it, a new key is not counted
	// until an idle one is dropped. Default 1<<20.
	MaxKeys int
}

// DefaultMinShare is TallyConfig.MinShare's default, and DefaultInterval
// the aggregator's default interval between two publications.
const (
	DefaultMinShare = 1.0 / 8
	DefaultInterval = 100 * time.Millisecond
)

func (c TallyConfig) withDefaults() TallyConfig {
	if c.MinShare <= 0 {
		c.MinShare = DefaultMinShare
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1 << 20
	}
	return c
}

// keyTally is one key's units per PoP in its current and previous windows.
type keyTally struct {
	start int64 // current window's start, Unix ns
	win   int64 // ns
	limit uint32
	pops  map[string]*[2 * Slots]uint64 // PoP → units per slot: the previous window's, then the current one's
	// total is the units of pops, all PoPs and slots, kept as they change
	// so that no interval adds them up again.
	total uint64
	hot   bool // in Tally.hot: total reached MinShare of limit
}

// Tally counts, per key of a global rule and per PoP, the units the PoP's
// edges counted against the key's limit: admitted units of a throttle or
// queue, every unit of a block (a blocked client's requests count too).
// It is safe for concurrent use.
//
// An interval's Snapshot costs what the keys that matter cost, not what
// every key does: a flood of keys, each below MinShare of its limit (the
// keys clients choose), is not visited at each interval. Keys idle for two
// windows are swept from the table a slice at a time (sweepShare of them
// an interval, every key within about a second at the default interval).
type Tally struct {
	cfg TallyConfig
	mu  sync.Mutex
	// keys holds every key counted; order lists them for the sweep, which
	// resumes at cursor; hot holds the keys whose units reach MinShare of
	// their limit, the ones Snapshot publishes.
	keys   map[uint64]*keyTally
	order  []uint64
	cursor int
	hot    map[uint64]*keyTally
	// Dropped counts events of new keys not counted because MaxKeys keys
	// were (read under mu).
	dropped int64
}

// sweepShare is the part of the keys the sweep visits at each Snapshot,
// and sweepMin the fewest.
const (
	sweepShare = 10
	sweepMin   = 1024
)

// NewTally returns an empty Tally.
func NewTally(cfg TallyConfig) *Tally {
	return &Tally{cfg: cfg.withDefaults(), keys: make(map[uint64]*keyTally), hot: make(map[uint64]*keyTally)}
}

// Add counts the events of global rules among evs; it copies what it keeps.
func (t *Tally) Add(evs ...event.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range evs {
		e := &evs[i]
		if !e.Global || e.WindowMillis == 0 || e.Decision != event.Allowed && e.Action != policy.Block {
			continue
		}
		w := int64(e.WindowMillis) * int64(time.Millisecond)
		start := windowStart(e.Time, w)
		k := t.keys[e.KeyHash]
		if k == nil {
			if len(t.keys) >= t.cfg.MaxKeys {
				t.dropped++
				continue
			}
			k = &keyTally{start: start, win: w, pops: make(map[string]*[2 * Slots]uint64, 2)}
			t.keys[e.KeyHash] = k
			t.order = append(t.order, e.KeyHash)
		}
		if k.win != w {
			// The rule's window changed (a reload): start the key over.
			k.start, k.win, k.total = start, w, 0
			clear(k.pops)
		}
		k.limit = e.Limit
		k.roll(start)
		c := k.pops[string(e.Pop)]
		if c == nil {
			c = new([2 * Slots]uint64)
			k.pops[string(e.Pop)] = c
		}
		if first := k.start - w; e.Time >= first {
			c[min((e.Time-first)/(w/Slots), 2*Slots-1)] += uint64(e.Cost)
			k.total += uint64(e.Cost)
		}
		if !k.hot && t.matters(k) {
			k.hot = true
			t.hot[e.KeyHash] = k
		}
	}
}

// matters says whether k's units reach MinShare of its limit.
func (t *Tally) matters(k *keyTally) bool {
	return float64(k.total) >= t.cfg.MinShare*float64(k.limit)
}

// roll moves k to the window starting at start, if that is later.
func (k *keyTally) roll(start int64) {
	switch {
	case start <= k.start:
		return
	case start == k.start+k.win:
		for _, c := range k.pops {
			for _, u := range c[:Slots] {
				k.total -= u
			}
			copy(c[:Slots], c[Slots:])
			clear(c[Slots:])
		}
	default:
		clear(k.pops)
		k.total = 0
	}
	k.start = start
}

// Snapshot returns the counts of the keys that matter at now (Unix ns),
// appended to dst, and drops the keys idle for two windows (a slice of the
// table at each call). Counts whose window has passed are rolled to now's
// first. PoPs are sorted by name.
func (t *Tally) Snapshot(dst []Counts, now int64) []Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now)
	for h, k := range t.hot {
		k.roll(windowStart(now, k.win))
		if !t.matters(k) {
			k.hot = false
			delete(t.hot, h)
			continue
		}
		c := Counts{Key: h, Start: k.start / int64(time.Millisecond), WindowMs: uint32(k.win / int64(time.Millisecond))}
		for pop, n := range k.pops {
			if p := (PopCount{Pop: pop, Units: *n}); p.total() > 0 {
				c.Pops = append(c.Pops, p)
			}
		}
		sort.Slice(c.Pops, func(i, j int) bool { return c.Pops[i].Pop < c.Pops[j].Pop })
		if len(c.Pops) > MaxPops {
			sort.Slice(c.Pops, func(i, j int) bool {
				return c.Pops[i].total() > c.Pops[j].total()
			})
			c.Pops = c.Pops[:MaxPops]
		}
		dst = append(dst, c)
	}
	return dst
}

// sweep rolls the next slice of the keys to now and drops those with no
// unit left in their two windows. Called with mu held.
func (t *Tally) sweep(now int64) {
	n := min(len(t.order), max(sweepMin, len(t.order)/sweepShare))
	for ; n > 0 && len(t.order) > 0; n-- {
		if t.cursor >= len(t.order) {
			t.cursor = 0
		}
		h := t.order[t.cursor]
		k := t.keys[h]
		k.roll(windowStart(now, k.win))
		if k.total > 0 {
			t.cursor++
			continue
		}
		// Drop it: the last key of the list takes its place.
		last := t.order[len(t.order)-1]
		t.order[t.cursor] = last
		t.order = t.order[:len(t.order)-1]
		delete(t.keys, h)
		if k.hot {
			delete(t.hot, h)
		}
	}
}

// Keys returns the number of keys counted and the events of new keys not
// counted for want of room.
func (t *Tally) Keys() (keys int, dropped int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys), t.dropped
}

// windowStart is the start of the window of w ns containing t, on the
// grid from the Unix epoch (as the edges' limiters place windows).
func windowStart(t, w int64) int64 {
	r := t % w
	if r < 0 {
		r += w
	}
	return t - r
}
