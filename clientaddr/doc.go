// Package clientaddr resolves the client address of a request that may
// have come through trusted proxies.
//
// A request's client is its TCP peer unless the peer is in the trusted
// networks. Then the client-IP header (e.g. CF-Connecting-IP), when
// configured and parseable, names it; otherwise the forwarding header
// does: X-Forwarded-For, or RFC 7239's Forwarded. Every line of it counts
// (RFC 9110 §5.3 makes several lines one comma-joined list), and its hops
// are walked from the right through trusted addresses: the first
// untrusted hop is the client, and a malformed, obfuscated or "unknown"
// hop stops the walk at the last trusted address. So no bytes a client
// writes can put a key left of the rightmost hop a trusted proxy wrote.
//
// Forwarded is parsed with RFC 9110's token and quoted-string rules; an
// element that does not parse ends at the next comma and is one
// malformed hop, so a client's broken element (a quote left open) cannot
// swallow the element a proxy joined to its line.
//
// Hops keeps the rightmost 64 hops of a request, slices of the header's
// own bytes; Resolver holds the configuration. Neither allocates on the
// request path. Reading the header lines out of a request is the front
// end's job (Resolver.Classify names them); Resolver.FromHeader does it
// for net/http.
package clientaddr
