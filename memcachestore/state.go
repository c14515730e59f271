package memcachestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
)

var _ store.StateStore = (*Store)(nil)

// ErrContention is wrapped by the error of a store.StateOp that
// Store.DoState gave up on: its compare-and-swap lost to other
// writers of the same key StateRounds times in a row. The state is
// unchanged by the op; the caller falls back as for any store failure.
var ErrContention = errors.New("memcachestore: state: compare-and-swap lost to other writers")

// StateRounds is the most gets-then-cas rounds Store.DoState runs for one
// op, the first included: an op whose cas (or add) loses to another writer
// is read again and retried at once, with no wait, and fails with
// ErrContention after the last loss. Every lost round is a round another
// writer of the key won, and each edge sends at most one op per key at a
// time, so losing them all needs another edge to win every round of one
// op; past that, failing fast (one op's worth of fallback) is better than
// spinning. Each round is two round trips, each bounded by the client's
// BatchTimeout and ctx, and a failed or timed-out round trip ends the op,
// so a call waits out at most one BatchTimeout per shard that stops
// answering during it. docs/DESIGN.md states this number; a test holds
// the two together.
const StateRounds = 16

// errContention is the error of an op that lost every round.
var errContention = fmt.Errorf("%w (%d rounds)", ErrContention, StateRounds)

// New returns a Store over c whose DoState counts its
// outcomes in poplimit_state_ops_total{store="memcached"} and
// poplimit_state_cas_retries_total on reg (none when reg is nil). Metrics
// already registered on reg by another store are shared with it. A
// Store made without it, &Store{Client: c}, works the same
// and counts in metrics of its own that no registry gathers.
func New(c *shardproxy.Client, reg prometheus.Registerer) (*Store, error) {
	m := &Store{Client: c}
	if reg == nil {
		return m, nil
	}
	sm, err := newStateMetrics(reg)
	if err != nil {
		return nil, err
	}
	m.metrics = sm
	return m, nil
}

// DoState performs every op on its key's state in memcached by
// read-modify-write, as store.StateStore says: all ops at once, a round
// trip for the gets of all their keys, store.StateOp.Apply over what each
// read, then a round trip for the cas (or add, when there was no value) of
// every state that changed. An op whose cas or add lost to another writer
// is retried from a fresh gets, up to StateRounds rounds in all, then fails
// with ErrContention. The ops on one key in a call are applied in order
// over one gets and written by one cas, so they take effect in order and
// together. A stored value that does not decode fails its ops with
// algo.ErrBadState and is left as it is; a failed or timed-out round trip
// fails its ops with the client's error (the state is then unknown: a cas
// may have been stored). Each round trip is bounded by the client's
// Timeout and BatchTimeout and by ctx. A failed op's Allowed is false.
//
// The state of an op is the value shardproxy.AppendValueKey(StateKey(op))
// on its shard, kept for the TTL Apply gives.
func (m *Store) DoState(ctx context.Context, ops []store.StateOp) {
	if len(ops) == 0 {
		return
	}
	sm := m.stateMetrics()
	c := getStateCall(len(ops))
	defer putStateCall(c)
	c.plan(ops)
	for round := 1; len(c.pending) > 0; round++ {
		if round > StateRounds {
			c.failPending(ops, errContention)
			break
		}
		if round > 1 {
			if err := ctx.Err(); err != nil {
				c.failPending(ops, fmt.Errorf("memcachestore: state: %w", err))
				break
			}
			sm.retries.Add(float64(len(c.pending)))
		}
		c.readAndApply(ctx, m.Client, ops)
		if len(c.writes) == 0 {
			break
		}
		m.Client.DoValues(ctx, c.writes)
		c.retry = c.retry[:0]
		for j := range c.writes {
			w := &c.writes[j]
			g := c.wgroups[j]
			switch {
			case w.Err == nil:
			case errors.Is(w.Err, shardproxy.ErrCASConflict), errors.Is(w.Err, shardproxy.ErrExists), errors.Is(w.Err, shardproxy.ErrNotFound):
				c.retry = append(c.retry, g) // another writer won: read again
			default:
				c.failGroup(ops, g, w.Err)
			}
		}
		c.pending, c.retry = c.retry, c.pending
	}
	sm.count(ops)
}

// StateKey returns the key whose value (shardproxy.AppendValueKey) holds
// op's state in memcached: op.Key with op.Kind in its top two bits, as
// store.MemStore keeps them, so a key's bucket and log never read each
// other's value (a rule that changes algorithm on reload starts afresh).
func StateKey(op *store.StateOp) uint64 { return op.Key ^ uint64(op.Kind)<<62 }

