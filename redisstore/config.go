package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Topology is how the Store reaches its servers: one server, a cluster,
// or a master found through sentinels.
type Topology string

const (
	// TopologyAuto (the zero value) asks the servers: one address of a server
	// without cluster support is a standalone server, anything else is a
	// cluster (several addresses are entry points to one cluster).
	TopologyAuto Topology = ""
	// TopologyStandalone is one server (or a proxy in front of several, such as
	// nutcracker with redis: true), never asked about a cluster.
	TopologyStandalone Topology = "standalone"
	// TopologyCluster is Redis Cluster; connecting fails if the servers are not
	// one.
	TopologyCluster Topology = "cluster"
	// TopologySentinel is a master and its replicas watched by Redis Sentinel:
	// Addrs are the sentinels, which name the master of SentinelMaster;
	// when they promote a replica, the Store follows (their +switch-master
	// event, and a poll every SentinelRefresh).
	TopologySentinel Topology = "sentinel"
)

// Defaults of Config, used where a field is zero.
const (
	DefaultTimeout           = 100 * time.Millisecond
	DefaultDialTimeout       = time.Second
	DefaultConnTimeout       = time.Second
	DefaultConnsPerNode      = 2
	DefaultBufferBytes       = 64 << 10
	DefaultFailureLimit      = 3
	DefaultReconnectInterval = time.Second
	DefaultMaxLogEntries     = 100_000
	DefaultClockSkew         = time.Second
	DefaultSentinelRefresh   = 2 * time.Second
)

// Upper bounds that Validate enforces, so that no setting can make a Store
// hold a caller, a connection or memory without limit.
const (
	maxAddrs         = 1024
	maxTimeout       = time.Minute
	maxConnsPerNode  = 256 // rueidis' MaxPipelineMultiplex of 8
	minBufferBytes   = 4 << 10
	maxBufferBytes   = 16 << 20
	maxFailureLimit  = 1000
	maxReconnect     = time.Hour
	maxMaxLogEntries = 10_000_000
	maxDB            = 1 << 16
	maxClockSkew     = time.Hour
)

// Config configures a Store. The zero value of each field other than Addrs
// means the default written on it; Validate rejects the rest.
type Config struct {
	// Addrs are the servers, host:port: one standalone server, or any
	// nodes of a cluster (the rest are discovered). Required, at most 1024.
	Addrs []string

	// Mode is TopologyAuto (default), TopologyStandalone, TopologyCluster or
	// TopologySentinel.
	Mode Topology

	// SentinelMaster is the name of the master set the sentinels watch
	// (their "sentinel monitor NAME ..."); required with TopologySentinel, and
	// only with it.
	SentinelMaster string
	// SentinelUsername and SentinelPassword authenticate the connections
	// to the sentinels (Username and Password are the master's). Empty: no
	// authentication.
	SentinelUsername, SentinelPassword string
	// SentinelTLS, when not nil, wraps the connections to the sentinels in
	// TLS with this configuration; nil: the same as TLS (as
	// envoyproxy/ratelimit's REDIS_TLS applies to its sentinels too).
	// ServerName defaults, as TLS's, to each address's host: a sentinel's
	// in Addrs, and the master's as the sentinels report it (an IP address
	// unless they announce hostnames).
	SentinelTLS *tls.Config
	// SentinelRefresh is how often the sentinels are asked for the master
	// besides their +switch-master events, so that a missed event cannot
	// keep the Store on a demoted master. Default 2s, at most one hour.
	SentinelRefresh time.Duration

	// Username and Password authenticate every connection (AUTH, or ACL
	// users with Username). Empty: no authentication.
	Username, Password string

	// TLS, when not nil, wraps every connection in TLS with this
	// configuration (cloned; ServerName defaults to each address's host).
	TLS *tls.Config

	// DB is the database a standalone server's connections SELECT. Default
	// 0, the only one a cluster has.
	DB int

	// Timeout bounds one Do call and every op in it, and each GCRA,
	// SlidingLog and DoState call: the pipelined round trip, and the second one a node
	// that forgot a script costs. It is also what a hung server costs a
	// caller. Default 100ms, at most one minute.
	Timeout time.Duration

	// DialTimeout bounds a connection's dial and handshake, and the first
	// connection attempt New makes. Default 1s, at most one minute.
	DialTimeout time.Duration

	// ConnTimeout is how long a connection may wait for a reply before it
	// is closed and dialled again (a hung server or a dead path). Callers
	// never wait longer than Timeout; this bounds how long a connection
	// stays stuck behind a reply that will not come. Default 1s, not less
	// than Timeout, at most one minute.
	ConnTimeout time.Duration

	// ConnsPerNode is the number of pipelined connections to each node,
	// a power of two; concurrent calls share them. Default 2, at most 256.
	ConnsPerNode int

	// BufferBytes is the size of each connection's read buffer and of its
	// write buffer. Default 64 KiB (a batch of 4,096 counter ops is about
	// 400 KiB and simply takes several buffers), between 4 KiB and 16 MiB.
	BufferBytes int

	// FailureLimit is the number of consecutive calls that fail for want of
	// an answer (timeouts, broken or refused connections; not error replies)
	// after which Healthy reports false, until a call is answered. Default
	// 3, at most 1000.
	FailureLimit int

	// ReconnectInterval is how often a Store that could not connect at New
	// tries again, until it connects or is closed. Default 1s, at most one
	// hour.
	ReconnectInterval time.Duration

	// MaxLogEntries is the most entries (one per unit) a sliding log may
	// hold per key: conditional calls never log beyond their Limit, and
	// unconditional ones stop logging at this bound, so a flood of attempts
	// cannot grow a key without limit. Default 100,000, at most 10,000,000.
	MaxLogEntries int

	// ClockSkew is how much longer than their own arithmetic asks a
	// bucket and a log are kept: their TTL is the time to drain (a
	// bucket) or one window (a log) by the clock of the caller that last
	// wrote them, plus ClockSkew, so that a caller whose clock is behind
	// by up to that much still finds the state it must see. Default 1s,
	// at most one hour. (Counters take the TTL of their ops.)
	ClockSkew time.Duration
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	set := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	set(&c.Timeout, DefaultTimeout)
	set(&c.DialTimeout, DefaultDialTimeout)
	set(&c.ConnTimeout, DefaultConnTimeout)
	set(&c.ReconnectInterval, DefaultReconnectInterval)
	set(&c.ClockSkew, DefaultClockSkew)
	set(&c.SentinelRefresh, DefaultSentinelRefresh)
	if c.ConnsPerNode == 0 {
		c.ConnsPerNode = DefaultConnsPerNode
	}
	if c.BufferBytes == 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.FailureLimit == 0 {
		c.FailureLimit = DefaultFailureLimit
	}
	if c.MaxLogEntries == 0 {
		c.MaxLogEntries = DefaultMaxLogEntries
	}
	return c
}

