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
}

// Tally counts, per key of a global rule and per PoP, the units the PoP's
// edges counted against the key's limit: admitted units of a throttle or
// queue, every unit of a block (a blocked client's requests count too).
// It is safe for concurrent use.
type Tally struct {
	cfg  TallyConfig
	mu   sync.Mutex
	keys map[uint64]*keyTally
	// Dropped counts events of new keys not counted because MaxKeys keys
	// were (read under mu).
	dropped int64
}

// NewTally returns an empty Tally.
func NewTally(cfg TallyConfig) *Tally {
	return &Tally{cfg: cfg.withDefaults(), keys: make(map[uint64]*keyTally)}
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
		}
		if k.win != w {
			// The rule's window changed (a reload): start the key over.
			k.start, k.win = start, w
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
		}
	}
}

// roll moves k to the window starting at start, if that is later.
func (k *keyTally) roll(start int64) {
	switch {
	case start <= k.start:
		return
	case start == k.start+k.win:
		for _, c := range k.pops {
			copy(c[:Slots], c[Slots:])
			clear(c[Slots:])
		}
	default:
		clear(k.pops)
	}
	k.start = start
}

// Snapshot returns the counts of the keys that matter at now (Unix ns),
// appended to dst, and drops the keys idle for two windows. Counts whose
// window has passed are rolled to now's first. PoPs are sorted by name.
func (t *Tally) Snapshot(dst []Counts, now int64) []Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	for h, k := range t.keys {
		k.roll(windowStart(now, k.win))
		var total uint64
		for _, c := range k.pops {
			for _, u := range c {
				total += u
			}
		}
		if total == 0 {
			delete(t.keys, h) // two windows without a counted unit
			continue
		}
		if float64(total) < t.cfg.MinShare*float64(k.limit) {
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
