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
