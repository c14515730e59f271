package window

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Limiter. The zero value of each field means the
// default written beside it.
type Config struct {
	// FlushInterval is how often coalesced increments are sent to the store.
	// It bounds async over-admission: a key's other edges learn of this
	// edge's admissions within FlushInterval plus one store round trip.
	FlushInterval time.Duration // default 5ms
	// StoreTimeout bounds every store call: a flush, a read, and the one
	// increment of a sync decision (its wait for a call shared with other
	// sync decisions included).
	StoreTimeout time.Duration // default 100ms
	// MaxKeys bounds the keys whose local view is kept (all rules together).
	// Past it, the least recently used views are evicted; a key idle for two
	// of its windows is evicted anyway.
	MaxKeys int // default 1<<20
	// Shards is the number of independently locked parts of the key table,
	// rounded up to a power of two.
	Shards int // default 64
	// MaxFlushOps bounds the store operations of one batch of a flush, and
	// so the flush's memory whatever the number of keys queued.
	MaxFlushOps int // default 4096
	// NewKeyWait bounds how long a request waits for the shared count of a
	// key that is new to this edge (a restarted or added edge, a view
	// evicted or idle for a window). The first request of such a key is
	// decided at once from this edge's count; those that follow before the
	// first read answers wait for it (the flusher is woken to read it at
	// once), unless this edge's count alone already refuses them, so a
	// burst to a fresh edge is limited by what the other edges admitted. It
	// applies once Start runs the flusher, and not while the flusher backs
	// off from a store that fails; negative never waits.
	NewKeyWait time.Duration // default StoreTimeout
	// MaxDefer lets a key held by this edge alone (the last window's units
	// all this edge's, the replies since showing no other edge's) and far
	// from its limit keep its unsent units for up to MaxDefer, at most a
	// sixteenth of the rule's window and never past the window's end (the
	// other edges read an ended window once, after its grace), so that
	// one increment carries many requests; a key whose unsent units could
	// fill the room left (sync.go), and every key dealt over several
	// edges, is sent at the next flush. Default 0: 1s; negative: every key
	// with units is sent at the next flush.
	MaxDefer time.Duration
	// GuessPeers has a decision count the units the other edges likely
	// admitted on the key since this edge's last reply, at their recent
	// rate as the replies showed it (sync.go): fewer over-admissions when
	// a client's requests are dealt over every edge, at the price of some
	// refusals of clients within their limit and a read of the key after
	// each refusal the guess made (BENCHMARKS.md). It applies only with
	// AsyncNearLimit, whose round trips know what it guesses. Default off.
	GuessPeers bool
	// AsyncNearLimit keeps every async decision on the local view. By
	// default (false) an async counter's request is decided by one store
	// round trip, as a sync rule's, when the decision on the local view
	// admits it but leaves less room than the other edges could have
	// filled unseen since this edge's last reply (sync.go: twice what
	// their recent rate, or this edge's own unsent units at its share,
	// gives, and a sixteenth of the limit). Only keys whose replies show
	// other edges' units (or that are too new here for their share to be
	// known) pay the round trip, and only that near their limits: a key
	// held by one edge does not once its first reply says so. Should the
	// round trip fail, the decision is the local view's, by the rule's
	// failure policy; while the flusher backs off from a failing store
	// none is tried. GuessPeers applies only with AsyncNearLimit.
	AsyncNearLimit bool
	// Clock is the limiter's time source for its flusher.
	Clock store.Clock // default SystemClock
	// Registerer receives the limiter's metrics; nil registers none.
	Registerer prometheus.Registerer

	// hist holds the window-shape histograms' parameters, defaults when
	// zero (hist.go): not configuration, a hook for the package's tests.
	hist histParams
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.FlushInterval == 0 {
		c.FlushInterval = 5 * time.Millisecond
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 100 * time.Millisecond
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1 << 20
	}
	if c.Shards == 0 {
		c.Shards = 64
	}
	if c.MaxFlushOps == 0 {
		c.MaxFlushOps = 4096
	}
	if c.NewKeyWait == 0 {
		c.NewKeyWait = c.StoreTimeout
	}
	if c.MaxDefer == 0 {
		c.MaxDefer = time.Second
	}
	if c.Clock == nil {
		c.Clock = store.SystemClock
	}
}

