package shardproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
)

// Sentinel errors, checked with errors.Is. An op's error wraps one of them,
// or the underlying error, behind "shardproxy: <op> <addr>: ".
var (
	// ErrNoServers: every shard is ejected; ops fail at once, without a
	// network round trip, until the first one's RetryTimeout has passed.
	ErrNoServers = errors.New("no live servers")

	// ErrTimeout: a shard did not answer within Timeout, or the op did not
	// finish within BatchTimeout.
	ErrTimeout = errors.New("timeout")

	// ErrMalformed: a shard answered something that is not memcached's
	// protocol.
	ErrMalformed = errors.New("malformed reply")

	// ErrClosed: Do was called after Close.
	ErrClosed = errors.New("client closed")
)

// Op is one operation on a fixed-window counter. Its fields are exactly
// those of window.Op, in the same order, so the two types convert to each
// other (shardproxy.Op(o)) and the edge adapts Client to window.Store with a
// loop; the packages do not import each other.
type Op struct {
	Key   uint64        // hash of rule and client key
	Start int64         // window start, Unix milliseconds
	Delta int64         // > 0 increments, < 0 decrements (clamped at 0), 0 reads
	TTL   time.Duration // lifetime of a counter that this op creates

	Value uint64 // set by Do: the counter after the op (0 when missing on a read)
	Err   error  // set by Do: nil, or why this op failed
}

// Client is a memcached counter store sharded over a ketama ring that
// agrees with nutcracker's. It is safe for concurrent use.
//
// Each shard has its own gomemcache client over a one-address selector, so a
// failure is charged to the shard that served the call even when the ring
// changes meanwhile, and each shard's connection pool has its own lock.
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
	mc    *memcache.Client
	slots chan struct{} // one token per round trip in flight; cap MaxConnsPerShard

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
	cfg = cfg.withDefaults()
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
		c.shards[i] = &shard{addr: s.Addr, mc: mc, slots: make(chan struct{}, cfg.MaxConnsPerShard)}
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

// task is one unit of work for a worker: one write op, or one multi-get of
// up to maxKeysPerGet reads on one shard. The worker writes only the result
// fields and reports the task on the call's done channel; Do reads them only
// after receiving it. ops never reaches a worker.
type task struct {
	kind  opKind
	shard int

	// Input.
	op    int      // write: index in ops
	key   string   // write: memcached key
	delta uint64   // write: magnitude of Delta
	ttl   int32    // incr: expiry in seconds of a counter it creates
	reads []int    // read: indexes in ops (read by Do only)
	keys  []string // read: memcached keys, aligned with reads

	// Results.
	value  uint64
	miss   bool
	err    error    // the whole task's error, wrapped
	values []uint64 // read: aligned with keys
	misses []bool   // read: aligned with keys
	errs   []error  // read: per key, nil when none failed
}

