// Package httpedge is the fasthttp front end of a poplimit edge: a Server
// that turns each HTTP request into a decision.Request, asks the core, and
// answers.
//
// In decision mode (Envoy's ext_authz HTTP filter, nginx auth_request,
// Caddy forward_auth, HAProxy) it answers 200 or 429 itself, with the
// quota fields, and serves POST /_poplimit/decide to callers holding its
// bearer token. In proxy mode it forwards admitted requests to its
// upstreams as RFC 9110 has a proxy behave, streaming bodies both ways,
// and adds the quota fields to the upstream's response. It serves TLS
// (reloaded when the files change), bounds what a client may cost it
// (head and body sizes, connections per client, timeouts) and resolves
// client addresses from trusted proxies (package clientaddr).
//
// A Server never keeps a *fasthttp.RequestCtx or its byte slices after its
// handler returns, and its request path allocates nothing (but to hold the
// start of a streamed chunked body for a rule keyed by the body, see
// holdBody). Rule reloading is its owner's (package edge): CheckRules is
// told of new rules.
package httpedge
