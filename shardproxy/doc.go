// Package shardproxy is poplimit's store of counters and shared values:
// memcached shards addressed through a consistent-hash ring that places
// every key exactly where nutcracker (twemproxy) places it, so an edge may
// talk to the shards directly or through a nutcracker proxy and both agree.
//
// # The ring
//
// Ring reproduces nutcracker's `distribution: ketama` point for point
// (src/hashkit/nc_ketama.c): each live server gets
// floor(weight/total × 40 × live servers) × 4 points, computed in float32 as
// nutcracker does, named "<name>-<i>" for i from 0, four points cut from the
// MD5 digest of each name; the points are sorted (stably, like glibc's merge
// sort qsort) and a key goes to the first point at or after its hash,
// wrapping past the last. A server's name is its configured name, else
// "host:port", else "host" alone when the port is 11211. Weights are relative.
//
// The key hash is nutcracker's fnv1a_64 by default; md5 and murmur are also
// implemented and all three are checked against a real nutcracker. fnv1a_64
// because it is nutcracker's default and the one its documentation shows, so
// an existing proxy most likely uses it, and because it is the fastest of
// the three (no allocation; BenchmarkRingLookup). Its known weakness, a 32-bit FNV with a
// small multiplier that barely moves the hash on the last bytes, does not
// matter here: what it hashes is the 16 hex digits of a 64-bit key hash,
// uniform by construction. (Keys that differ only in their last hex digits
// land on neighbouring points, so the same shard; over many keys the shares
// still follow the weights.) md5 mixes best but costs several times as much
// a lookup.
//
// The hash tag is "{}": when a key holds a '{' followed later by a '}' with
// at least one byte between them, only those bytes are hashed (the first '{'
// and the first '}' after it; nutcracker's rule in src/nc_server.c).
//
// # Counters
//
// A counter is named pl:{<key hash, 16 hex digits>}:<window start, Unix ms>
// (AppendCounterKey). The tag holds the key hash alone, so every window of a
// key lives on one shard and a single multi-get reads both the previous and
// the current window. Client keys never reach memcached: the caller hashes
// them, so counter keys are short (at most 42 bytes) and always legal.
//
// Client.Do runs a batch of Ops (the same fields as window.Op; the edge
// converts one to the other). An increment is `incr`; on a miss, `add` of
// the delta with the op's TTL; if another client's add won the race, `incr`
// again (Config.Protocol "text", the default). An increment the caller
// hints is new (Op.New: the edge's first of a key's window) is preceded in
// its round by `add <key> 0 <ttl> 1 noreply` and the value 0, so the incr
// finds the counter and a new counter costs one round trip, not two; the
// add has no reply to read (nutcracker forwards noreply too), and where the
// counter exists memcached refuses it silently. With Protocol "meta" it is
// memcached's meta arithmetic command instead, `ma <key> N<ttl> J<delta>
// D<delta> v`, which increments or creates in one command, under
// memcached's item lock, so there is no add race and no second or third
// round trip; but nutcracker does not speak the meta protocol, and ma does
// not say whether it created the counter (a meta increment is never
// counted as a miss). The meta protocol pays where counters are new (the
// first flush of each key's window): it halves their round trips; on
// counters that exist it costs the same round trip as incr.
//
// A decrement is `decr` (memcached clamps at 0; a missing counter reads 0).
// Reads are grouped per shard into multi-gets of up to 128 keys; a missing
// counter reads 0. Ops on one counter take effect in the order given, so
// each op's Value is what applying the ops one by one would give; ops on
// different counters run concurrently. Each shard's ops run on goroutines
// of their own, with a bounded number of connections, and Do returns within
// BatchTimeout even if a shard hangs.
//
// # Values
//
// Client.DoValues, and Gets, Add and CompareAndSwap, its one-op forms, keep
// small byte values (at most MaxValueLen, 16 KiB) for state that edges share
// by read-modify-write, such as a token bucket's theoretical arrival time
// (GCRA) or a short sliding log: gets returns a value with its CAS token;
// cas stores a new value only if the token is still current, else
// ErrCASConflict (another client won: read again); add creates a value only
// if none exists, else ErrExists. A missing value is ErrNotFound. A value is
// named pv:{<key hash>} (AppendValueKey): the same hash tag as the key's
// counters, so it lives on their shard, and a prefix of its own, so it never
// collides with them. Value ops use the text protocol's gets, add and cas,
// which nutcracker also proxies, always pipelined (up to 32 commands and
// 64 KiB of request a round trip, so a round's request always fits in the
// socket buffers), with the same timeouts, health and metrics as counters.
//
// # Pipelines
//
// A shard with one command to run in a call (an incr or decr, or one
// multi-get: Incr, Get, and most of the edge's sync decisions) runs it
// through gomemcache, as the package always has (Ring is also a gomemcache
// ServerSelector): one command is one round trip either way. A shard with
// more runs them as a pipeline on connections of its own, an optimisation
// for the edge's flusher, which sends hundreds of ops every few
// milliseconds over the shards: a gomemcache round trip per op costs a write
// and a read system call each, and a goroutine hop per op, on the edge and
// on memcached, where a pipeline costs them once a round.
// Meta increments and value ops, which gomemcache cannot send, always
// pipeline.
//
// A pipeline is up to three rounds, each one buffered write of text
// commands and the in-order read of their replies through one buffered
// reader: (1) the multi-gets of the reads, then an `incr` (or `ma`) or
// `decr` per write, a hinted incr after its noreply `add` of 0, or the
// value ops; (2) an `add` (never noreply: NOT_STORED must be seen) per text
// increment that missed; (3) an `incr`
// per add that lost the race. Every round ends with `version`, whose reply
// is the one line no counter or value command gives, so a reply missing or
// extra is caught in its round rather than shifting the next batch's
// replies onto other counters. When a counter is written twice in a call,
// its ops are split into phases, the k-th write of each counter (and the
// reads between) in phase k, and each phase's rounds run after the
// previous phase's: correct, at a round trip per repeat, which the edge
// never sends. A shard's ops take one pipeline per 512, split by counter
// (or value key), on up to Parallelism connections at once. Pipeline
// connections are dialled within Timeout, kept per shard in a pool of
// their own beside gomemcache's (MaxConnsPerShard bounds the connections
// in use, both kinds together, and the idle ones of each pool), reused
// across calls, and closed after a failure or a timeout.
//
// The pipelined reader trusts nothing it reads: a reply line is at most
// 4 KiB, a counter's VALUE at most 64 bytes (a counter is at most 20
// digits) and a value's at most MaxValueLen, a VALUE must be for a key
// asked, in the order asked. A reply that breaks the protocol (or ERROR,
// SERVER_ERROR, a closed connection, a timeout) fails its op (for a
// multi-get, all its reads) and those after it on the connection. A reply
// missing or extra fails the ops of its round, since no reply in it can be
// tied to its command; the ops that an earlier round of the same pipeline
// settled keep their outcome, since that round ended in step: an increment
// memcached confirmed in round 1 is not failed because the add of another
// went wrong in round 2 (the caller would send it again, and count it
// twice). The connection is then closed with the shard's idle pipeline
// connections, and the shard is charged one failure for the batch.
// CLIENT_ERROR (an incr of a value that is not a number) and a VALUE that
// is not a number are memcached's answers: that op's error, not a failure.
//
// # Results
//
// Each op's outcome is counted once in poplimit_shardproxy_ops_total by op
// (incr, decr, get, gets, add, cas) and result: ok; miss (a counter
// created or read missing, ErrNotFound); conflict (ErrCASConflict,
// ErrExists); timeout (ErrTimeout); canceled; error (anything else,
// ErrNoServers and ErrClosed included). An op that has no reply when the
// call's time runs out is a timeout whichever deadline ran out (the shard's
// Timeout, BatchTimeout, or the caller's own context deadline; its error
// then wraps both ErrTimeout and context.DeadlineExceeded), and whichever
// goroutine saw it first: the edge gives each call a deadline equal to
// Timeout, so the shard's and the caller's deadlines race, and an op that
// ran out of time is a timeout to whoever reads the metric. An op the
// caller cancelled (context.Canceled) is canceled: it says nothing about
// the shard, so it is neither a timeout nor an error. Neither the caller's
// deadline nor its cancel counts against the shard's health; a round trip
// that did time out does, even when it ends after Do returned.
//
// # Failures and ejection
//
// Every batch whose calls to a shard fail (a timeout, a refused or broken
// connection, a reply that is not memcached's protocol, SERVER_ERROR; not a
// miss, a conflict, nor a CLIENT_ERROR) counts one failure against the
// shard, however many ops failed; a success resets the count. After
// FailureLimit consecutive failures the shard is ejected: the ring is
// rebuilt over the live shards, as nutcracker's auto_eject_hosts does, its
// idle connections are closed, and its keys move to the others. After
// RetryTimeout it is put back on probation, where its first failure ejects
// it again (nutcracker would grant it FailureLimit more). When every shard
// is out, ops fail at once with ErrNoServers.
//
// Ejection trades accuracy for availability: the counters of a shard's keys
// restart from zero on the shards that take them over, so for up to a window
// those clients get a fresh allowance; and when the shard comes back its old
// counts, if not yet expired, resume where they stopped, missing what was
// counted elsewhere meanwhile. Values likewise start missing on the shard
// that takes them over, and a CAS token is good only on the shard that gave
// it. An edge that prefers to fail closed for a rule does so above this
// package.
//
// # What it does not do
//
// It does not replicate counters or values, nor move them on ejection or
// return; it does not proxy the memcached protocol (nutcracker does that);
// it does not discover servers or watch a config file: a new server list is
// a new Client. It speaks the text protocol, single commands through
// gomemcache and pipelines through its own reader, and the meta protocol's
// ma only when Protocol is "meta". It trusts its shards: a garbage reply is
// an error, and the pipelined reader bounds what it reads, but a hostile
// server can still make gomemcache allocate the value size it announces on
// the single-command path.
//
// # Files
//
// client.go is the API (Client, New, Do, Close, Healthy); batch.go plans a
// call (placing ops on shards, grouping them into units per shard, phases);
// worker.go runs the units (single commands, pipelines, health);
// pipeline.go is the pipelined exchange (chunks and rounds) and reply.go
// its parsers; classify.go says what each outcome is (sentinel errors, op
// kinds, result labels); values.go is the value ops.
//
// # Concurrency
//
// Ring is immutable. Client is safe for concurrent use; its locks are
// independent (none is taken while another is held): one serialises ring
// rebuilds, one guards Close against new batches, and each shard has its
// pipeline pool's and gomemcache's own. A Do or DoValues call's state is
// pooled and goes back to the pool when the call and the last of its
// workers are done with it; a worker still finishing a round trip after
// the call returned writes only there.
package shardproxy
