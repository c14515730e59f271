// Package store is the contract between the limiter and the shared store
// its edges count in, and the store of one process.
//
// A Store performs counter operations (Op: a fixed-window counter per key
// and window start, incremented, decremented or read) and state operations
// (StateOp: one atomic read-modify-write of a token or leaky bucket's GCRA
// state, or of a sliding log, applied as package algo decides). Do and
// DoState perform every op, each failing on its own, bounded by the
// store's own timeout as well as ctx, and keep no reference to ops;
// Healthy is the store's opinion of itself; Parts and Place (Placer) name
// the part that fails on its own, Parts 0 none; Whole says whether every
// part is in. A decision the store could not inform follows the rule's
// failure policy, and says so with a Fallback.
//
// MemStore is a Store in process memory, for a single edge and for
// programs that embed the limiter; packages memcachestore and redisstore
// are Stores over memcached shards and over Redis. Clock is the time
// source every user of a Store takes (SystemClock the wall clock).
//
// It imports package algo only, for the states a StateOp applies.
package store
