package loadtest

import (
	"context"

	"github.com/poplimit/poplimit/store"
)

// simStore is the shared store of a simulated PoP, in simulated time: a
// store.MemStore whose counter increments land RTT after an edge sends
// them, in the order they were sent, as over links of constant latency.
// The reply an edge reads at once is the counter as it stands when the op
// is sent, with every op of that edge's still on its way and the op
// itself: what a real edge knows of the others' units a round trip after
// they sent them, and of its own exactly. State ops (buckets, logs) are
// applied at once. It counts the operations it is sent. It is used from
// one goroutine.
type simStore struct {
	mem   *store.MemStore
	clock *simClock
	rtt   int64 // ns
	q     []landing
	head  int
	// inflight is each edge's units on their way, by counter.
	inflight map[flightKey]int64
	byKind   StoreOpsByKind // operations sent, counters and states
}

type flightKey struct {
	edge  int
	key   uint64
	start int64
}

type landing struct {
	at   int64 // Unix ns
	edge int
	op   store.Op
}

func newSimStore(clock *simClock, rtt int64) *simStore {
	return &simStore{mem: store.NewMemStore(clock), clock: clock, rtt: rtt, inflight: map[flightKey]int64{}}
}

// land applies every increment due by now.
func (s *simStore) land(now int64) {
	for s.head < len(s.q) && s.q[s.head].at <= now {
		l := &s.q[s.head]
		ops := [1]store.Op{l.op}
		s.mem.Do(context.Background(), ops[:])
		k := flightKey{l.edge, l.op.Key, l.op.Start}
		if s.inflight[k] -= l.op.Delta; s.inflight[k] == 0 {
			delete(s.inflight, k)
		}
		*l = landing{}
		s.head++
	}
	if s.head == len(s.q) {
		s.q, s.head = s.q[:0], 0
	}
}

// edgeStore is one edge's store.Store over the shared simStore.
type edgeStore struct {
	s    *simStore
	edge int
}

func (e edgeStore) Do(ctx context.Context, ops []store.Op) {
	s := e.s
	now := s.clock.ns.Load()
	s.land(now)
	for i := range ops {
		switch d := ops[i].Delta; {
		case d > 0:
			s.byKind.Increments++
		case d < 0:
			s.byKind.Decrements++
		default:
			s.byKind.Reads++
		}
	}
	if s.rtt == 0 {
		s.mem.Do(ctx, ops)
		return
	}
	for i := range ops {
		op := &ops[i]
		read := [1]store.Op{{Key: op.Key, Start: op.Start, TTL: op.TTL}}
		s.mem.Do(ctx, read[:])
		k := flightKey{e.edge, op.Key, op.Start}
		v := int64(read[0].Value) + s.inflight[k]
		if op.Delta > 0 {
			v += op.Delta
			s.inflight[k] += op.Delta
			s.q = append(s.q, landing{at: now + s.rtt, edge: e.edge, op: *op})
		} else if op.Delta < 0 { // decrements land at once: they give units back
			dec := [1]store.Op{*op}
			s.mem.Do(ctx, dec[:])
			v = int64(dec[0].Value) + s.inflight[k]
		}
		op.Value, op.Err = uint64(max(v, 0)), nil
	}
}

func (e edgeStore) DoState(ctx context.Context, ops []store.StateOp) {
	e.s.land(e.s.clock.ns.Load())
	e.s.byKind.States += int64(len(ops))
	e.s.mem.DoState(ctx, ops)
}

func (e edgeStore) Healthy() bool        { return true }
func (e edgeStore) Whole() bool          { return true }
func (e edgeStore) Parts() int           { return 1 }
func (e edgeStore) Place(key uint64) int { return 0 }
