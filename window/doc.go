// Package window decides whether a request under a rate rule may pass,
// across every edge of a PoP, from state shared in a Store. A Limiter runs
// a Policy (limit, window, algorithm, action, mode, failure policy) for a
// 64-bit key hash over a store.Store. The algorithms it runs are package
// algo's; the store contract and the in-memory store are package store's;
// requests in flight are limited by package slots.
//
// Every algorithm is shared through the Store: the sliding and fixed
// windows as two counters per key and window (Store.Do), the token and
// leaky buckets (GCRA) and the sliding log as one state per key changed by
// atomic read-modify-write (Store.DoState). The sliding estimate is
// prev × (W − elapsed)/W + curr, the previous window weighed by its
// recorded shape once a key's view reaches ⌈L/16⌉. In sync mode, and for
// every sliding log, a decision updates the store and decides on its reply:
// exact. In async mode (the default) it decides from this edge's view, with
// no network, and a flusher sends the coalesced units every FlushInterval;
// a key new here waits at most NewKeyWait for the store's word after its
// first request. The PoP then admits past the limit at most what the other
// edges admit before they see each other's units: about the key's rate ×
// (FlushInterval + store round trip), at least one request per edge, and
// for a bucket, when a burst starts, one share of its room per other edge.
//
// A decision the store could not inform follows the rule's failure policy
// (policy.Fail): fail-open admits (store.FallbackOpen), fail-closed
// refuses (store.FallbackClosed), both counted in
// poplimit_window_fallbacks_total. Units not yet sent wait
// out an outage and go with the first flush that succeeds; those evicted
// or too old to matter are counted in poplimit_window_pending_dropped_total.
//
// A Limiter is safe for concurrent use. It holds at most one shard mutex
// at a time and never calls the Store while holding one; a sync decision of a bucket or log holds its key's stripe lock, and
// no other, across its store call, so one key's sync decisions take turns
// on an edge. Its one goroutine, the flusher, runs from Start to Close. In
// async mode Decide and Record allocate nothing once a key has a view.
// Decide, Record and Flush take the time as a parameter; the store.Clock
// drives the flusher and the time a decision that waited is made at.
//
// It does not parse rule files, match requests or extract keys (packages
// rules and edge do), remember blocked keys (package blockcache), or know
// how a Store reaches its servers (memcachestore, redisstore, shardproxy).
package window
