// Package memcachestore keeps the limiter's shared state in memcached
// shards: its Store adapts a shardproxy.Client to store.Store, so that
// neither of those two packages imports the other.
//
// Counters (sliding and fixed windows) are memcached counters, sent as
// the window's ops: incr, with add when a counter is new. Algorithm state
// (the GCRA time of the token and leaky buckets, the sliding log) is one
// value per key, changed by read-modify-write: gets, store.StateOp.Apply,
// then cas (add when there was none), retried from a fresh gets when
// another writer won, at most StateRounds rounds. An op that loses every
// round fails with ErrContention, and the limiter applies the rule's
// failure policy to it as to any store failure.
//
// A key's state lives under StateKey(op) on the shard the ring places it
// on, beside its counters. Outcomes are counted in
// poplimit_state_ops_total{store="memcached",result} and
// poplimit_state_cas_retries_total.
package memcachestore
