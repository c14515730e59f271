package shardproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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
// BatchTimeout after it was called; ops unfinished then fail with ctx's
// error or ErrTimeout. It keeps no reference to ops after it returns, and
// is safe for concurrent use.
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
	c.maybeRestore(now)
	ring := c.ring.Load()
	if ring.Live() == 0 {
		for i := range ops {
			c.settle(&ops[i], kindOf(ops[i].Delta), fmt.Errorf("shardproxy: %s: %w", kindOf(ops[i].Delta), ErrNoServers))
		}
		return
	}
	b := getBatch()
	b.plan(c, ring, ops)
	if len(b.units) == 0 {
		b.release()
		return
	}
	b.parent = ctx
	var cancel context.CancelFunc
	b.ctx, cancel = context.WithDeadline(ctx, now.Add(c.cfg.BatchTimeout))
	defer cancel()
	workers := 0
	for i := range b.queues {
		workers += min(int(b.queues[i].n), c.cfg.Parallelism)
	}

	c.closeMu.RLock()
	if c.closed {
		c.closeMu.RUnlock()
		for u := range b.units {
			b.abandon(c, ops, int32(u), ErrClosed)
		}
		b.count(c)
		b.release()
		return
	}
	c.wg.Add(workers)
	c.closeMu.RUnlock()
	b.refs.Add(int32(workers))
	for i := range b.queues {
		for range min(int(b.queues[i].n), c.cfg.Parallelism) {
			go c.work(b, &b.queues[i])
		}
	}

	got := b.got[:len(b.units)]
	for n := 0; n < len(b.units); n++ {
		select {
		case u := <-b.done:
			got[u] = true
			b.finish(ops, u)
		case <-b.ctx.Done():
			for drained := false; !drained; {
				select {
				case u := <-b.done:
					got[u] = true
					b.finish(ops, u)
				default:
					drained = true
				}
			}
			late := c.lateErr(b.parent)
			for u := range b.units {
				if !got[u] {
					b.abandon(c, ops, int32(u), late)
				}
			}
			n = len(b.units)
		}
	}
	b.count(c)
	b.release()
}

// opState is an op as the workers see it: plan copies what they need of
// the caller's op, so that no worker touches ops, and a worker writes the
// outcome here for Do to copy back.
type opState struct {
	// Input, written by plan.
	kind   opKind
	phase  int32  // writes to the same counter before this op in the call
	unit   int32  // index in batch.units; -1: settled by plan
	ttl    int32  // incr: expiry in seconds of a counter it creates
	keyAt  int32  // its memcached key is batch.keys[keyAt:keyEnd]
	keyEnd int32  //
	delta  uint64 // magnitude of Delta
	hash   uint64 // of the counter, picks the unit among its shard's

	// Output, written by the worker that runs the unit.
	value uint64
	miss  bool  // the counter was missing: created (incr) or read as 0
	done  bool  // value, miss and err are the op's outcome
	err   error // wrapped
}

// reset forgets an outcome the worker no longer trusts.
func (st *opState) reset() { st.value, st.miss, st.done, st.err = 0, false, false, nil }

// unit is the work of one connection in a batch: ops of one shard, either
// one command through gomemcache or a pipeline. All the ops on one counter
// are in one unit.
type unit struct {
	shard  int32
	lo, hi int32 // its ops are batch.order[lo:hi]: by phase, reads first in each
	reads  int32 // while planning: ops that read, then the next read's slot
	writes int32 // while planning: ops that write, then the next write's slot
	phases bool  // some op has a phase > 0
	pipe   bool
}

// queue is the units of one shard in a batch, which its own workers take
// in turn, so a hung shard holds up only its own ops.
type queue struct {
	first, n int32        // the units are batch.units[first:first+n]
	next     atomic.Int32 // index in the queue of the next one to run
	failed   atomic.Bool  // a unit failed: the shard's one failure of this batch is counted
}

// batch is the state of one Do call that its workers share. It is pooled:
// Do and each worker hold a reference, and the last to drop its reference
// puts it back, so a worker that outlives the call (while a round trip
// finishes) writes only to a batch that nobody reads any more and nobody
// reuses yet.
type batch struct {
	parent context.Context // the caller's
	ctx    context.Context // parent with the BatchTimeout deadline
	refs   atomic.Int32    // Do's and the workers'
	done   chan int32      // indexes of finished units; cap at least len(units)

	ops    []opState // aligned with Do's ops
	keys   []byte    // the ops' memcached keys, end to end
	order  []int32   // op indexes, grouped by unit
	units  []unit
	queues []queue
	got    []bool // per unit: reported on done

	// Planning scratch.
	perShard   []int32 // ops per shard, then its first unit
	shardUnits []int32 // units per shard
	seen       []seenEntry
	gen        uint32 // marks seen's entries of this call
	counts     [numKinds][numResults]int32
}

