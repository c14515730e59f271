// Package xds takes envoyproxy/ratelimit's rate limit configuration from
// an xDS management server, as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW: a Subscriber keeps one state-of-the-world
// subscription over the aggregated discovery service to every
// RateLimitConfig (go-control-plane's ratelimit/config/ratelimit/v3,
// TypeURL), sending the node id and metadata; converts each response's
// resources into the envoyproxy/ratelimit files they stand for (Files:
// one file per resource, the same domains and descriptors a file would
// hold), and hands them to an ApplyFunc, which loads them as files are
// loaded and puts them in force whole. A response it applies is ACKed; one
// it refuses is NACKed with the error as the request's error_detail, and
// the configuration in force stays. A failed stream is opened again after
// a jittered exponential backoff, from the version in force; nothing
// changes while the server is away.
//
// The package is the only one that imports go-control-plane's discovery
// client side; the decision core, the middleware and the rate limit service
// do not import it (package edge does, and calls Run). Package xdstest runs
// go-control-plane's own server in-process for tests.
package xds
