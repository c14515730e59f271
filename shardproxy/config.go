package shardproxy

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Config, used where a field is zero.
const (
	DefaultHash             = HashFNV1a64
	DefaultProtocol         = ProtocolText
	DefaultTimeout          = 100 * time.Millisecond
	DefaultBatchGrace       = 50 * time.Millisecond // BatchTimeout defaults to Timeout + this
	DefaultMaxConnsPerShard = 64
	DefaultParallelism      = 8
	DefaultFailureLimit     = 3
	DefaultRetryTimeout     = 5 * time.Second
)

// Upper bounds that Validate enforces, so that no setting can make a Client
// hold a caller, a goroutine or a connection without limit.
const (
	maxTimeout       = time.Minute
	maxConnsPerShard = 4096
	maxParallelism   = 1024
	maxFailureLimit  = 1000
	maxRetryTimeout  = time.Hour
	maxKeysPerGet    = 128                 // a larger read group is split into several multi-gets
	maxTTL           = 30 * 24 * time.Hour // memcached reads a larger expiry as a Unix time
)

// Protocol names how a Client sends increments to memcached.
type Protocol string

const (
	// ProtocolText is the text protocol's incr; when the counter is
	// missing, add, and when another client's add won, incr again: up to
	// three round trips, in any memcached and through nutcracker.
	ProtocolText Protocol = "text"

	// ProtocolMeta is the meta protocol's arithmetic command, ma with N
	// (create a missing counter with this TTL), J (its initial value, the
	// delta) and D (the delta): one round trip, memcached 1.6 or later.
	// nutcracker does not speak it: only for shards addressed directly.
	ProtocolMeta Protocol = "meta"
)

// Config configures a Client. The zero value of each field other than
// Servers means the default written on it; Validate rejects the rest.
type Config struct {
	// Servers are the memcached shards, in the order of nutcracker's
	// servers list (the order decides only ties between ring points).
	// Required, at most MaxServers.
	Servers []Server

	// Hash is the key hash, as the `hash:` of the nutcracker pool that must
	// agree with this client. Default HashFNV1a64. The hash tag is always
	// "{}": counter keys carry their key hash between braces.
	Hash Hash

	// Protocol is how increments are sent: ProtocolText ("text", the
	// default) or ProtocolMeta ("meta"). With "meta", every increment goes
	// through the pipelined path, even alone on its shard, and an increment
	// that creates its counter is not told from one that finds it (ma does
	// not say), so increments count as result="ok", never "miss". Reads
	// and decrements are the same in both.
	Protocol Protocol

	// Timeout bounds one round trip to a shard: the dial, and the write and
	// read of one command (gomemcache's Timeout) or of one round of a
	// pipeline, however many commands it carries. It is also what a hung
	// shard costs an op. Default 100ms, at most one minute.
	Timeout time.Duration

	// BatchTimeout bounds one Do or DoValues call: ops without a reply by
	// then fail with ErrTimeout. An increment of a missing counter takes up
	// to three round trips (incr, add, incr; one with ProtocolMeta), each
	// bounded by Timeout, and so does each further write of a counter in the
	// same call; a round trip still running when the call returns finishes
	// in the background and only updates the shard's health. Default
	// Timeout + 50ms; not less than Timeout.
	BatchTimeout time.Duration

	// MaxConnsPerShard caps the connections in use to one shard, single
	// commands and pipelines together: it is the number of round trips in
	// flight to a shard. It is also how many idle connections each kind
	// keeps (gomemcache's MaxIdleConns, whose own default keeps 2, and the
	// pipelines' pool), so a busy client keeps its connections instead of
	// redialling. A shard thus sees up to twice MaxConnsPerShard
	// connections from a client; the edge's flusher keeps one pipeline per
	// shard. Size it to the concurrency of the callers. Default 64, at most
	// 4096.
	MaxConnsPerShard int

	// Parallelism caps the goroutines, each with one connection, that one
	// Do call runs the ops of one shard on; each shard has its own, so a
	// hung shard delays no other shard's ops. A shard's ops take one
	// pipeline per 512, so a call of up to 512 ops per shard runs one
	// goroutine per shard it touches, and never more than Parallelism ×
	// (shards it touches). Default 8, at most 1024.
	Parallelism int

	// FailureLimit is the number of consecutive failed calls (timeouts,
	// connection errors, malformed replies; not cache misses) after which a
	// shard is ejected from the ring, as nutcracker's server_failure_limit.
	// Default 3, at most 1000.
	FailureLimit int

	// RetryTimeout is how long an ejected shard stays out of the ring before
	// it is put back and tried again, as nutcracker's server_retry_timeout.
	// Default 5s, at most one hour.
	RetryTimeout time.Duration
}

// WithDefaults returns c with every zero field set to its default: the
// one place they are applied (edge.Options shows them through it).
func (c Config) WithDefaults() Config {
	if c.Hash == "" {
		c.Hash = DefaultHash
	}
	if c.Protocol == "" {
		c.Protocol = DefaultProtocol
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = c.Timeout + DefaultBatchGrace
	}
	if c.MaxConnsPerShard == 0 {
		c.MaxConnsPerShard = DefaultMaxConnsPerShard
	}
	if c.Parallelism == 0 {
		c.Parallelism = DefaultParallelism
	}
	if c.FailureLimit == 0 {
		c.FailureLimit = DefaultFailureLimit
	}
	if c.RetryTimeout == 0 {
		c.RetryTimeout = DefaultRetryTimeout
	}
	return c
}

// Validate returns every problem with c, each naming the field and the bad
// value, joined; nil when New would accept c.
func (c Config) Validate() error {
	errs := validateServers(c.Servers)
	if c.Hash != "" && !c.Hash.valid() {
		errs = append(errs, fmt.Errorf("Hash: %w", errHash(c.Hash)))
	}
	if c.Protocol != "" && c.Protocol != ProtocolText && c.Protocol != ProtocolMeta {
		errs = append(errs, fmt.Errorf("Protocol: %q: want %q (default) or %q", string(c.Protocol), ProtocolText, ProtocolMeta))
	}
	dur := func(name string, d, limit time.Duration) {
		if d < 0 || d > limit {
			errs = append(errs, fmt.Errorf("%s: %v: want 0 (default) or up to %v", name, d, limit))
		}
	}
	num := func(name string, n, limit int) {
		if n < 0 || n > limit {
			errs = append(errs, fmt.Errorf("%s: %d: want 0 (default) or up to %d", name, n, limit))
		}
	}
	dur("Timeout", c.Timeout, maxTimeout)
	dur("BatchTimeout", c.BatchTimeout, maxTimeout+DefaultBatchGrace)
	dur("RetryTimeout", c.RetryTimeout, maxRetryTimeout)
	num("MaxConnsPerShard", c.MaxConnsPerShard, maxConnsPerShard)
	num("Parallelism", c.Parallelism, maxParallelism)
	num("FailureLimit", c.FailureLimit, maxFailureLimit)
	if d := c.WithDefaults(); c.BatchTimeout > 0 && d.BatchTimeout < d.Timeout {
		errs = append(errs, fmt.Errorf("BatchTimeout: %v: less than Timeout (%v)", c.BatchTimeout, d.Timeout))
	}
	if len(errs) > 0 {
		return fmt.Errorf("shardproxy: config: %w", errors.Join(errs...))
	}
	return nil
}
