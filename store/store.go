package store

import (
	"context"
	"time"
)

// Op is one operation on a fixed-window counter in a Store.
//
// A counter is named by the pair (Key, Start): Key is the 64-bit hash of the
// rule and the client key (never the client key itself), Start the window's
// start in Unix milliseconds. All windows of one Key must live on one shard,
// so a store hashes Key alone when it places a counter.
type Op struct {
	Key   uint64        // hash of rule and client key
	Start int64         // window start, Unix milliseconds
	Delta int64         // > 0 increments, < 0 decrements (clamped at 0), 0 reads
	TTL   time.Duration // lifetime of a counter that this op creates
	// New hints that an increment's counter may not exist yet: this edge
	// has not seen it counted. A store may create it in the same round
	// trip as the increment; the hint never changes an op's outcome.
	New bool

	Value uint64 // set by the store: the counter after the op (0 when missing on a read)
	Err   error  // set by the store: nil, or why this op failed
}

// Store is the shared store behind a Limiter and Slots: memcached shards
// (package memcachestore), Redis (package redisstore), or MemStore in a
// single process. Every store provides all of it; its methods must be
// safe for concurrent use.
//
// Do performs every op in ops and sets each op's Value or Err. An increment
// of a missing counter creates it with the op's TTL; a read of a missing
// counter is 0 with no error. Ops fail independently (a dead shard fails only
// its own keys). Do returns when every op has finished or ctx is done;
// implementations must bound each op by their own timeout as well, so a hung
// server never holds a caller longer than that. Do must not keep ops after
// it returns.
//
// DoState is the same for the shared states of token buckets, leaky
// buckets and sliding logs (StateOp, StateStore).
//
// Healthy is the store's own opinion of whether it can answer now. A
// fail-closed rule in async mode refuses at once while it is false
// instead of deciding from a view the store may not refresh. A store
// that cannot tell says true; its failures still reach every decision
// through its ops' errors.
//
// Parts and Place say where counters live (Placer), so that sync
// decisions share store calls only with decisions of the same part.
// Parts 0 says the store does not place its keys: every sync decision
// then gets a store call of its own.
//
// Whole reports whether every part is in: false while a part is out and
// its keys are counted on another (a memcached shard ejected), where an
// edge that still reaches the part does not look. The limiter then holds
// keys that the replies show counted by this edge alone to their share
// (see Config and the package doc). A store that never moves keys says
// true.
type Store interface {
	Do(ctx context.Context, ops []Op)
	DoState(ctx context.Context, ops []StateOp)
	Healthy() bool
	Whole() bool
	Parts() int
	Place(key uint64) int
}

// Placer is the part of Store that says where its counters live, so that
// sync decisions can share store calls (see the package doc): those of
// counters in one part go together, and a call never mixes parts. A part
// is what fails on its own: a memcached shard, one Redis server, one
// process. A store of Parts 0 gets a store call per sync decision, as a
// call shared across servers that fail apart would make a hung one hold
// up the decisions of the others.
type Placer interface {
	// Parts is the number of parts, fixed for the store's life; 0: the
	// store does not place its keys.
	Parts() int
	// Place returns the part, 0 to Parts()-1, that holds key's counters
	// now (every window of a key is in one part, see Op), or -1 when none
	// does (every server is out, or the store does not place its keys).
	// It is a hint: an op placed before a server is ejected may be served
	// by another, which costs only the sharing. It must not allocate.
	Place(key uint64) int
}

// Fallback says why a decision was made by a rule's failure policy instead of
// by its counts.
type Fallback uint8

const (
	FallbackNone   Fallback = iota
	FallbackOpen            // the store failed; the rule fails open: admitted
	FallbackClosed          // the store failed; the rule fails closed: refused
)
