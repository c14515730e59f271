// Package window holds the rate-limiting algorithms, the Policy that names
// one with its limit and window, the Limiter that runs a policy against a
// shared Store, Slots for concurrency limits, and MemStore.
//
// # The algorithms
//
// The five classic algorithms are here as pure code: time is a
// parameter, nothing reads a clock, starts a goroutine or does I/O, and the
// state types are small values the caller owns (and serializes access to).
//
//   - SlidingWindow, the one the edge uses: two fixed-window counters and
//     estimate = prev × (W − elapsed)/W + curr. Window starts are wall-clock
//     multiples of W, so every edge agrees on them without talking.
//   - FixedWindow, TokenBucket, LeakyBucket (meter and queue), SlidingLog.
//     The sliding log is exact and O(limit) memory per key; the aggregator
//     uses it as the ground truth that the estimate is judged against.
//
// The two-counter estimate assumes the previous window's requests were
// spread evenly over it, so a key whose previous window came all at its
// end (every client that starts mid-window: a replay, an attack's onset) is
// under-estimated, by up to prev × (W − elapsed)/W, and up to twice the
// limit can pass in a trailing window. The Limiter therefore records, for
// hot keys (a view of at least ⌈L/16⌉ in a window), the window's shape as
// this edge saw it — its own admissions at once, the other edges' as the
// store's replies raise the count — in 32 equi-depth buckets, each with
// its first and last instant (hist.go), and weighs the previous window's
// count by the part of that shape still inside the trailing window. Keys
// below the threshold keep the uniform estimate: their unknown-shape part
// is under L/16. The store holds the same two counters; release times stay
// exact under the estimate used.
//
// Token and leaky buckets and sliding logs are shared through the
// StateStore, one atomic read-modify-write of a small value per key
// (shared.go, state.go).
//
// # The Limiter
//
// Limiter is the package's one stateful part. It keeps a local view of every
// active key (previous window count, last known global count, increments not
// yet acknowledged) in sharded maps, and in async mode (the default) decides
// from that view alone: the request path touches no network. A background
// flusher sends each key's coalesced increments once every flush interval as
// one increment per key, and the store's reply (the global count) refreshes
// the view. The previous window's count stops changing once every edge's last
// flush for it has landed, so it is read once per key per window, after a
// grace of one flush interval plus the store timeout. A flush sends its
// operations in batches of at most Config.MaxFlushOps, so its memory does
// not grow with the keys queued; a flush that finds nothing to send parks
// the flusher until a key is queued, so an idle limiter does not wake.
//
// A key new to this edge (a new or restarted edge, a view evicted or idle
// for a window) has its first request decided at once from this edge's
// count; the requests that follow before its shared count is known wake the
// flusher and wait for that read, at most Config.NewKeyWait, unless this
// edge's own count already refuses them. So a fresh edge cannot admit a
// burst that the other edges had already used up, and floods of new keys,
// which send a request or two each, never wait.
//
// Over-admission in async mode is bounded by what the edges admit before
// they see each other's counts: about (the key's global rate) × (flush
// interval + store round trip), and at least one request per edge, since an
// edge learns the global count from the reply to its own increment. Sync
// mode, for rules where exactness comes first, does one store increment on
// the request path and decides on the reply; the sync decisions of keys on
// one part of the store (a memcached shard, see Placer) that arrive while
// two store calls of that part are in flight go together in the next
// (syncbatch.go), each still bounded by its own store timeout, and a hung
// shard holds up only its own keys' decisions.
//
// The limiter's clock is a dependency (Clock) and Flush takes the time as a
// parameter, so tests drive it, flusher included, in simulated time.
//
// # Lock order
//
// A Limiter holds at most one shard mutex at a time and never calls the
// Store while holding one.
//
// # What it does not do
//
// It does not parse rule files, match requests to rules or extract keys
// from them (packages rules and edge do): it sees a Policy and a 64-bit key
// hash. It does not remember blocked keys (package blockcache does), and
// does not know how the Store reaches its servers (package shardproxy
// does).
package window