// seenEntry counts the writes to one counter in a call.
type seenEntry struct {
	key    uint64
	start  int64
	gen    uint32
	writes int32
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

// maxPooledOps caps the ops of a batch that goes back to the pool, so one
// huge call does not pin its memory.
const maxPooledOps = 8192

func getBatch() *batch {
	b := batchPool.Get().(*batch)
	b.refs.Store(1)
	return b
}

// release drops a reference; the last one puts b back in the pool.
func (b *batch) release() {
	if b.refs.Add(-1) != 0 {
		return
	}
	for len(b.done) > 0 {
		<-b.done
	}
	b.parent, b.ctx = nil, nil
	if cap(b.ops) > maxPooledOps {
		return
	}
	clear(b.ops) // drop error values
	batchPool.Put(b)
}

// key returns op i's memcached key.
func (b *batch) key(i int32) []byte { st := &b.ops[i]; return b.keys[st.keyAt:st.keyEnd] }

// grow returns s with length n, reusing its array when it has room.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// plan places every op on ring and splits them into units, one queue of
// units per shard. Ops it rejects outright (a TTL memcached cannot take)
// are settled here.
func (b *batch) plan(c *Client, ring *Ring, ops []Op) {
	n := len(ops)
	b.ops = grow(b.ops, n)
	b.keys = b.keys[:0]
	nshards := ring.Len()
	perShard := grow(b.perShard, nshards)
	b.perShard = perShard
	clear(perShard)
	b.newSeen(n)
	mask := uint64(len(b.seen) - 1)
	for i := range ops {
		op := &ops[i]
		op.Value, op.Err = 0, nil
		st := &b.ops[i]
		*st = opState{kind: kindOf(op.Delta)}
		at := len(b.keys)
		b.keys = AppendCounterKey(b.keys, op.Key, op.Start)
		st.keyAt, st.keyEnd = int32(at), int32(len(b.keys))
		sh := ring.Lookup(b.keys[at:])
		switch st.kind {
		case kindIncr:
			ttl, err := ttlSeconds(op.TTL)
			if err != nil {
				c.settle(op, kindIncr, fmt.Errorf("shardproxy: incr %s: %w", c.shards[sh].addr, err))
				st.unit = -1
				continue
			}
			st.ttl, st.delta = ttl, uint64(op.Delta)
		case kindDecr:
			st.delta = uint64(-op.Delta) // also right for math.MinInt64
		}
		// The writes to this counter so far are the op's phase.
		st.hash = counterHash(op.Key, op.Start)
		e := &b.seen[st.hash&mask]
		for j := st.hash; e.gen == b.gen && (e.key != op.Key || e.start != op.Start); {
			j++
			e = &b.seen[j&mask]
		}
		if e.gen != b.gen {
			*e = seenEntry{key: op.Key, start: op.Start, gen: b.gen}
		}
		st.phase = e.writes
		if st.kind != kindGet {
			e.writes++
		}
		st.unit = int32(sh) // the shard, until units are made
		perShard[sh]++
	}

	// Units: a shard's ops in pieces of at most maxPipelineOps, split by
	// counter so that each counter's ops stay in order on one connection.
	b.units = b.units[:0]
	b.shardUnits = grow(b.shardUnits, nshards)
	nq := 0
	for sh, cnt := range perShard {
		k := (cnt + maxPipelineOps - 1) / maxPipelineOps
		b.shardUnits[sh] = k
		if k == 0 {
			continue
		}
		nq++
		perShard[sh] = int32(len(b.units))
		for range k {
			b.units = append(b.units, unit{shard: int32(sh), pipe: k > 1})
		}
	}
	b.queues = grow(b.queues, nq)
	for q, u := 0, 0; u < len(b.units); q++ {
		first := u
		for u < len(b.units) && b.units[u].shard == b.units[first].shard {
			u++
		}
		b.queues[q].first, b.queues[q].n = int32(first), int32(u-first)
		b.queues[q].next.Store(0)
		b.queues[q].failed.Store(false)
	}
	for i := range b.ops {
		st := &b.ops[i]
		if st.unit < 0 {
			continue
		}
		sh := st.unit
		u := perShard[sh]
		if k := b.shardUnits[sh]; k > 1 {
			u += int32(st.hash % uint64(k)) // by counter
		}
		st.unit = u
		un := &b.units[u]
		if st.kind == kindGet {
			un.reads++
		} else {
			un.writes++
		}
		un.phases = un.phases || st.phase > 0
	}
	var off int32
	for u := range b.units {
		un := &b.units[u]
		un.lo = off
		off += un.reads + un.writes
		un.hi = off
		gets := (un.reads + maxKeysPerGet - 1) / maxKeysPerGet
		un.pipe = un.pipe || un.writes+gets > 1
		un.reads, un.writes = un.lo, un.lo+un.reads // now the next slot of each
	}
	b.order = grow(b.order, int(off))
	for i := range b.ops {
		st := &b.ops[i]
		if st.unit < 0 {
			continue
		}
		un := &b.units[st.unit]
		if st.kind == kindGet {
			b.order[un.reads] = int32(i)
			un.reads++
		} else {
			b.order[un.writes] = int32(i)
			un.writes++
		}
	}
	for u := range b.units {
		if un := &b.units[u]; un.phases {
			b.sortPhases(b.order[un.lo:un.hi])
		}
	}
	if cap(b.done) < len(b.units) {
		b.done = make(chan int32, max(len(b.units), 8))
	}
	b.got = grow(b.got, len(b.units))
	clear(b.got)
}

// sortPhases orders a unit's ops by phase and, within a phase, reads
// before writes, keeping the call's order otherwise.
func (b *batch) sortPhases(order []int32) {
	rank := func(i int32) int64 {
		st := &b.ops[i]
		r := int64(st.phase) * 2
		if st.kind != kindGet {
			r++
		}
		return r
	}
	slices.SortStableFunc(order, func(i, j int32) int { return cmp.Compare(rank(i), rank(j)) })
}

// newSeen readies the table of counters seen for a call of n ops: a power
// of two at least twice n, its entries of earlier calls told apart by gen.
func (b *batch) newSeen(n int) {
	size := 16
	for size < 2*n {
		size *= 2
	}
	if len(b.seen) < size {
		b.seen = make([]seenEntry, size)
		b.gen = 0
	}
	b.gen++
	if b.gen == 0 { // wrapped: entries of 2³² calls ago would look current
		clear(b.seen)
		b.gen = 1
	}
}

// counterHash mixes a counter's key and window start (splitmix64's
// finaliser).
func counterHash(key uint64, start int64) uint64 {
	h := key ^ uint64(start)*0x9e3779b97f4a7c15
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
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

// ttlSeconds converts a counter's TTL to memcached's relative expiry: whole
// seconds rounded up, at least 1, at most 30 days.
func ttlSeconds(ttl time.Duration) (int32, error) {
	if ttl > maxTTL {
		return 0, fmt.Errorf("TTL %v exceeds memcached's 30-day limit on relative expiry", ttl)
	}
	s := int32((ttl + time.Second - 1) / time.Second)
	return max(s, 1), nil
}

// work runs the units of q until none is left or b.ctx is done, reporting
// each on b.done.
func (c *Client) work(b *batch, q *queue) {
	defer c.wg.Done()
	defer b.release()
	for {
		n := q.next.Add(1) - 1
		if n >= q.n || b.ctx.Err() != nil {
			return
		}
		u := q.first + n
		c.run(b, q, u)
		b.done <- u
	}
}

// run performs one unit on its shard, with one of the shard's connection
// slots, and updates the shard's health: a failure (a connection error, a
// timeout, a reply that is not memcached's) counts once per shard per
// batch, however many ops it fails.
func (c *Client) run(b *batch, q *queue, u int32) {
	un := &b.units[u]
	if un.lo == un.hi {
		return // a split shard's unit that no counter hashed to: nothing to send
	}
	s := c.shards[un.shard]
	order := b.order[un.lo:un.hi]
	select {
	case s.slots <- struct{}{}:
	case <-b.ctx.Done():
		b.fail(order, s.addr, c.lateErr(b.parent))
		return
	}
	begin := time.Now()
	var failure error
	if un.pipe {
		if failure = c.pipeline(b, s, order); failure != nil {
			b.fail(order, s.addr, failure)
		} else if b.pending(order) {
			b.fail(order, s.addr, c.lateErr(b.parent)) // the batch ended before them
		}
	} else {
		if err := protect(s, func() error { return c.call(b, s, order) }); err != nil {
			b.fail(order, s.addr, err)
			if !answered(err) {
				failure = err
			}
		}
	}
	<-s.slots
	var kinds [numKinds]bool
	for _, i := range order {
		kinds[b.ops[i].kind] = true
	}
	took := time.Since(begin).Seconds()
	for k, ok := range kinds {
		if ok {
			c.m.latency[k].Observe(took)
		}
	}
	if failure != nil {
		if q.failed.CompareAndSwap(false, true) {
			c.failed(int(un.shard), time.Now())
		}
		return
	}
	c.succeeded(s)
}

// pipeline runs a unit's ops as pipelines on one of the shard's
// connections. It returns the connection's failure, if any, after closing
// it (and the shard's idle ones: a server that broke one has likely broken
// them all).
func (c *Client) pipeline(b *batch, s *shard, order []int32) error {
	pc, err := s.pipes.get(c.cfg.Timeout)
	if err != nil {
		return err
	}
	x := exchange{b: b, pc: pc, addr: s.addr, timeout: c.cfg.Timeout}
	if err := x.run(order); err != nil {
		pc.nc.Close()
		s.pipes.drain(false)
		return err
	}
	s.pipes.put(pc)
	return nil
}

// pending reports whether an op of order has no outcome yet.
func (b *batch) pending(order []int32) bool {
	for _, i := range order {
		if !b.ops[i].done {
			return true
		}
	}
	return false
}

// fail gives err to every op of order that has no outcome yet, wrapped
// once per kind of op.
func (b *batch) fail(order []int32, addr string, err error) {
	var wrapped [numKinds]error
	for _, i := range order {
		st := &b.ops[i]
		if st.done {
			continue
		}
		if wrapped[st.kind] == nil {
			wrapped[st.kind] = wrapErr(st.kind, addr, err)
		}
		st.value, st.miss, st.done, st.err = 0, false, true, wrapped[st.kind]
	}
}

// call sends a unit's one command through gomemcache: an incr (with its
// add, and its second incr if it lost the add race), a decr, or a
// multi-get. It returns the first error of a round trip; a missing counter
// is not an error but sets miss.
func (c *Client) call(b *batch, s *shard, order []int32) error {
	st := &b.ops[order[0]]
	switch st.kind {
	case kindIncr:
		key := string(b.key(order[0]))
		v, err := s.mc.Increment(key, st.delta)
		if err != memcache.ErrCacheMiss {
			st.value, st.done = v, err == nil
			return err
		}
		st.miss = true
		err = s.mc.Add(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, st.delta, 10), Expiration: st.ttl})
		if err != memcache.ErrNotStored {
			st.value, st.done = st.delta, err == nil
			return err
		}
		// Another client created the counter between our incr and add.
		st.miss = false
		v, err = s.mc.Increment(key, st.delta)
		st.value, st.done = v, err == nil
		return err
	case kindDecr:
		v, err := s.mc.Decrement(string(b.key(order[0])), st.delta)
		if err == memcache.ErrCacheMiss {
			st.miss, st.done = true, true
			return nil
		}
		st.value, st.done = v, err == nil
		return err
	}
	keys := make([]string, len(order))
	for j, i := range order {
		keys[j] = string(b.key(i))
	}
	items, err := s.mc.GetMulti(keys)
	if err != nil {
		return err
	}
	for j, i := range order {
		st := &b.ops[i]
		st.done = true
		it, ok := items[keys[j]]
		if !ok {
			st.miss = true
			continue
		}
		v, err := parseCounter(it.Value)
		if err != nil {
			st.err = fmt.Errorf("shardproxy: get %s: %s: %w", s.addr, keys[j], err)
			continue
		}
		st.value = v
	}
	return nil
}

