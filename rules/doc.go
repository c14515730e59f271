// Package rules reads rate-limit rule files and answers which rules apply
// to a request and under which key.
//
// A rules file (YAML) lists rules, each with a match (host, path prefix,
// methods), a key recipe (the client address, headers, query parameters,
// cookies, joined), what to do when the key is missing, and a
// window.Policy: limit, window, algorithm, action, mode, failure policy.
// Rules can have tiers whose limits an overrides file assigns to keys, a
// cost per request (fixed, or read from a header within bounds), and a
// kind: rate (the default), concurrency (requests in flight per key) or
// shed (a priority class for load shedding).
//
// # Matching
//
// A rule matches a request when every condition it sets holds: host (exact,
// under ASCII case folding, without port or a trailing dot), path_prefix
// (a byte prefix of the path; with path_case: insensitive, compared under
// ASCII case folding, for origins that route /LOGIN as /login; the default
// is sensitive) and methods (upper case; GET also covers HEAD, which asks
// for the same resource and which origins route to GET's handler).
//
// # Keys
//
// A key recipe joins parts, each read from the request as follows:
//
//   - ip: the client address (trusted-proxy aware). IPv6 addresses key by
//     their network of ipv6_prefix bits (default 64); an IPv6 address
//     that stands for an IPv4 client keys as that client: 64:ff9b::/96
//     (RFC 6052 NAT64), ::ffff:0:0:0/96 (IPv4-translated) and ::a.b.c.d
//     (IPv4-compatible) as the IPv4 address, 64:ff9b:1::/48 (RFC 8215,
//     local use) as the whole address.
//   - header:NAME: the bytes of the header line, without surrounding
//     blanks; names compare under ASCII case folding.
//   - query:NAME: the query parameter, percent-decoded (a plus is a
//     space), names and values; ?key=%72eal is the key "real".
//   - cookie:NAME: the cookie from every Cookie line, its value as
//     written but for surrounding blanks and one pair of double quotes:
//     not percent-decoded, since origins differ, so sid=%72eal is a key of
//     its own; names compare exactly.
//
// missing_key says what a request lacking a part (or with an empty one)
// meets: ip (the default: the client address alone), skip (the rule does
// not apply), deny (400). duplicate_key says what a request carrying a
// part more than once meets: two header lines of that name, two query
// parameters, two cookies (in one Cookie line or across lines, as HTTP/2
// splits them). refuse (the default) answers 400 and counts it
// (poplimit_edge_bad_requests_total{reason="duplicate_key"}): the edge and
// the origin could read different values, and a client that rotates a
// second value would meet a fresh counter on every request while the
// origin serves the real one. first and last key by that value instead;
// choose the one the origin reads (PHP, Rails and Django read the last
// query parameter; Go's Query().Get and Flask the first). A duplicated part
// outranks a missing one. A cost_header sent twice is refused with 400
// (reason bad_cost) under every rule.
//
// # Numbers and costs
//
// Limits, bursts, costs, tiers, ipv6_prefix and shedding.max_in_flight
// are whole numbers: 1.5, 1e3, "100" and 010 (which YAML reads as octal
// 8) are refused naming the field, as are values out of range however
// large. A rate rule's cost must fit its capacity (the limit, or a
// bucket's burst; plus one for action: delay), every tier's limit must
// fit the cost, and max_cost must not pass the largest capacity of the
// rule and its tiers: otherwise some request is refused on every try. A
// rules file is one YAML document; an empty one has no rule and is
// refused.
//
// ParseRules validates a whole file and reports every bad field with its
// path and value (e.g. "rules[2].limit: must be between 1 and 4294967295
// (got 0)") in one error that wraps ErrInvalid; a file with any error
// yields no rules, so a reload never applies half a file. Parsed Rules are
// immutable and safe for concurrent use; Rule.Matches and Rules.LimitFor
// allocate nothing.
//
// A rule's Seed mixes its identity (name, window, algorithm, kind) into
// the 64-bit key hashes that name its counters, so a reload that changes a
// rule's window starts it on fresh counters.
//
// What it does not do: it reads no request (package edge turns a request
// into host, method, path, client address and field lookups) and runs no
// algorithm (package window does).
package rules
