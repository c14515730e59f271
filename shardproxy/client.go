package shardproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
)

// Op is one operation on a fixed-window counter. Its fields are exactly
// those of store.Op, in the same order, so the two types convert to each
// other (shardproxy.Op(o)) and the edge adapts Client to store.Store with a
// loop; the packages do not import each other.
type Op struct {
	Key   uint64        // hash of rule and client key
	Start int64         // window start, Unix milliseconds
	Delta int64         // > 0 increments, < 0 decrements (clamped at 0), 0 reads
	TTL   time.Duration // lifetime of a counter that this op creates
	// New hints that an increment's counter may not exist yet (the
	// caller has not seen it counted): with the text protocol, its
	// round trip then carries an add of 0 with the TTL and noreply before
	// the incr, so that a new counter costs one round trip, not two (incr,
	// then add). A wrong hint costs only the add memcached refuses.
	New bool

	Value uint64 // set by Do: the counter after the op (0 when missing on a read)
	Err   error  // set by Do: nil, or why this op failed
}

// Client is a memcached counter store sharded over a ketama ring that
// agrees with nutcracker's. It is safe for concurrent use.
//
// Each shard has its own gomemcache client over a one-address selector, and
// its own pool of pipeline connections, so a failure is charged to the
// shard that served the call even when the ring changes meanwhile, and each
// shard's connection pools have their own locks.
type Client struct {
	cfg    Config // defaults applied
	base   *Ring  // every server live; WithLive derives the others
	shards []*shard
	m      *metrics

	ring      atomic.Pointer[Ring] // the ring ops are placed on now
	nextRetry atomic.Int64         // Unix ns when the first ejected shard returns; 0: none out

	// mu serialises ejections and restorations, that is rebuilds of ring.
	// It is never held while taking closeMu, nor the other way round.
	mu sync.Mutex

	// closeMu protects closed; Do holds it for reading while it adds its
	// workers to wg, so Close's wg.Wait never races an Add.
	closeMu sync.RWMutex
	closed  bool
	wg      sync.WaitGroup // Do's workers, including those still finishing a call after Do returned
}

// shard is one memcached server and its health.
type shard struct {
	addr  string
	mc    *memcache.Client // single commands
	pipes pipePool         // pipelines
	slots chan struct{}    // one token per connection in use, of either kind; cap MaxConnsPerShard

	fails   atomic.Int32 // consecutive failed calls; 0 after a success
	retryAt atomic.Int64 // Unix ns when an ejected shard returns; 0 while in the ring. Written under Client.mu.
}

// New returns a Client for cfg. Metrics are registered with reg unless it is
// nil; one Registerer holds the metrics of one Client (wrap it with
// prometheus.WrapRegistererWith to register more). New does no network I/O:
// connections are dialled on first use.
func New(cfg Config, reg prometheus.Registerer) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	cfg.Servers = append([]Server(nil), cfg.Servers...)
	base, err := NewRing(cfg.Servers, cfg.Hash, "{}")
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, len(cfg.Servers))
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, base: base, m: m, shards: make([]*shard, len(cfg.Servers))}
	for i, s := range cfg.Servers {
		mc := memcache.NewFromSelector(fixedSelector{tcpAddr(s.Addr)})
		mc.Timeout = cfg.Timeout
		mc.MaxIdleConns = cfg.MaxConnsPerShard
		c.shards[i] = &shard{
			addr:  s.Addr,
			mc:    mc,
			pipes: pipePool{addr: s.Addr, maxIdle: cfg.MaxConnsPerShard},
			slots: make(chan struct{}, cfg.MaxConnsPerShard),
		}
	}
	c.ring.Store(base)
	return c, nil
}

// Incr adds delta to the counter of key for the window starting at start
// (Unix milliseconds), creating it with the given TTL if it is missing, and
// returns its value after the op. A negative delta decrements (memcached
// clamps at 0; a missing counter reads 0); a zero delta reads. It is Do with
// one op.
func (c *Client) Incr(ctx context.Context, key uint64, start, delta int64, ttl time.Duration) (uint64, error) {
	op := [1]Op{{Key: key, Start: start, Delta: delta, TTL: ttl}}
	c.Do(ctx, op[:])
	return op[0].Value, op[0].Err
}

