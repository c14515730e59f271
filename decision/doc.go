// Package decision is the decision core of a poplimit edge: the one path
// every front end (the fasthttp server, Envoy's rate limit service, the
// net/http middleware, the JSON endpoint, the offline simulator) calls to
// decide a request.
//
// A front end turns its request into a Request: host, method, path, the
// client address (resolved by the front end, see package clientaddr),
// field lookups (Fields) and the time. Core.Decide then runs every step
// once:
//
//	shed? ─► match rules in order ─► key recipe (missing_key, duplicate_key)
//	      ─► cost (fixed, or a header within bounds)
//	      ─► block cache hit? ─► refused from memory, no store, no network
//	      ─► window.Limiter (rate) or slots.Slots (concurrency)
//	      ─► Verdict, metrics, one decision event per rule decided
//
// The first matching rule decides (with match: all, every matching rule in
// order, the first refusal answering). Shadow rules are decided and counted
// but never refuse. A refused key stays in the block cache until its exact
// release time.
//
// A Verdict carries an Outcome, the Quota of the rule that answers, and
// renders itself, once for every front end: Status is its HTTP status,
// SetFields writes an admitted request's RateLimit-Policy, RateLimit and
// X-RateLimit-* fields (draft-ietf-httpapi-ratelimit-headers) onto any
// FieldSetter, and Refuse a refusal's fields (Retry-After too, with the
// core's RetryJitter) and its status and RFC 9457 problem body.
// AppendProblem renders the problem body of a request refused before any
// decision; AppendPolicyItem and AppendRateLimitItem the quota fields of a
// front end that counts by its own units (the rate limit service). The front end hands the Verdict back with
// Finish (Done for one it owns) once the request is over: that gives back
// the concurrency slots it holds.
//
// A decision's time is the caller's: Request.Now for Decide, the now
// argument of DecideKey (which decides a key a front end names itself,
// skipping the match, the key recipe and the cost header). This package
// reads no clock to decide, so a replayed log decides as the live edge
// did. Real time enters where it must pass:
//
//   - a decision that asks the store (a sync rule, or an async one near
//     its limit) waits for the reply at most the store timeout, measured
//     on the wall clock;
//   - an async decision that waits for the read of a key new to the edge
//     (window.Config.NewKeyWait) is then made at the later of its time and
//     the limiter's Clock (window.Config.Clock), so that decisions keep the
//     order of their times;
//   - a request admitted by a delay rule is held for its Verdict.Delay
//     before Decide or DecideKey returns (time.Sleep, unless
//     CoreConfig.Wait replaces it; the offline simulator passes a no-op);
//   - BeginUpstream and EndUpstream read the wall clock (time.Now,
//     time.Since) to time the upstream for load shedding.
//
// The core keeps none of a Request's bytes after Decide returns, allocates
// nothing on the request path, and is safe for concurrent use. Every store
// fallback is counted in poplimit_edge_requests_total{source="fallback"}.
package decision
