// Package shardproxy is poplimit's client of memcached shards: counters
// and small shared values on a consistent-hash ring that places every key
// exactly where nutcracker (twemproxy) places it, so an edge may talk to
// the shards directly or through a nutcracker proxy and both agree.
//
// Ring reproduces nutcracker's distribution: ketama point for point
// (src/hashkit/nc_ketama.c): weighted points named after each server,
// computed as nutcracker computes them, the key hash fnv1a_64 (the
// default), md5 or murmur, and the hash tag "{}" (only the bytes between
// the first '{' and the first '}' after it are hashed). All three hashes
// are checked against a real nutcracker.
//
// A counter is named pl:{<key hash, 16 hex digits>}:<window start, Unix
// ms> (AppendCounterKey) and a value pv:{<key hash>} (AppendValueKey):
// every window and value of a key lives on one shard, and names are at
// most 42 bytes, always legal. Client.Do runs a batch of counter ops: incr
// (creating a missing counter with add, or in one command with memcached's
// meta ma when Config.Protocol is "meta", which nutcracker does not
// proxy), decr (clamped at 0), and reads grouped into multi-gets. Ops on
// one counter take effect in the order given; each op's Value is what
// applying them one by one would give. Client.DoValues (and Gets, Add,
// CompareAndSwap) keeps values of at most MaxValueLen bytes by gets, add
// and cas: ErrCASConflict and ErrExists say another client won, ErrNotFound
// that there is no value.
//
// Do and DoValues return within BatchTimeout even if a shard hangs; a
// shard with several ops runs them pipelined, in rounds that each end with
// a version command, so a missing or extra reply fails its round instead
// of shifting replies onto other keys, and ops an earlier round settled
// keep their outcome. The pipelined reader bounds every line and value it
// reads. Each op's outcome is counted once in poplimit_shardproxy_ops_total
// by op and result (ok, miss, conflict, timeout, canceled, error); the
// caller's own deadline or cancel never counts against a shard.
//
// A batch whose calls to a shard fail counts one failure against it; after
// FailureLimit in a row the shard is ejected and the ring rebuilt over the
// live shards (nutcracker's auto_eject_hosts), its keys moving to the
// others, where their counters and values start afresh. After
// RetryTimeout it returns on probation, ejected again by its first
// failure. With every shard out, ops fail at once with ErrNoServers.
//
// It does not replicate counters or values, move them on ejection or
// return, discover servers, or proxy the memcached protocol. It trusts its
// shards to speak memcached: a hostile server can still make the
// single-command path allocate the value size it announces.
//
// Ring is immutable. Client is safe for concurrent use; no lock is taken
// while another is held. A call's state is pooled and reused only once the
// call and the last of its workers are done with it.
package shardproxy
