package edge

import (
	"context"
	"sync"

	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/window"
)

// MemcacheStore adapts a shardproxy.Client to window.Store: the edge is
// where the two packages meet, so neither imports the other.
type MemcacheStore struct {
	Client  *shardproxy.Client
	ops     sync.Pool     // *[]shardproxy.Op
	metrics *stateMetrics // nil: counted unregistered (NewMemcacheStore registers them)
}

// Do performs ops on the memcached shards.
func (m *MemcacheStore) Do(ctx context.Context, ops []window.Op) {
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
		ops[i] = window.Op(sp[i])
	}
	clear(sp)
	*p = sp[:0]
	m.ops.Put(p)
}

// Parts is the number of memcached shards (window.Placer): each fails on
// its own, so sync decisions share a store call only with others of the
// same shard.
func (m *MemcacheStore) Parts() int { return m.Client.Shards() }

// Place is the shard of key's counters now (window.Placer).
func (m *MemcacheStore) Place(key uint64) int { return m.Client.Shard(key) }

// Healthy reports whether any shard is in the ring.
func (m *MemcacheStore) Healthy() bool { return m.Client.Healthy() }