// stateCall is the scratch of one DoState call, pooled.
type stateCall struct {
	groups  []stateGroup
	next    []int32          // per op: the next op of its group, -1 after the last
	index   map[uint64]int32 // state key → group, for calls of many ops
	pending []int32          // groups to run in this round
	retry   []int32          // groups to run in the next round
	gets    []shardproxy.ValueOp
	writes  []shardproxy.ValueOp
	wgroups []int32 // the group of each write
}

// stateGroup is the ops of one call on one state key, in the call's order.
type stateGroup struct {
	key         uint64 // StateKey of its ops
	first, last int32  // its first and last op; the rest follow stateCall.next
	bufs        [2][]byte
}

// linearGroups is the most ops a call groups by scanning the groups made
// so far; larger calls use a map.
const linearGroups = 16

var stateCalls = sync.Pool{New: func() any { return new(stateCall) }}

// Pooling limits: a call of more ops, or an array longer than this (a log
// of hundreds of entries), is not kept, so one large call does not pin
// its memory in the pool.
const (
	maxPooledStateOps = 4096
	maxPooledStateBuf = 4 << 10
)

func getStateCall(n int) *stateCall {
	c := stateCalls.Get().(*stateCall)
	if cap(c.next) < n {
		c.next = make([]int32, n)
	}
	c.next = c.next[:n]
	return c
}

func putStateCall(c *stateCall) {
	if len(c.next) > maxPooledStateOps {
		return
	}
	for g := range c.groups {
		for k, b := range c.groups[g].bufs {
			if cap(b) > maxPooledStateBuf {
				c.groups[g].bufs[k] = nil
			}
		}
	}
	for j := range c.gets {
		v := c.gets[j].Value
		if cap(v) > maxPooledStateBuf {
			v = nil
		}
		c.gets[j] = shardproxy.ValueOp{Value: v[:0]} // drop errors
	}
	clear(c.writes) // drop errors, and values that alias bufs
	c.writes = c.writes[:0]
	if c.index != nil {
		clear(c.index)
	}
	stateCalls.Put(c)
}

// plan groups the valid ops by state key, settles the others with their
// error, and makes every group pending.
func (c *stateCall) plan(ops []store.StateOp) {
	c.groups, c.pending, c.retry = c.groups[:0], c.pending[:0], c.retry[:0]
	useMap := len(ops) > linearGroups
	if useMap && c.index == nil {
		c.index = make(map[uint64]int32, len(ops))
	}
	for i := range ops {
		op := &ops[i]
		c.next[i] = -1
		if err := op.Validate(); err != nil {
			failState(op, err)
			continue
		}
		key := StateKey(op)
		g := int32(-1)
		if useMap {
			if j, ok := c.index[key]; ok {
				g = j
			}
		} else {
			for j := range c.groups {
				if c.groups[j].key == key {
					g = int32(j)
					break
				}
			}
		}
		if g >= 0 {
			grp := &c.groups[g]
			c.next[grp.last] = int32(i)
			grp.last = int32(i)
			continue
		}
		g = int32(len(c.groups))
		if len(c.groups) < cap(c.groups) {
			c.groups = c.groups[:g+1] // reuse its buffers
		} else {
			c.groups = append(c.groups, stateGroup{})
		}
		grp := &c.groups[g]
		grp.key, grp.first, grp.last = key, int32(i), int32(i)
		if useMap {
			c.index[key] = g
		}
		c.pending = append(c.pending, g)
	}
}

// readAndApply reads the state of every pending group in one DoValues,
// applies the group's ops to it and leaves in c.writes the cas or add of
// each group whose state changed. A group that needs no write is done.
func (c *stateCall) readAndApply(ctx context.Context, client *shardproxy.Client, ops []store.StateOp) {
	n := len(c.pending)
	if cap(c.gets) < n {
		c.gets = append(c.gets[:cap(c.gets)], make([]shardproxy.ValueOp, n-cap(c.gets))...)
	}
	c.gets = c.gets[:n]
	for j, g := range c.pending {
		c.gets[j] = shardproxy.ValueOp{Kind: shardproxy.ValueGets, Key: c.groups[g].key, Value: c.gets[j].Value[:0]}
	}
	client.DoValues(ctx, c.gets)
	c.writes, c.wgroups = c.writes[:0], c.wgroups[:0]
	for j, g := range c.pending {
		get := &c.gets[j]
		kind := shardproxy.ValueCAS
		switch {
		case get.Err == nil:
		case errors.Is(get.Err, shardproxy.ErrNotFound):
			kind = shardproxy.ValueAdd
		default:
			c.failGroup(ops, g, get.Err)
			continue
		}
		val, ttl, write := c.apply(ops, g, get.Value)
		if !write {
			continue
		}
		c.writes = append(c.writes, shardproxy.ValueOp{Kind: kind, Key: c.groups[g].key, Value: val, CAS: get.CAS, TTL: ttl})
		c.wgroups = append(c.wgroups, g)
	}
}

