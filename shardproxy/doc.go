// Package shardproxy is poplimit's counter store: memcached shards addressed
// through a consistent-hash ring that places every key exactly where
// nutcracker (twemproxy) places it, so an edge may talk to the shards
// directly or through a nutcracker proxy and both agree.
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
// an existing proxy most likely uses it, and because it is the fastest (about
// 30 ns a lookup, no allocation). Its known weakness, a 32-bit FNV with a
// small multiplier that barely moves the hash on the last bytes, does not
// matter here: what it hashes is the 16 hex digits of a 64-bit key hash,
// uniform by construction. (Keys that differ only in their last hex digits
// land on neighbouring points, so the same shard; over many keys the shares
// still follow the weights.) md5 mixes best but costs about 120 ns a lookup.
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
// adapts one to the other). An increment is `incr`; on a miss, `add` of the
// delta with the op's TTL; if another client's add won the race, `incr`
// again. A decrement is `decr` (memcached clamps at 0; a missing counter
// reads 0). Reads are grouped per shard into multi-gets of up to 128 keys;
// a missing counter reads 0. Ops on one counter take effect in the order
// given, so each op's Value is what applying the ops one by one would give;
// ops on different counters run concurrently. Each shard's ops run on
// goroutines of their own, with a bounded number of connections, and Do
// returns within BatchTimeout even if a shard hangs.
//
// # Pipelines
//
// A shard with one command to run in a call (an incr or decr, or one
// multi-get: Incr, Get, and most of the edge's sync decisions) runs it
// through gomemcache, as the package always has (Ring is also a gomemcache
// ServerSelector): one command is one round trip either way. A shard with
// more runs them as a pipeline, an optimisation on top for the edge's
// flusher, which sends 100 to 300 ops every 5 ms over the shards: with a
// gomemcache round trip per op (a write and a read system call each, and a
// goroutine hop per op), shardproxy's workers took 28% of the edge's CPU
// at 40,000 requests/s, nearly all in system calls, and the memcached
// processes on the same 2-core box woke as often.
//
// A pipeline is up to three rounds, each one buffered write of text
// commands and the in-order read of their replies through one buffered
// reader: (1) the multi-gets of the reads, then an `incr` or `decr` per
// write; (2) an `add` (never noreply: NOT_STORED must be seen) per
// increment that missed; (3) an `incr` per add that lost the race. Every
// round ends with `version`, whose reply is the one line no counter command
// gives, so a reply missing or extra is caught in its round rather than
// shifting the next batch's replies onto other counters. When a counter is
// written twice in a call, its ops are split into phases, the k-th write of
// each counter (and the reads between) in phase k, and each phase's rounds
// run after the previous phase's: correct, at a round trip per repeat, which
// the edge never sends. A shard's ops take one pipeline per 512, split by
// counter, on up to Parallelism connections at once. Pipeline connections
// are dialled within Timeout, kept per shard in a pool of their own beside
// gomemcache's (MaxConnsPerShard bounds the connections in use, both kinds
// together, and the idle ones of each pool), reused across calls, and
// closed after a failure or a timeout.
//
// Measured on a 2-core box against memcached on loopback (medians of six
// runs, before and after, interleaved): BenchmarkClientDoBatch256, 256 ops
// over 3 shards, mostly increments of existing counters, went from 2.6 ms
// to 0.27 ms a call (10.0 to 1.05 µs an op) and from 842 allocations to 8;
// per op the client made 2.79 system calls before and 0.15 after,
// memcached 2.66 and 0.17 (strace -f). BenchmarkClientDoBatch, 64 ops that
// all land on one shard: 0.44 to 0.11 ms a call, 182 allocations to 6,
// 1.75 to 0.30 system calls an op (memcached 1.48 to 0.16).
//
// The pipelined reader trusts nothing it reads: a reply line is at most
// 4 KiB, a VALUE at most 64 bytes (a counter is at most 20 digits), a
// VALUE must be for a key asked, in the order asked. A reply that breaks
// the protocol (or ERROR, SERVER_ERROR, a closed connection, a timeout)
// fails its op (for a multi-get, all its reads) and those after it on the
// connection; a reply missing or extra fails the whole round, since no
// reply in it can be tied to its command. The connection is then closed
// with the shard's idle pipeline connections, and the shard is charged one
// failure for the batch. CLIENT_ERROR (an incr of a value that is not a
// number) and a VALUE that is not a number are memcached's answers: that
// op's error, not a failure.
//
// # Failures and ejection
//
// Every batch whose calls to a shard fail (a timeout, a refused or broken
// connection, a reply that is not memcached's protocol, SERVER_ERROR; not a
// miss, nor a CLIENT_ERROR) counts one failure against the shard, however
// many ops failed; a success resets the count. After FailureLimit
// consecutive failures the shard is ejected: the ring is rebuilt over the
// live shards, as nutcracker's auto_eject_hosts does, its idle connections
// are closed, and its keys move to the others. After RetryTimeout it is put
// back on probation, where its first failure ejects it again (nutcracker
// would grant it FailureLimit more). When every shard is out, ops fail at
// once with ErrNoServers.
//
// Ejection trades accuracy for availability: the counters of a shard's keys
// restart from zero on the shards that take them over, so for up to a window
// those clients get a fresh allowance; and when the shard comes back its old
// counts, if not yet expired, resume where they stopped, missing what was
// counted elsewhere meanwhile. An edge that prefers to fail closed for a
// rule does so above this package.
//
// # What it does not do
//
// It does not replicate counters, nor move them on ejection or return; it
// does not proxy the memcached protocol (nutcracker does that); it does not
// discover servers or watch a config file: a new server list is a new
// Client. It speaks only the text protocol: single commands through
// gomemcache, pipelines through its own reader. It trusts its shards: a
// garbage reply is an error, and the pipelined reader bounds what it reads,
// but a hostile server can still make gomemcache allocate the value size it
// announces on the single-command path.
//
// # Concurrency
//
// Ring is immutable. Client is safe for concurrent use; its locks are
// independent (none is taken while another is held): one serialises ring
// rebuilds, one guards Close against new batches, and each shard has its
// pipeline pool's and gomemcache's own. A Do call's state is pooled and
// goes back to the pool when Do and the last of its workers are done with
// it; a worker still finishing a round trip after Do returned writes only
// there.
package shardproxy
