// Package blockcache remembers, in memory, which keys are blocked and until
// when, so that a blocked client's requests are answered on the edge without
// touching the limiter's store: Cloudflare's "once a client exceeds the
// limit, subsequent blocks are served from server memory".
//
// # The model
//
// A key is the 64-bit hash of a rule and a client key (the caller hashes;
// this package never sees client keys). Its value is the release time, Unix
// nanoseconds: the instant the limiter computed the client may try again.
// Block records it; Blocked, the request path's first question, answers
// "blocked until releaseAt" or "ask the limiter". A stored release time at or
// before now is a miss even if the entry has not yet been evicted, so an
// entry never outlives its release by a single request. Entries carry no
// ristretto TTL: checking one reads the wall clock on every hit, which was
// about half the cost of a lookup (BENCHMARKS.md). Released entries leave as the
// capacity policy evicts them, so memory stays bounded by MaxEntries, and
// the entries gauge counts released entries not yet evicted.
//
// The cache is bounded: at most Config.MaxEntries keys, kept by
// github.com/dgraph-io/ristretto/v2 with cost 1 per entry. When it is full,
// ristretto's TinyLFU admission decides whether a new key may displace one of
// the sampled least-frequently looked-up keys, so the clients that keep
// knocking (the ones a block saves the most work on) stay, and a flood of
// one-off keys cannot wash them out.
//
// # Never a wrong decision
//
// The cache is an optimisation, never the authority. Every way it can lose
// an entry (a Set dropped because ristretto's set buffer was full, a Set
// rejected by the admission policy, an eviction, a Clear, a lookup racing the
// asynchronous Set) costs one trip through the limiter for that key's next
// request, which then decides correctly and blocks again. Nothing is ever
// blocked that the limiter did not block, and nothing stays blocked past its
// release time. Block reports whether the Set was accepted, and every loss is
// counted in a metric.
//
// # Concurrency and cost
//
// All methods are safe for concurrent use, except Close, which must be called
// once every other call has returned. Blocked, the hot path, takes no lock
// and allocates nothing of its own. It first reads a front table of 2^14
// slots, each holding the latest release time Block gave any key mapped to
// it and the last key blocked there with its own release (under a sequence
// lock, so a key is never paired with another's release). Most lookups are
// of keys that are not blocked: a slot that has passed answers "not
// blocked" with one atomic load (13 ns against ristretto's 60). A blocked
// client that keeps knocking is usually its slot's own key and is answered
// from the slot too. Any other key (a slot shared with a later block, about
// b / 2^14 of the keys that are not blocked when b are) takes one
// ristretto Get and one atomic add on a counter striped by key. The Get
// takes a read lock on one of ristretto's 256 map shards (uncontended unless
// a Set lands on the same shard) and pushes the key into a striped, lossy
// access buffer (which costs a 512-byte allocation at most once per 64
// lookups, when the policy takes a full buffer), so ristretto's admission
// counts the lookups that reach it: when far more keys are blocked than
// there are slots, slots change owners often and the knocking clients'
// lookups reach ristretto again. ristretto applies Sets asynchronously: a
// Block is visible to Blocked a few microseconds later (Wait flushes them,
// for tests), or at once when the key becomes its slot's own.
//
// # Metrics
//
// With a non-nil prometheus.Registerer, New registers, under the namespace
// poplimit and subsystem blockcache: hits_total, misses_total, blocks_total,
// sets_dropped_total, sets_rejected_total, evictions_total (entries removed
// by the capacity policy before their release), expirations_total (entries
// removed after their release) and the gauges entries and max_entries. The
// counters are atomics read at scrape time; no client key is ever a label.
//
// # What it deliberately does not do
//
// It does not decide or count: whether a key is over its limit, and the
// counting of blocked requests that block-action rules require, belong to
// the limiter. It is not shared between edges or persisted: each edge
// rebuilds it from its own decisions, and a restarted edge asks the limiter
// once per blocked key. It knows nothing of rules: when rules change, the
// caller calls Clear, as old release times may not hold under new limits. It
// reads no clock at all: now is a parameter.
package blockcache
