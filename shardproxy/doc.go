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
// reads 0). Reads are grouped per shard into multi-gets; a missing counter
// reads 0. A batch runs on goroutines bounded per shard, each shard with a
// bounded number of connections, and Do returns within BatchTimeout even if
// a shard hangs.
//
// # Failures and ejection
//
// Every call to a shard that fails (a timeout, a refused or broken
// connection, a reply that is not memcached's protocol; not a miss, nor an
// error memcached itself answers) counts against the shard; a success
// resets the count. After FailureLimit consecutive failures the shard is
// ejected: the ring is rebuilt over the live shards, as nutcracker's
// auto_eject_hosts does, and the ejected shard's keys move to the others.
// After RetryTimeout it is put back on probation, where its first failure
// ejects it again (nutcracker would grant it FailureLimit more). When every
// shard is out, ops fail at once with ErrNoServers.
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
// Client. It speaks only the text protocol, through gomemcache, and it trusts
// its shards: a garbage reply is an error, but a hostile server can still
// make gomemcache allocate the value size it announces.
//
// # Concurrency
//
// Ring is immutable. Client is safe for concurrent use; its locks are
// independent (none is taken while another is held): one serialises ring
// rebuilds, one guards Close against new batches, and each shard's
// connection pool has gomemcache's own.
package shardproxy
