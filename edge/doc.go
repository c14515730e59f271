// Package edge is a poplimit edge: the decision core that every front end
// calls, the fasthttp server in front of it, and the one assembly (Build)
// that makes a whole edge from Options.
//
// # The request path
//
// A front end (the fasthttp server in decision or proxy mode, the JSON
// endpoint, the offline simulator in package loadtest) turns its request
// into a Request: host, method, path, the client address (resolved from
// trusted proxies by the front end, see Config.TrustedProxies), field
// lookups (Fields) and the time. Core.Decide then runs every step, once,
// for all of them:
//
//	shed?  ─► match rules in order ─► key recipe (missing_key: ip/skip/deny)
//	       ─► cost (fixed, or a header within bounds)
//	       ─► block cache hit? ─► refused from memory, no store, no network
//	       ─► window.Limiter (rate) or window.Slots (concurrency)
//	       ─► verdict, metrics, one decision event per rule decided
//
// The first matching rule decides (or, with match: all, every matching
// rule in order, the first refusal answering). Shadow rules are decided and
// counted but never refuse. A refused key is put in the block cache until
// its exact release time, so its next requests never reach the limiter.
//
// # What a verdict is
//
// Decide returns a *Verdict from a pool: an Outcome (Allowed, Limited,
// Denied, Shed), the Quota of the rule that answers (for an admitted
// request the matching rule with the least remaining; for a refusal the
// refusing rule) with its limit, remaining units, reset and release times,
// and whether the block cache or a store failure decided. The front end
// writes its own answer from it (status and the RateLimit-Policy,
// RateLimit, X-RateLimit-* and Retry-After fields of
// draft-ietf-httpapi-ratelimit-headers, with an RFC 9457 problem body on
// refusal) and hands the Verdict back with Finish, after the response
// completed when the request was Tracked: Finish gives back the
// concurrency slots the request holds.
//
// # When the store fails
//
// Every rule has a failure policy: fail open (the default, Stripe's and
// Cloudflare's practice) admits when the store cannot answer, fail closed
// (logins) refuses. Async decisions never wait on the store; sync
// decisions and concurrency slots wait at most the store timeout. Every
// fallback is counted (poplimit_edge_requests_total{source="fallback"}),
// and the edge reports unready while the store is down and a rule fails
// closed.
//
// # Who owns what
//
// The fasthttp server never keeps a *fasthttp.RequestCtx or its byte
// slices after its handler returns: a Request's bytes are read during
// Decide only, and the Verdict's key is the core's own copy. The core
// reads no clock (the time is Request.Now), allocates nothing on the
// request path, and is safe for concurrent use. Build owns every part it
// builds; Edge.Close stops the server and then closes the producer, block
// cache, slots, limiter (with a last flush) and store client, in that
// order.
package edge
