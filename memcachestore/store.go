package memcachestore

import (
	"context"
	"sync"

	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
)

var _ store.Store = (*Store)(nil)

// Store is a store.Store over the memcached shards of a
// shardproxy.Client: counters (Do), states (DoState), the shards' health
// and the shard of each key (Parts, Place). The zero value with Client set
// works; New also registers its metrics. Its methods are safe for
// concurrent use.
type Store struct {
	Client  *shardproxy.Client
	ops     sync.Pool     // *[]shardproxy.Op
	metrics *stateMetrics // nil: counted unregistered (New registers them)
}

// Do performs ops on the memcached shards.
func (m *Store) Do(ctx context.Context, ops []store.Op) {
	p, _ := m.ops.Get().(*[]shardproxy.Op)
	if p == nil {
		p = new([]shardproxy.Op)
	}
	sp := (*p)[:0]
	for _, op := range ops {
		sp = append(sp, shardproxy.Op(op))
	}
	m.Client.Do(ctx, sp)
	for i := range ops {
		ops[i] = store.Op(sp[i])
	}
	clear(sp)
	*p = sp[:0]
	m.ops.Put(p)
}

// Parts is the number of memcached shards (store.Placer): each fails on
// its own, so sync decisions share a store call only with others of the
// same shard.
func (m *Store) Parts() int { return m.Client.Shards() }

// Place is the shard of key's counters now (store.Placer).
func (m *Store) Place(key uint64) int { return m.Client.Shard(key) }

// Healthy reports whether any shard is in the ring.
func (m *Store) Healthy() bool { return m.Client.Healthy() }

// Whole reports whether every shard is in the ring (store.Store): while
// one is ejected its keys are counted afresh on the others.
func (m *Store) Whole() bool {
	r := m.Client.Ring()
	return r.Live() == r.Len()
}