// Do performs every op and sets each op's Value or Err (see Op). Ops in one
// call run concurrently and in no particular order; reads of one shard share
// one multi-get. Do returns when every op has finished, when ctx is done, or
// at the latest BatchTimeout after it was called; ops unfinished then fail
// with ctx's error or ErrTimeout. It keeps no reference to ops after it
// returns, and is safe for concurrent use.
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
	c.maybeRestore(now)
	ring := c.ring.Load()
	if ring.Live() == 0 {
		for i := range ops {
			c.settle(&ops[i], kindOf(ops[i].Delta), false, fmt.Errorf("shardproxy: %s: %w", kindOf(ops[i].Delta), ErrNoServers))
		}
		return
	}
	tasks := c.plan(ring, ops)
	if len(tasks) == 0 {
		return
	}

	b := &batch{parent: ctx, tasks: tasks, done: make(chan int, len(tasks))}
	var cancel context.CancelFunc
	b.ctx, cancel = context.WithDeadline(ctx, now.Add(c.cfg.BatchTimeout))
	defer cancel()
	b.queues = queuesOf(tasks, ring.Len())
	workers := 0
	for i := range b.queues {
		workers += min(len(b.queues[i].tasks), c.cfg.Parallelism)
	}

	c.closeMu.RLock()
	if c.closed {
		c.closeMu.RUnlock()
		for i := range tasks {
			c.abandon(ops, &tasks[i], ErrClosed)
		}
		return
	}
	c.wg.Add(workers)
	c.closeMu.RUnlock()
	for i := range b.queues {
		for range min(len(b.queues[i].tasks), c.cfg.Parallelism) {
			go c.work(b, &b.queues[i])
		}
	}

	got := make([]bool, len(tasks))
	for n := 0; n < len(tasks); n++ {
		select {
		case i := <-b.done:
			got[i] = true
			c.finish(ops, &tasks[i])
		case <-b.ctx.Done():
			for drained := false; !drained; {
				select {
				case i := <-b.done:
					got[i] = true
					c.finish(ops, &tasks[i])
				default:
					drained = true
				}
			}
			late := c.lateErr(b.parent)
			for i := range tasks {
				if !got[i] {
					c.abandon(ops, &tasks[i], late)
				}
			}
			return
		}
	}
}

// batch is the state of one Do call that its workers share. A worker may
// outlive the call (while a round trip finishes); it then writes only to
// tasks, which nobody reads any more, and to done, which has room for every
// task.
type batch struct {
	parent context.Context // the caller's
	ctx    context.Context // parent with the BatchTimeout deadline
	tasks  []task
	queues []queue  // the tasks of each shard that has some
	done   chan int // indexes of finished tasks; cap len(tasks)
}

// queue is the tasks of one shard in a batch. Each shard has its own
// workers, so a hung shard holds up only its own ops.
type queue struct {
	tasks []int32      // indexes in batch.tasks
	next  atomic.Int32 // index in tasks of the next one to run
}

// queuesOf groups tasks by shard, in order of first appearance.
func queuesOf(tasks []task, nshards int) []queue {
	at := make([]int32, nshards) // per shard: 1 + its queue's index, 0 for none
	var qs []queue
	for i := range tasks {
		s := tasks[i].shard
		if at[s] == 0 {
			qs = append(qs, queue{})
			at[s] = int32(len(qs))
		}
		q := &qs[at[s]-1]
		q.tasks = append(q.tasks, int32(i))
	}
	return qs
}

// kindOf returns the kind of an op with the given delta.
func kindOf(delta int64) opKind {
	switch {
	case delta > 0:
		return kindIncr
	case delta < 0:
		return kindDecr
	}
	return kindGet
}

// plan places every op on ring and returns the tasks that perform them.
// Ops it rejects outright (a TTL memcached cannot take) are settled here.
func (c *Client) plan(ring *Ring, ops []Op) []task {
	var buf [MaxCounterKeyLen]byte
	tasks := make([]task, 0, len(ops))
	var group []int32 // per shard: index in tasks of its open multi-get, or -1
	for i := range ops {
		op := &ops[i]
		op.Value, op.Err = 0, nil
		key := AppendCounterKey(buf[:0], op.Key, op.Start)
		sh := ring.Lookup(key)
		kind := kindOf(op.Delta)
		switch kind {
		case kindGet:
			if group == nil {
				group = make([]int32, ring.Len())
				for j := range group {
					group[j] = -1
				}
			}
			g := group[sh]
			if g < 0 || len(tasks[g].keys) == maxKeysPerGet {
				g = int32(len(tasks))
				group[sh] = g
				tasks = append(tasks, task{kind: kindGet, shard: sh})
			}
			tasks[g].reads = append(tasks[g].reads, i)
			tasks[g].keys = append(tasks[g].keys, string(key))
		default:
			t := task{kind: kind, shard: sh, op: i, key: string(key)}
			if kind == kindIncr {
				t.delta = uint64(op.Delta)
				ttl, err := ttlSeconds(op.TTL)
				if err != nil {
					c.settle(op, kind, false, fmt.Errorf("shardproxy: incr %s: %w", c.shards[sh].addr, err))
					continue
				}
				t.ttl = ttl
			} else {
				t.delta = uint64(-op.Delta) // also right for math.MinInt64
			}
			tasks = append(tasks, t)
		}
	}
	return tasks
}

