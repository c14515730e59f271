package rls

import rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

// Release hands a response of ShouldRateLimit back to the pool, as the
// RLS's gRPC codec does once it has marshaled it: the handler benchmarks
// call it to measure what one request costs in steady state.
func (s *Service) Release(resp *rlspb.RateLimitResponse) { s.release(resp) }