// Validate returns every problem with c, each naming the field and the bad
// value, joined; nil when New would accept c.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case len(c.Addrs) == 0:
		bad("Addrs: empty: want at least one host:port")
	case len(c.Addrs) > maxAddrs:
		bad("Addrs: %d addresses: want at most %d", len(c.Addrs), maxAddrs)
	}
	for i, a := range c.Addrs {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			bad("Addrs[%d]: %q: want host:port", i, a)
		}
	}
	switch c.Mode {
	case TopologyAuto, TopologyCluster:
	case TopologyStandalone:
		if len(c.Addrs) > 1 {
			bad("Mode: %q with %d addresses: a standalone server has one (put a proxy in front of several)", c.Mode, len(c.Addrs))
		}
	case TopologySentinel:
		if c.SentinelMaster == "" {
			bad("SentinelMaster: empty: mode %q needs the name of the master set the sentinels watch", c.Mode)
		}
	default:
		bad("Mode: %q: want %q (auto), %q, %q or %q", c.Mode, TopologyAuto, TopologyStandalone, TopologyCluster, TopologySentinel)
	}
	if c.Mode != TopologySentinel && (c.SentinelMaster != "" || c.SentinelUsername != "" || c.SentinelPassword != "" || c.SentinelTLS != nil) {
		bad("SentinelMaster: %q (or another Sentinel field) set with mode %q: only mode %q has sentinels", c.SentinelMaster, c.Mode, TopologySentinel)
	}
	if c.DB < 0 || c.DB > maxDB {
		bad("DB: %d: want 0 to %d", c.DB, maxDB)
	}
	if c.DB != 0 && c.Mode == TopologyCluster {
		bad("DB: %d: a cluster has only database 0", c.DB)
	}
	dur := func(name string, d time.Duration, limit time.Duration) {
		if d < 0 || d > limit {
			bad("%s: %v: want 0 (default) or up to %v", name, d, limit)
		}
	}
	dur("Timeout", c.Timeout, maxTimeout)
	dur("DialTimeout", c.DialTimeout, maxTimeout)
	dur("ConnTimeout", c.ConnTimeout, maxTimeout)
	dur("ReconnectInterval", c.ReconnectInterval, maxReconnect)
	dur("ClockSkew", c.ClockSkew, maxClockSkew)
	dur("SentinelRefresh", c.SentinelRefresh, maxReconnect)
	if d := c.withDefaults(); c.ConnTimeout > 0 && d.ConnTimeout < d.Timeout {
		bad("ConnTimeout: %v: less than Timeout (%v)", c.ConnTimeout, d.Timeout)
	}
	if n := c.ConnsPerNode; n < 0 || n > maxConnsPerNode || n&(n-1) != 0 {
		bad("ConnsPerNode: %d: want 0 (default) or a power of two up to %d", n, maxConnsPerNode)
	}
	if n := c.BufferBytes; n != 0 && (n < minBufferBytes || n > maxBufferBytes) {
		bad("BufferBytes: %d: want 0 (default) or %d to %d", n, minBufferBytes, maxBufferBytes)
	}
	if n := c.FailureLimit; n < 0 || n > maxFailureLimit {
		bad("FailureLimit: %d: want 0 (default) or up to %d", n, maxFailureLimit)
	}
	if n := c.MaxLogEntries; n < 0 || n > maxMaxLogEntries {
		bad("MaxLogEntries: %d: want 0 (default) or up to %d", n, maxMaxLogEntries)
	}
	if len(errs) > 0 {
		return fmt.Errorf("redisstore: config: %w", errors.Join(errs...))
	}
	return nil
}