// ttlSeconds converts a counter's TTL to memcached's relative expiry: whole
// seconds rounded up, at least 1, at most 30 days.
func ttlSeconds(ttl time.Duration) (int32, error) {
	if ttl > maxTTL {
		return 0, fmt.Errorf("TTL %v exceeds memcached's 30-day limit on relative expiry", ttl)
	}
	s := int32((ttl + time.Second - 1) / time.Second)
	return max(s, 1), nil
}

// work runs the tasks of q until none is left or b.ctx is done, reporting
// each on b.done.
func (c *Client) work(b *batch, q *queue) {
	defer c.wg.Done()
	for {
		n := int(q.next.Add(1)) - 1
		if n >= len(q.tasks) || b.ctx.Err() != nil {
			return
		}
		i := int(q.tasks[n])
		c.run(b, &b.tasks[i])
		b.done <- i
	}
}

// run performs one task on its shard, with one of the shard's connection
// slots, and updates the shard's health.
func (c *Client) run(b *batch, t *task) {
	s := c.shards[t.shard]
	select {
	case s.slots <- struct{}{}:
	case <-b.ctx.Done():
		t.err = fmt.Errorf("shardproxy: %s %s: %w", t.kind, s.addr, c.lateErr(b.parent))
		return
	}
	begin := time.Now()
	err := protect(s, func() error { return c.call(s, t) })
	<-s.slots
	c.m.latency[t.kind].Observe(time.Since(begin).Seconds())
	if err != nil {
		t.err = wrapErr(t.kind, s.addr, err)
		if !answered(err) {
			c.failed(t.shard, time.Now())
			return
		}
	}
	c.succeeded(s)
}

// call sends the task's commands. It returns the first error of a round
// trip; a missing counter is not an error but sets t.miss.
func (c *Client) call(s *shard, t *task) error {
	switch t.kind {
	case kindIncr:
		v, err := s.mc.Increment(t.key, t.delta)
		if err != memcache.ErrCacheMiss {
			t.value = v
			return err
		}
		t.miss = true
		err = s.mc.Add(&memcache.Item{Key: t.key, Value: strconv.AppendUint(nil, t.delta, 10), Expiration: t.ttl})
		if err != memcache.ErrNotStored {
			t.value = t.delta
			return err
		}
		// Another client created the counter between our incr and add.
		t.miss = false
		t.value, err = s.mc.Increment(t.key, t.delta)
		return err
	case kindDecr:
		v, err := s.mc.Decrement(t.key, t.delta)
		if err == memcache.ErrCacheMiss {
			t.miss = true
			return nil
		}
		t.value = v
		return err
	}
	items, err := s.mc.GetMulti(t.keys)
	if err != nil {
		return err
	}
	t.values = make([]uint64, len(t.keys))
	t.misses = make([]bool, len(t.keys))
	for j, k := range t.keys {
		it, ok := items[k]
		if !ok {
			t.misses[j] = true
			continue
		}
		v, err := parseCounter(it.Value)
		if err != nil {
			if t.errs == nil {
				t.errs = make([]error, len(t.keys))
			}
			t.errs[j] = fmt.Errorf("shardproxy: get %s: %s: %w", s.addr, k, err)
			continue
		}
		t.values[j] = v
	}
	return nil
}

// parseCounter reads a counter's value: decimal digits, which memcached may
// pad with trailing spaces after a decr shortens them in place.
func parseCounter(b []byte) (uint64, error) {
	v, err := strconv.ParseUint(strings.TrimRight(string(b), " "), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("value %.40q is not a counter", b)
	}
	return v, nil
}