// Validate reports every invalid field of c, with its name and value.
func (c Config) Validate() error {
	var errs []error
	if c.FlushInterval < 0 || c.FlushInterval > time.Minute {
		errs = append(errs, fmt.Errorf("window: FlushInterval %v: must be between 0 (default) and 1m", c.FlushInterval))
	}
	if c.StoreTimeout < 0 || c.StoreTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("window: StoreTimeout %v: must be between 0 (default) and 1m", c.StoreTimeout))
	}
	if c.MaxKeys < 0 || c.MaxKeys > 1<<30 {
		errs = append(errs, fmt.Errorf("window: MaxKeys %d: must be between 0 (default) and 2^30", c.MaxKeys))
	}
	if c.Shards < 0 || c.Shards > 1<<12 {
		errs = append(errs, fmt.Errorf("window: Shards %d: must be between 0 (default) and 4096", c.Shards))
	}
	if c.MaxFlushOps < 0 || c.MaxFlushOps > 1<<20 {
		errs = append(errs, fmt.Errorf("window: MaxFlushOps %d: must be between 0 (default) and 2^20", c.MaxFlushOps))
	}
	if c.MaxDefer > time.Minute {
		errs = append(errs, fmt.Errorf("window: MaxDefer %v: must be at most 1m (0: the default; negative: off)", c.MaxDefer))
	}
	if c.GuessPeers && !c.AsyncNearLimit {
		errs = append(errs, errors.New("window: GuessPeers: applies only with AsyncNearLimit (without it, a decision the others' unseen units could turn takes a round trip instead of a guess)"))
	}
	if c.NewKeyWait > time.Minute {
		errs = append(errs, fmt.Errorf("window: NewKeyWait %v: must be at most 1m (negative: never wait)", c.NewKeyWait))
	}
	return errors.Join(errs...)
}

// Answer is the Limiter's answer for one request.
type Answer struct {
	algo.Conformance
	Limit    uint64
	Fallback store.Fallback
	// Delay is how long an admitted request of a Delay rule waits before
	// it is served: its place in the key's queue.
	Delay time.Duration
	// At is when the request was decided, Unix ns, when that is later than
	// the now it was asked at: it waited for the store's reply (a key new
	// here, a bucket past its share), and was decided, and counted, at
	// the limiter clock's time after the wait, so that decisions keep the
	// order of their times. 0: at now.
	At int64
	// Mark is, for a token or leaky bucket decided in the store (sync),
	// the theoretical arrival time the admitted units left it at: what
	// GiveBackNow needs to take them back. 0 otherwise.
	Mark int64
}

// Limiter runs rules over a Store. It keeps a local view of each active key
// and, for async rules, flushes coalesced increments in the background. All
// methods are safe for concurrent use. A Limiter must be closed with Close,
// which stops the flusher after a last flush.
type Limiter struct {
	cfg    Config
	store  store.Store
	shards []shard
	mask   uint64
	grace  int64 // ns after a window starts before its previous window is read

	ops  sync.Pool // *[]Op for flushes and sync decisions
	sops sync.Pool // *[]StateOp likewise
	// sync queues the counters' sync decisions that wait for a store call,
	// one queue per part of the store (syncbatch.go); none when the store
	// does not place its keys: a call each.
	sync []combiner
	// syncMu makes the sync state decisions of one key take turns
	// (shared.go).
	syncMu [syncStripes]sync.Mutex
	// stateRTT is the recent duration of a flush batch of state ops, ns.
	stateRTT atomic.Int64

	// flushed is closed and replaced after every batch a flush applies:
	// requests waiting for a new key's first read watch it.
	flushed atomic.Pointer[chan struct{}]
	waiting atomic.Int32 // requests in awaitRead: a batch wakes them only if any
	started atomic.Bool
	closing atomic.Bool   // Close runs its last flush: every waiting unit goes
	down    atomic.Bool   // the flusher backs off: every op of its last flush failed
	split   atomic.Bool   // the store was not whole at the last flush
	splitAt atomic.Int64  // the last flush that found the store split, Unix ns; 0: none (sync.go)
	poke    chan struct{} // wakes the flusher for a waiting request, or from its park
	park    flusherPark
	timers  sync.Pool // *time.Timer for those waits
	m       *metrics
	hm      *histMetrics
	done    chan struct{}
	wg      sync.WaitGroup
	close   sync.Once

	// splitFrom is the first flush of the current or last split, and
	// splitEnded the last flush of the split before it (0: none), Unix
	// ns (splitIn).
	splitFrom, splitEnded atomic.Int64
}

// New returns a Limiter over st. Call Start to run its flusher (Flush can
// also be driven by hand, as tests do), and Close when done.
func New(cfg Config, st store.Store) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("window: New: store is nil")
	}
	cfg.setDefaults()
	n := 1
	for n < cfg.Shards {
		n <<= 1
	}
	l := &Limiter{
		cfg:    cfg,
		store:  st,
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		grace:  int64(cfg.FlushInterval + cfg.StoreTimeout),
		done:   make(chan struct{}),
		poke:   make(chan struct{}, 1),
	}
	l.park.poke = l.poke
	perShard := (cfg.MaxKeys + n - 1) / n
	hp := cfg.hist.withDefaults()
	for i := range l.shards {
		l.shards[i].init(perShard, hp, &l.park)
	}
	l.ops.New = func() any { s := make([]store.Op, 0, 64); return &s }
	l.sops.New = func() any { s := make([]store.StateOp, 0, 16); return &s }
	ch := make(chan struct{})
	l.flushed.Store(&ch)
	var err error
	if l.m, err = newMetrics(cfg.Registerer, l); err != nil {
		return nil, err
	}
	if l.hm, err = newHistMetrics(cfg.Registerer, l); err != nil {
		return nil, err
	}
	l.initCombiners()
	return l, nil
}

