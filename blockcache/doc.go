// Package blockcache remembers, in memory, which keys are blocked and until
// when, so that a blocked client's requests are answered on the edge
// without touching the limiter's store: Cloudflare's "once a client exceeds
// the limit, subsequent blocks are served from server memory".
//
// A key is the 64-bit hash of a rule and a client key (the caller hashes;
// this package never sees client keys); its value is the release time, in
// Unix nanoseconds, that the limiter computed. Block records it; Blocked,
// the request path's first question, answers "blocked until releaseAt" or
// "ask the limiter". A release time at or before now is a miss, so no
// entry outlives its release by a single request. The cache holds at most
// Config.MaxEntries keys (github.com/dgraph-io/ristretto/v2, cost 1 each);
// when it is full, TinyLFU admission keeps the keys looked up most, so a
// flood of one-off keys cannot wash out the clients that keep knocking.
//
// The cache is an optimisation, never the authority. Every way it can lose
// an entry (a dropped or rejected Set, an eviction, a Clear, a lookup that
// races an asynchronous Set) costs one trip through the limiter for that
// key's next request, which decides correctly and blocks again. Nothing is
// blocked that the limiter did not block, nothing stays blocked past its
// release time, and every loss is counted. ristretto applies Sets
// asynchronously, so a Block may reach Blocked a moment later (Wait
// flushes pending Sets, for tests).
//
// All methods but Close are safe for concurrent use; Close must come after
// every other call has returned. Blocked takes no lock and allocates
// nothing of its own: it answers most lookups from a front table of 2^14
// slots with one atomic load, and the rest with one ristretto Get. It reads
// no clock: now is a parameter.
//
// With a non-nil prometheus.Registerer, New registers under
// poplimit_blockcache_: hits_total, misses_total, blocks_total,
// sets_dropped_total, sets_rejected_total, evictions_total,
// expirations_total, entries and max_entries; no client key is a label.
//
// It does not decide or count (the limiter does, including the counting
// of blocked requests that block-action rules require), share or persist
// blocks between edges, or know rules: when rules change, the caller calls
// Clear, since old release times may not hold under new limits.
package blockcache
