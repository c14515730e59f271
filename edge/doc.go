// Package edge assembles a whole poplimit edge from Options: the shared
// store's client (memcached shards through package memcachestore, Redis
// through redisstore, or one process's memory), the limiter and its
// concurrency slots (package window), the block cache, the decision-event
// producer (package pipeline), the decision core (package decision), and
// its front ends: the fasthttp server (package httpedge) and, when
// configured, Envoy's rate limit service (package rls). Build is the one
// assembly: cmd/edge, the test harness (edge/edgetest) and programs that
// embed an edge all call it, with defaults written once on Options.
//
// The assembled Edge owns the rule files: it reloads them when they change
// or on SIGHUP, for every front end at once, and a file that does not load
// is rejected whole while the running rules stay. It serves the admin
// listener (/metrics, /healthz, /readyz, optionally /debug/pprof/).
//
// Close stops the front ends and then closes what Build built, in the
// reverse order of building: the slots and the limiter (with a last flush
// of its counts), the producer (flushing its events), the block cache and
// the store client. NewStack is the assembly of the decision core alone,
// which Build and the offline simulator (package loadtest, with a
// simulated clock and stepped loops) share.
package edge
