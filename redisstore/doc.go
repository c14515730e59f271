// Package redisstore is poplimit's shared store over Redis or Redis
// Cluster, for operators who run Redis instead of memcached: Store
// implements store.Store, so a Limiter (and the edge) runs over it
// unchanged: counters, and two scripted algorithms whose state is not a
// counter, the leaky bucket as a meter (GCRA) and the exact sliding log.
//
// # Keys
//
// A counter is named pl:{<key hash, 16 hex digits>}:<window start, Unix ms>
// (AppendCounterKey), as shardproxy names it in memcached. A key's bucket is
// pl:{…}:gcra (a hash), its sliding log pl:{…}:log (a sorted set) with
// pl:{…}:logm (a hash of its bookkeeping). The braces are Redis Cluster's
// hash tag: only the key hash decides the slot, so every window of a client
// key, its bucket and its log live on one node, a script's keys never
// cross slots, and one pipeline reads a key's previous and current window
// together. Client keys never reach Redis: the caller hashes them.
//
// # Counters
//
// Do sends all of a call's ops as one pipeline (rueidis splits it by node
// in a cluster). An increment is one call of a tiny script: INCRBY, then
// PEXPIRE with the op's TTL (whole ms rounded up, at least a second, as in
// memcached) when the result equals the delta, that is when the increment
// created the counter; atomic, so a counter never lives without its TTL. A
// decrement is the same script clamping at 0 and keeping the TTL; a
// missing counter stays missing. A read is GET; a missing counter reads 0.
// These are store.MemStore's semantics, which a test checks op by op.
//
// # Scripts
//
// The scripts are loaded on every node with SCRIPT LOAD when the Store
// connects, and called with EVALSHA. A node that has lost them (restarted,
// failed over, SCRIPT FLUSH) answers NOSCRIPT; those calls are sent once
// more, as EVAL, within the same timeout, which also caches the script
// there again, and are counted in poplimit_redis_script_fallbacks_total.
// Every write of a call is one script, so on a node either all of a call's
// writes find it or none does, and the reads that followed a re-sent write
// of the same key are re-sent after it: ops on one key keep their order.
//
// Redis' Lua numbers are doubles, exact only up to 2^53, while Unix
// nanoseconds are about 1.8e18 and the leaky bucket's products reach 2^63.
// The scripts therefore carry integers as pairs (h, l), v = h·10^9 + l,
// with add, subtract, compare, multiply and floor division that keep every
// intermediate below 2^53: exact over all of int64. Instants and the
// bucket's state are stored as decimal strings, readable with HGETALL.
// TestLuaInt64 checks the arithmetic against math/big across the int64
// range.
//
// GCRA is algo.LeakyBucket's arithmetic (the theoretical arrival time
// with its fraction of a nanosecond in units of 1/Rate) on the server, in
// two forms: conditional (sync mode: pour n units only if they fit) and
// unconditional (an async flush pouring units its edge already admitted,
// which may take the bucket over Capacity). The script returns the state
// after the call; the room left and the release time are computed from it
// by algo.LeakyBucket itself. TestGCRAMatchesLeakyBucket compares the
// script with algo.LeakyBucket step by step on random sequences over
// buckets spanning Validate's whole range (those whose full drain, added to
// now, fits an int64: beyond that algo.LeakyBucket's own TAT overflows,
// where the script saturates at math.MaxInt64). A bucket's TTL is the time
// it takes to drain, rounded up to the millisecond, plus Config.ClockSkew.
//
// SlidingLog is algo.SlidingLog on the server: a sorted set with one
// member per logged unit (a unique number from the bookkeeping hash),
// ZREMRANGEBYSCORE of what left the window, ZCARD, a conditional ZADD, and a
// TTL of one window plus ClockSkew. Scores are nanoseconds since a per-key
// epoch, moved forward as the log empties or every 2^52 ns, so they stay
// exact; hence Window ≤ MaxLogWindow. Memory is one member per unit in the
// window: the exact log is for small limits such as logins, and
// unconditional calls stop logging at Config.MaxLogEntries per key.
// TestSlidingLogMatchesWindow compares it with algo.SlidingLog.
//
// Both take now from the caller, as window does: the edges' clocks, not
// the server's, decide.
//
// DoState is store.Store's method for states: a store.StateOp of kind
// StateGCRA is a call of the GCRA script, one of kind StateLog a call of
// the sliding-log script (its Limit at most algo.MaxSharedLogLimit, as
// StateOp.Validate checks), every op of a call, of both kinds, in one
// pipeline. GCRABatch, SlidingLogBatch and DoState share one send and
// collect loop (scriptBatch). TestDoStateMatchesMemStore compares DoState
// with store.MemStore op by op on random sequences; where the two differ
// (a log's latest instant, advanced here by every op as algo.SlidingLog
// advances it, by MemStore only by the ops that log units) DoState's
// documentation says so.
//
// # Timeouts and failures
//
// Every Do, GCRABatch, SlidingLogBatch and DoState call, and every op in
// it, is bounded by Config.Timeout (the caller's ctx may end it sooner): a
// dead or hung node fails its ops with ErrTimeout or ErrUnavailable within
// it, and nothing is retried beyond the one EVAL after a NOSCRIPT. The round
// trips run on a goroutine of the call, which the caller leaves behind at
// its deadline, because rueidis can make a call wait for a connection another
// goroutine is dialling whatever the call's context says. A call of one
// command on a steady Store (no call unanswered for ConnTimeout +
// DialTimeout) runs on the caller's goroutine instead, saving the sync path
// two goroutine hand-overs; there the one wait its deadline does not bound
// is for a connection that rueidis itself is dialling (a cluster's topology
// refresh), at most DialTimeout. A connection
// that waits longer than ConnTimeout for a reply is closed and dialled
// again. Ops fail independently: an error reply (ErrReply: WRONGTYPE when a
// key holds another type, "not an integer" for a counter that is not one)
// or a stored value that does not decode (ErrBadValue) fails that op alone,
// and a dead node in a cluster fails only the keys it holds. Healthy is
// false while the Store is not connected or after FailureLimit consecutive
// calls went wholly unanswered, until one is answered. A Store whose
// servers are down at New still starts: its ops fail with ErrUnavailable
// while it tries to connect every ReconnectInterval.
//
// # Sentinel
//
// With TopologySentinel, Addrs are Redis Sentinel's sentinels: rueidis's
// sentinel client asks them for the master of Config.SentinelMaster,
// connects to it, and follows their +switch-master event to a promoted
// replica (and asks again every SentinelRefresh, in case an event was
// missed). While the master is dead its ops fail within Timeout, as any
// dead server's do; the counts a replica had received when it was promoted
// are the counts from then on (replication is asynchronous: the last
// increments before a crash can be lost, as with any Redis failover).
//
// # The client
//
// The package uses github.com/redis/rueidis rather than
// github.com/redis/go-redis/v9. BenchmarkClients sends the same commands
// through both against one real redis-server: pipelined batches of 256
// increments (the async flush), single round trips, and single round trips
// from 16 goroutines at once (the sync path under load):
//
//	go test -run '^$' -bench BenchmarkClients -benchtime 2s ./redisstore/
//
// rueidis pipelined the batches faster, with a handful of allocations a
// batch where go-redis makes several per command, and its automatic
// pipelining of concurrent single calls gave by far the higher throughput;
// one call alone costs about the same through either. Throughput with
// pipelining decided.
// BenchmarkStore* measure the Store itself.
//
// # What it does not do
//
// It does not shard over several standalone servers (run Redis Cluster, or
// a proxy such as nutcracker in front of them, with TopologyStandalone), does
// not read from replicas, and does not use client-side caching: counters
// change under every edge. It trusts its servers' protocol to rueidis.
//
// # Concurrency
//
// Store is safe for concurrent use. Its one goroutine, the connector, runs
// only while it is not connected and stops at Close, which waits for it.
// Calls share pipelined connections (ConnsPerNode per node); a call's
// buffers are pooled, and it keeps no reference to its ops after it
// returns.
package redisstore