// Config returns the limiter's configuration, defaults filled in.
func (l *Limiter) Config() Config { return l.cfg }

func (l *Limiter) shardOf(key uint64) *shard { return &l.shards[key&l.mask] }

// Decide decides one request of cost units for the key whose hash (Rule.Hash)
// is key, under rule r with the given limit (Rules.LimitFor), at now.
//
// In async mode a decision reads the local view and never touches the
// network, except that a request of a key whose shared count or state this
// edge does not know yet (or, for a bucket, one past this edge's share of
// it) waits for the store's reply, within Config.NewKeyWait. Sync mode,
// and every sliding log, does one store round trip (two for a refused
// throttle of a counter, which takes its increment back, or a refused
// block of a state, which pours the attempt). A throttle counts the
// request only if admitted; a block counts it either way and, when
// refused, sets ReleaseAt to now + r.Timeout. A decision made while the
// store fails follows r.Fail and says so in Fallback. A shadow rule is
// decided and counted like any other: not refusing is the caller's part.
func (l *Limiter) Decide(ctx context.Context, now time.Time, r *Policy, key, limit, cost uint64) Answer {
	t := now.UnixNano()
	counter := r.Algorithm.IsCounter()
	if r.Mode == policy.Sync || r.Algorithm == policy.SlidingLog {
		var d Answer
		var failed bool
		if counter {
			d, failed = l.counterSync(ctx, t, r, key, limit, cost)
		} else {
			d, failed = l.stateSync(ctx, t, r, key, limit, cost)
		}
		if failed {
			l.m.storeErrors.Inc()
			return l.fellBack(t, r, d)
		}
		return d
	}
	if r.Fail == policy.FailClosed && !l.store.Healthy() {
		l.m.fallbackClosed.Inc()
		return l.closed(t, r, limit)
	}
	up := !l.down.Load()
	w := waits{may: l.cfg.NewKeyWait > 0 && l.started.Load() && up, near: !l.cfg.AsyncNearLimit && counter && up}
	s := l.shardOf(key)
	var d Answer
	for {
		var st step
		s.mu.Lock()
		if counter {
			st = s.counterStep(l, &w, t, r, key, limit, cost, &d)
		} else {
			st = s.stateStep(l, &w, t, r, key, limit, cost, &d)
		}
		s.mu.Unlock()
		if st == stepWait {
			t = l.waitForStore(ctx, &w, t, key, counter)
			continue
		}
		if st == stepSync {
			sd, failed := l.counterSync(ctx, t, r, key, limit, cost)
			if !failed {
				l.m.nearSyncs.Inc()
				return sd
			}
			// The key is marked failed: decided on the view, by the
			// rule's failure policy.
			l.m.storeErrors.Inc()
			w.near = false
			continue
		}
		if w.waited() {
			d.At = t
		}
		if st == stepFellBack {
			// Decided on a view the store could not refresh.
			return l.fellBack(t, r, d)
		}
		return d
	}
}

// closed is the decision of a fail-closed rule whose store failed.
func (l *Limiter) closed(t int64, r *Policy, limit uint64) Answer {
	w := int64(r.Window)
	// Retry after one flush and store timeout: the soonest the store's
	// health can be known again.
	return Answer{Conformance: algo.Conformance{ReleaseAt: t + l.grace, ResetAt: algo.WindowStart(t, w) + w}, Limit: limit, Fallback: store.FallbackClosed}
}

// fellBack applies r's failure policy to d, decided without the store's
// word (on a view the store could not refresh, or, in sync mode, the
// strategy's admission when the store failed): fail-closed rules refuse,
// fail-open ones keep d, marked, and both are counted.
func (l *Limiter) fellBack(t int64, r *Policy, d Answer) Answer {
	if r.Fail == policy.FailClosed {
		l.m.fallbackClosed.Inc()
		return l.closed(t, r, d.Limit)
	}
	l.m.fallbackOpen.Inc()
	d.Fallback = store.FallbackOpen
	return d
}

// Record counts cost units for key under r at now without deciding: the
// requests of a blocked key that the edge answered from its block cache.
// The units join the next flush, so a blocked client never reaches the
// store on the request path, yet its real rate stays visible.
func (l *Limiter) Record(now time.Time, r *Policy, key, cost uint64) {
	t := now.UnixNano()
	s := l.shardOf(key)
	s.mu.Lock()
	if r.Algorithm.IsCounter() {
		s.counterRecord(l, t, r, key, cost)
	} else {
		s.stateRecord(l, t, r, key, cost)
	}
	s.mu.Unlock()
}

// Keys returns the number of keys with a local view.
func (l *Limiter) Keys() int {
	n := 0
	for i := range l.shards {
		n += int(l.shards[i].n.Load())
	}
	return n
}

// sat32 saturates x to uint32.
func sat32(x uint64) uint32 {
	if x > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(x)
}
