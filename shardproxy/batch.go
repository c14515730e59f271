package shardproxy

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/internal/mix"
)

// opState is an op as the workers see it: plan copies what they need of
// the caller's op (a counter's Op or a ValueOp), so that no worker touches
// the caller's ops, and a worker writes the outcome here for Do or
// DoValues to copy back.
type opState struct {
	// Input, written by plan or planValues.
	kind   opKind
	phase  int32  // writes to the same counter before this op in the call
	unit   int32  // index in batch.units; -1: settled by plan
	ttl    int32  // incr, add, cas: expiry in seconds of what it creates
	create bool   // incr: send an add of 0 (noreply) before it (Op.New)
	keyAt  int32  // its memcached key is batch.keys[keyAt:keyEnd]
	keyEnd int32  //
	delta  uint64 // magnitude of Delta
	hash   uint64 // of the counter or value, picks the unit among its shard's
	valAt  int32  // add, cas: the value is batch.vals[valAt:valEnd];
	valEnd int32  // gets: what it read is batch.outs[unit][valAt:valEnd]

	// cas is the token a cas op sends; for gets, the token read.
	cas uint64

	// Output, written by the worker that runs the unit.
	value uint64
	miss  bool  // the counter was missing: created (incr) or read as 0
	done  bool  // value, miss and err are the op's outcome
	err   error // wrapped
}

// reset forgets an outcome the worker no longer trusts.
func (st *opState) reset() { st.value, st.miss, st.done, st.err = 0, false, false, nil }

// setErr sets an op's outcome to err.
func (st *opState) setErr(err error) { st.value, st.miss, st.done, st.err = 0, false, true, err }

// reset forgets the outcomes of ops.
func (b *batch) reset(ops []int32) {
	for _, i := range ops {
		b.ops[i].reset()
	}
}

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
	workers  int32        // goroutines Do runs them on
	next     atomic.Int32 // index in the queue of the next one to run
	failed   atomic.Bool  // a unit failed: the shard's one failure of this batch is counted
}

// batch is the state of one Do or DoValues call that its workers share.
// It is pooled:
// Do and each worker hold a reference, and the last to drop its reference
// puts it back, so a worker that outlives the call (while a round trip
// finishes) writes only to a batch that nobody reads any more and nobody
// reuses yet.
type batch struct {
	parent context.Context // the caller's
	ctx    context.Context // parent with the BatchTimeout deadline
	refs   atomic.Int32    // Do's and the workers'
	done   chan int32      // indexes of finished units; cap at least len(units)

	ops    []opState // aligned with the caller's ops
	keys   []byte    // the ops' memcached keys, end to end
	order  []int32   // op indexes, grouped by unit
	units  []unit
	queues []queue
	got    []bool // per unit: reported on done

	// The caller's ops, one of them, while Do or DoValues runs: only Do's
	// goroutine touches them.
	out  []Op
	vout []ValueOp

	values bool     // a DoValues call: ops of values, not counters
	vals   []byte   // the values that add and cas ops store, end to end
	outs   [][]byte // per unit: the values its gets ops read, end to end

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

// maxPooledOuts caps the values read by one unit's gets that a pooled
// batch keeps the array of.
const maxPooledOuts = 64 << 10

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
	b.parent, b.ctx, b.out, b.vout = nil, nil, nil, nil
	if cap(b.ops) > maxPooledOps || cap(b.vals) > maxPooledOuts {
		return
	}
	clear(b.ops) // drop error values
	for u, out := range b.outs {
		if cap(out) > maxPooledOuts {
			b.outs[u] = nil
		}
	}
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

// start readies b for a call of n ops over nshards shards.
func (b *batch) start(n, nshards int, values bool) {
	b.ops = grow(b.ops, n)
	b.keys = b.keys[:0]
	b.vals = b.vals[:0]
	b.values = values
	b.perShard = grow(b.perShard, nshards)
	clear(b.perShard)
}

// plan places every counter op on ring and groups them into units. Ops it
// rejects outright (a TTL memcached cannot take) are settled here.
func (b *batch) plan(c *Client, ring *Ring, ops []Op) {
	n := len(ops)
	b.start(n, ring.Len(), false)
	perShard := b.perShard
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
			st.ttl, st.delta, st.create = ttl, uint64(op.Delta), op.New
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
	b.group(c)
}

// group makes the units of the ops placed on shards (st.unit is a shard,
// perShard counts each shard's ops): a shard's ops in pieces of at most
// maxPipelineOps, split by counter or value so that the ops of each stay
// in order on one connection, one queue of units per shard.
func (b *batch) group(c *Client) {
	perShard := b.perShard
	nshards := len(perShard)
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
		// gomemcache can send neither ma nor value ops: they always
		// pipeline.
		un.pipe = un.pipe || st.kind >= kindGets || st.kind == kindIncr && c.cfg.Protocol == ProtocolMeta
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
	if b.values {
		if len(b.outs) < len(b.units) {
			b.outs = append(b.outs, make([][]byte, len(b.units)-len(b.outs))...)
		}
		for u := range b.units {
			b.outs[u] = b.outs[u][:0]
		}
	}
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
// The table is the prefix of the array it needs, not all of an array a
// larger call once grew: a small call then probes a few KB that stay in
// cache, not megabytes.
func (b *batch) newSeen(n int) {
	size := 16
	for size < 2*n {
		size *= 2
	}
	if cap(b.seen) < size {
		b.seen = make([]seenEntry, size)
		b.gen = 0
	}
	// An entry past an earlier, shorter prefix carries an older gen, so it
	// reads as empty as any other.
	b.seen = b.seen[:size]
	b.gen++
	if b.gen == 0 { // wrapped: entries of 2³² calls ago would look current
		clear(b.seen[:cap(b.seen)])
		b.gen = 1
	}
}

// counterHash mixes a counter's key and window start (splitmix64's
// finaliser).
func counterHash(key uint64, start int64) uint64 {
	return mix.Mix64(key ^ uint64(start)*0x9e3779b97f4a7c15)
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
	errs := kindErrs{addr: addr, err: err}
	for _, i := range order {
		if st := &b.ops[i]; !st.done {
			st.setErr(errs.of(st.kind))
		}
	}
}

// finish copies a finished unit's outcomes into the caller's ops and
// counts them.
func (b *batch) finish(u int32) {
	b.got[u] = true
	un := &b.units[u]
	for _, i := range b.order[un.lo:un.hi] {
		st := &b.ops[i]
		if b.values {
			b.finishValue(st, &b.vout[i], b.outs[u])
		} else {
			op := &b.out[i]
			op.Value, op.Err = 0, st.err
			if st.err == nil {
				op.Value = st.value
			}
		}
		b.counts[st.kind][classify(st.err, st.miss)]++
	}
}

// abandon fails the ops of a unit that Do stops waiting for, with err
// wrapped as fail wraps it, so that an op's error and its result label
// do not depend on whether Do or the unit's worker gave up first.
func (b *batch) abandon(c *Client, u int32, err error) {
	un := &b.units[u]
	errs := kindErrs{addr: c.shards[un.shard].addr, err: err}
	for _, i := range b.order[un.lo:un.hi] {
		k := b.ops[i].kind
		err := errs.of(k)
		if b.values {
			b.vout[i].CAS, b.vout[i].Err = 0, err
		} else {
			b.out[i].Value, b.out[i].Err = 0, err
		}
		b.counts[k][classify(err, false)]++
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
