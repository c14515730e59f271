// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3,
// gRPC) over the decision core: a Service answers ShouldRateLimit for the
// descriptors of envoyproxy/ratelimit's configuration, as that service
// does (see rules/envoyconf/SERVICE.md for its semantics and where this
// one differs), deciding each descriptor with decision.Core.DecideKey under one rules
// generation per request.
//
// A descriptor whose hits no limit admits in one call is refused without
// counting. Responses are pooled and the request path allocates nothing in
// steady state. Its methods are safe for concurrent use.
package rls
