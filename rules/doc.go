// Package rules reads rate-limit rule files and answers which rules apply
// to a request and under which key.
//
// A rules file (YAML, one document) lists rules. Each has a match (host,
// path prefix, path_case, methods), a key recipe (the client address,
// header, query parameter and cookie parts, joined), what a missing or a
// duplicated key part meets (missing_key, duplicate_key), a kind (rate,
// concurrency, shed), a window.Policy (limit, window, burst, algorithm,
// action, timeout, mode, failure policy, lease), a cost (fixed, or read
// from a header within max_cost) and tiers, whose limits an overrides file
// assigns to keys. docs/CONFIGURATION.md documents every field with its
// default.
//
// ParseRules validates a whole file and reports every bad field with its
// path and value (e.g. "rules[2].limit: must be between 1 and 4294967295
// (got 0)") in one error that wraps ErrInvalid; a file with any error
// yields no rules, so a reload never applies half a file. Unknown fields,
// numbers that are not whole (1.5, 1e3, "100", YAML's octal 010), values
// out of range, a cost no request could ever be admitted at, and a second
// YAML document are errors. ParseOverrides does the same for an overrides
// file. Neither panics on any input. ReadFile reads a file within a bound
// (DefaultMaxFileBytes), refusing a larger one unread, and ParseRules
// refuses a file of more than MaxRules rules from the length of its list
// before it decodes them: what a file costs is bounded by its size, and
// what it yields by MaxRules rules of MaxKeyParts key parts each.
//
// Rule.Matches compares the host without case, port or one trailing dot,
// the path prefix as bytes (under ASCII case folding with path_case:
// insensitive), and lets GET cover HEAD. Rule.Hash names a key's counters:
// the 64-bit hash of the key and the rule's Seed, which mixes in its name,
// window, algorithm and kind, so a reload that changes any of them starts
// the rule on fresh counters; client keys are never stored.
//
// Parsed Rules are immutable and safe for concurrent use; a reload builds
// new ones. Rule.Matches and Rules.LimitFor allocate nothing.
//
// It does not read requests or build keys from them (package decision
// does, resolving client addresses with package clientaddr), run any
// algorithm (package window), or read envoyproxy/ratelimit's files
// (package envoyconf, whose rules it represents with Descriptors).
package rules