// parseCounter reads a counter's value: decimal digits, which memcached may
// pad with trailing spaces after a decr shortens them in place.
func parseCounter(b []byte) (uint64, error) {
	v, ok := parseDigits(b)
	if !ok {
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

// finish copies a finished unit's outcomes into ops and counts them.
func (b *batch) finish(ops []Op, u int32) {
	un := &b.units[u]
	for _, i := range b.order[un.lo:un.hi] {
		st := &b.ops[i]
		op := &ops[i]
		op.Value, op.Err = 0, st.err
		if st.err == nil {
			op.Value = st.value
		}
		b.counts[st.kind][classify(st.err, st.miss)]++
	}
}

// abandon fails the ops of a unit that Do stops waiting for, with err.
func (b *batch) abandon(c *Client, ops []Op, u int32, err error) {
	un := &b.units[u]
	addr := c.shards[un.shard].addr
	var wrapped [numKinds]error
	for _, i := range b.order[un.lo:un.hi] {
		k := b.ops[i].kind
		if wrapped[k] == nil {
			wrapped[k] = fmt.Errorf("shardproxy: %s %s: %w", k, addr, err)
		}
		ops[i].Value, ops[i].Err = 0, wrapped[k]
		b.counts[k][classify(wrapped[k], false)]++
	}
}

// count adds the outcomes finish and abandon counted to the metrics.
func (b *batch) count(c *Client) {
	for k := range b.counts {
		for r, n := range b.counts[k] {
			if n > 0 {
				c.m.ops[k][r].Add(float64(n))
				b.counts[k][r] = 0
			}
		}
	}
}

// settle sets an op's outcome (Value 0, Err err) and counts it.
func (c *Client) settle(op *Op, kind opKind, err error) {
	op.Value, op.Err = 0, err
	c.m.ops[kind][classify(err, false)].Inc()
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