// protect runs f, turning a panic inside gomemcache (it slices reply lines
// without checking their length) into ErrMalformed. After a panic the
// shard's idle connections are closed, since the one that panicked may have
// gone back to the pool mid-reply.
func protect(s *shard, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.mc.Close()
			err = fmt.Errorf("%w: gomemcache panicked on it: %v", ErrMalformed, r)
		}
	}()
	return f()
}

// answered reports whether err is the shard's own answer (a miss, a lost
// add race, a CLIENT_ERROR, a value that is not a number) rather than a
// failure to get one. Only failures count toward ejection.
func answered(err error) bool {
	switch {
	case errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored):
		return true
	case strings.HasPrefix(err.Error(), "memcache: client error: "):
		// gomemcache has no sentinel for CLIENT_ERROR replies.
		return true
	}
	return false
}

// isTimeout reports whether err is a dial, read or write timeout.
func isTimeout(err error) bool {
	var ne net.Error
	var cte *memcache.ConnectTimeoutError
	return errors.As(err, &cte) || (errors.As(err, &ne) && ne.Timeout())
}

// wrapErr wraps an error of a call to addr once, marking timeouts with
// ErrTimeout and replies gomemcache could not parse with ErrMalformed.
func wrapErr(kind opKind, addr string, err error) error {
	switch {
	case isTimeout(err):
		return fmt.Errorf("shardproxy: %s %s: %w: %w", kind, addr, ErrTimeout, err)
	case errors.Is(err, ErrMalformed):
		return fmt.Errorf("shardproxy: %s %s: %w", kind, addr, err)
	case malformed(err):
		return fmt.Errorf("shardproxy: %s %s: %w: %w", kind, addr, ErrMalformed, err)
	}
	return fmt.Errorf("shardproxy: %s %s: %w", kind, addr, err)
}

// malformed reports whether err is gomemcache's complaint about a reply.
func malformed(err error) bool {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return true // incr/decr reply that is not a number
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "memcache: unexpected") || strings.HasPrefix(msg, "memcache: corrupt")
}

// lateErr is why a task did not finish in time: the caller's context error
// when parent is done, else ErrTimeout (BatchTimeout ran out).
func (c *Client) lateErr(parent context.Context) error {
	if err := parent.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: no reply within %v", ErrTimeout, c.cfg.BatchTimeout)
}

// finish copies a finished task's results into ops and counts them.
func (c *Client) finish(ops []Op, t *task) {
	if t.kind != kindGet {
		c.settle(&ops[t.op], t.kind, t.miss, t.err)
		if t.err == nil {
			ops[t.op].Value = t.value
		}
		return
	}
	for j, i := range t.reads {
		switch {
		case t.err != nil:
			c.settle(&ops[i], kindGet, false, t.err)
		case t.errs != nil && t.errs[j] != nil:
			c.settle(&ops[i], kindGet, false, t.errs[j])
		default:
			c.settle(&ops[i], kindGet, t.misses[j], nil)
			ops[i].Value = t.values[j]
		}
	}
}

// abandon fails the ops of a task that Do stops waiting for, with err.
func (c *Client) abandon(ops []Op, t *task, err error) {
	err = fmt.Errorf("shardproxy: %s %s: %w", t.kind, c.shards[t.shard].addr, err)
	if t.kind != kindGet {
		c.settle(&ops[t.op], t.kind, false, err)
		return
	}
	for _, i := range t.reads {
		c.settle(&ops[i], kindGet, false, err)
	}
}

// settle sets an op's outcome (Value 0, Err err) and counts it.
func (c *Client) settle(op *Op, kind opKind, miss bool, err error) {
	op.Value, op.Err = 0, err
	c.m.ops[kind][classify(err, miss)].Inc()
}

// Ring returns the ring ops are placed on now: every shard but the ejected
// ones. It is immutable; a later ejection or restoration replaces it.
func (c *Client) Ring() *Ring {
	c.maybeRestore(time.Now())
	return c.ring.Load()
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
		if err := s.mc.Close(); err != nil {
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