// apply runs the ops of group g in order over old, the state read, and
// returns the state after them, the longest TTL any of them gave, and
// whether any changed it. An op that fails (the value does not decode)
// changes nothing, so the ops after it see the same value.
func (c *stateCall) apply(ops []store.StateOp, g int32, old []byte) (cur []byte, ttl time.Duration, write bool) {
	grp := &c.groups[g]
	cur = old
	buf := 0
	for i := grp.first; i >= 0; i = c.next[i] {
		op := &ops[i]
		val, t, w, err := op.Apply(cur, grp.bufs[buf])
		if err != nil {
			failState(op, err)
			continue
		}
		op.Err = nil
		if w {
			grp.bufs[buf] = val
			cur = val
			buf ^= 1 // the next op writes into the other buffer, not over cur
			write = true
			ttl = max(ttl, t)
		}
	}
	return cur, ttl, write
}

// failGroup fails every op of group g with err.
func (c *stateCall) failGroup(ops []store.StateOp, g int32, err error) {
	for i := c.groups[g].first; i >= 0; i = c.next[i] {
		failState(&ops[i], err)
	}
}

// failPending fails every op of the pending groups with err.
func (c *stateCall) failPending(ops []store.StateOp, err error) {
	for _, g := range c.pending {
		c.failGroup(ops, g, err)
	}
	c.pending = c.pending[:0]
}

// failState sets op's outcome to err: nothing taken, nothing known.
func failState(op *store.StateOp, err error) {
	op.Allowed, op.Remaining, op.ReleaseAt, op.TAT, op.Frac, op.Err = false, 0, 0, 0, 0, err
}

// stateMetrics counts DoState's outcomes.
type stateMetrics struct {
	ok, contention, badValue, failed prometheus.Counter
	retries                          prometheus.Counter
}

// count counts the outcomes of ops.
func (sm *stateMetrics) count(ops []store.StateOp) {
	var ok, contention, bad, failed int
	for i := range ops {
		switch err := ops[i].Err; {
		case err == nil:
			ok++
		case errors.Is(err, ErrContention):
			contention++
		case errors.Is(err, algo.ErrBadState):
			bad++
		default:
			failed++
		}
	}
	for _, c := range [...]struct {
		n int
		c prometheus.Counter
	}{{ok, sm.ok}, {contention, sm.contention}, {bad, sm.badValue}, {failed, sm.failed}} {
		if c.n > 0 {
			c.c.Add(float64(c.n))
		}
	}
}

func newStateMetrics(reg prometheus.Registerer) (*stateMetrics, error) {
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "poplimit", Name: "state_ops_total",
		Help: "Shared-state ops (token and leaky buckets, sliding logs) by store and result: ok, contention (lost every compare-and-swap round), bad_value (the stored value does not decode), error (the store failed or the op was invalid)."},
		[]string{"store", "result"})
	retries := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Name: "state_cas_retries_total",
		Help: "Compare-and-swaps (or adds) of shared state in memcached lost to another writer and tried again from a fresh read."})
	if reg != nil {
		var err error
		if ops, err = registerOrShare(reg, ops); err != nil {
			return nil, err
		}
		if retries, err = registerOrShare(reg, retries); err != nil {
			return nil, err
		}
	}
	return &stateMetrics{
		ok:         ops.WithLabelValues("memcached", "ok"),
		contention: ops.WithLabelValues("memcached", "contention"),
		badValue:   ops.WithLabelValues("memcached", "bad_value"),
		failed:     ops.WithLabelValues("memcached", "error"),
		retries:    retries,
	}, nil
}

// registerOrShare registers col on reg, or returns the collector of the
// same kind already registered there under its name.
func registerOrShare[C prometheus.Collector](reg prometheus.Registerer, col C) (C, error) {
	err := reg.Register(col)
	if err == nil {
		return col, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if ex, ok := are.ExistingCollector.(C); ok {
			return ex, nil
		}
	}
	return col, fmt.Errorf("memcachestore: state metrics: %w", err)
}

// unregistered counts the state ops of stores made without New.
var unregistered, _ = newStateMetrics(nil)

// stateMetrics returns m's metrics.
func (m *Store) stateMetrics() *stateMetrics {
	if m.metrics != nil {
		return m.metrics
	}
	return unregistered
}