// Get reads the counters of key for the windows starting at starts, with one
// multi-get (all windows of a key live on one shard). A missing counter reads
// 0. On error it returns the values it could read and the first error.
func (c *Client) Get(ctx context.Context, key uint64, starts ...int64) ([]uint64, error) {
	ops := make([]Op, len(starts))
	for i, s := range starts {
		ops[i] = Op{Key: key, Start: s}
	}
	c.Do(ctx, ops)
	vals := make([]uint64, len(ops))
	var err error
	for i, op := range ops {
		vals[i] = op.Value
		if err == nil {
			err = op.Err
		}
	}
	return vals, err
}

// Do performs every op and sets each op's Value or Err (see Op). Do
// returns when every op has finished, when ctx is done, or at the latest
// BatchTimeout after it was called; ops unfinished then fail with
// ErrTimeout (BatchTimeout, or ctx's deadline: the error then also wraps
// context.DeadlineExceeded) or, when ctx was cancelled, context.Canceled,
// whichever of Do and its workers sees it first (see the package doc,
// Results). It keeps no reference to ops after it returns, and is safe for
// concurrent use.
//
// Ops on one counter (one Key and Start) take effect in the order given,
// and each sees the ones before it, so each op's Value is what applying
// the ops one by one would give; ops on different counters run
// concurrently, in no particular order. A shard that has one command to
// run (an incr or decr, or one multi-get of up to 128 reads) runs it
// through gomemcache; a shard with more runs them as pipelines on its own
// connections: see the package doc. Two ops on one counter cost a round
// trip each; the edge sends at most one write per counter in a call.
//
// An increment of a missing counter creates it with its TTL in whole
// seconds, rounded up, at least 1 (a TTL over 30 days is an error: memcached
// would read it as a date). A counter of a shard that is ejected is counted
// afresh on the shard that takes its keys, and the count kept on the shard
// resumes when it comes back: see the package doc.
func (c *Client) Do(ctx context.Context, ops []Op) {
	if len(ops) == 0 {
		return
	}
	now := time.Now()
	ring := c.liveRing(now)
	if ring == nil {
		for i := range ops {
			c.settle(&ops[i], kindOf(ops[i].Delta), fmt.Errorf("shardproxy: %s: %w", kindOf(ops[i].Delta), ErrNoServers))
		}
		return
	}
	b := getBatch()
	b.plan(c, ring, ops)
	b.out = ops
	c.exec(ctx, b, now)
}

// liveRing returns the ring to place ops on at now, or nil when every
// shard is ejected.
func (c *Client) liveRing(now time.Time) *Ring {
	c.maybeRestore(now)
	if ring := c.ring.Load(); ring.Live() > 0 {
		return ring
	}
	return nil
}

// Ring returns the ring ops are placed on now: every shard but the ejected
// ones. It is immutable; a later ejection or restoration replaces it.
func (c *Client) Ring() *Ring {
	c.maybeRestore(time.Now())
	return c.ring.Load()
}

// Shards returns the number of shards, live or not: Config.Servers.
func (c *Client) Shards() int { return len(c.shards) }

// Shard returns the index in Config.Servers of the shard that holds key's
// counters now (every window of a key is on one shard: the hash tag holds
// the key alone), or -1 when every shard is ejected. It is a hint: an
// ejection or a restoration can move them before an op is sent (Do places
// every op again). It does not allocate.
func (c *Client) Shard(key uint64) int {
	var buf [48]byte
	return c.ring.Load().Lookup(AppendCounterKey(buf[:0], key, 0))
}

// Healthy reports whether at least one shard is in the ring, so that ops can
// be served; use it for readiness. Ejected shards whose RetryTimeout has
// passed are put back first.
func (c *Client) Healthy() bool {
	return c.Ring().Live() > 0
}

// Close stops the client: later ops fail with ErrClosed. It waits for the
// calls still in flight, each bounded by Timeout per round trip, then closes
// the idle connections.
func (c *Client) Close() error {
	c.closeMu.Lock()
	if c.closed {
		c.closeMu.Unlock()
		return nil
	}
	c.closed = true
	c.closeMu.Unlock()
	c.wg.Wait()
	var errs []error
	for _, s := range c.shards {
		if err := errors.Join(s.mc.Close(), s.pipes.drain(true)); err != nil {
			errs = append(errs, fmt.Errorf("shardproxy: close %s: %w", s.addr, err))
		}
	}
	return errors.Join(errs...)
}

// fixedSelector is a memcache.ServerSelector with one address: each shard
// has its own gomemcache client, and the ring is consulted before.
type fixedSelector struct{ addr net.Addr }

func (f fixedSelector) PickServer(string) (net.Addr, error) { return f.addr, nil }
func (f fixedSelector) Each(fn func(net.Addr) error) error  { return fn(f.addr) }
