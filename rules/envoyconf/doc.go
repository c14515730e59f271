// Package envoyconf reads envoyproxy/ratelimit's configuration files and
// answers which rate limit applies to a descriptor, exactly as ratelimit
// does, so that poplimit serves Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// files operators already have. SERVICE.md, beside this file, states the
// service semantics a gRPC front end must follow around it; the front end
// is rls.Service.
//
// A file is one domain of nested descriptors with optional rate_limit
// blocks, read as ratelimit reads it (its src/config/config_impl.go):
// its keys and checks, its YAML 1.1 habits (yes/no booleans, merge keys, a
// key written twice keeps its last value, only the first document
// counts), wildcards anywhere in a value, replaces, unlimited,
// shadow_mode, quota_mode, share_threshold and the stats keys. Where
// ratelimit's README and its code differ, the code wins. poplimit's
// extensions (window, algorithm, burst, mode, action, timeout, fail, and a
// file-level poplimit block of defaults) are optional; without them a
// limit is ratelimit's fixed window counting every hit.
// docs/CONFIGURATION.md lists the format and the extensions.
//
// Load and Parse report every problem of every file at once, each naming
// the file, line, column, field path and reason, and never panic; keys
// ratelimit ignores where they stand are reported by Config.Warnings.
// Config.Lookup returns the Match of a descriptor: its Limit, every
// extension resolved, and the keys ratelimit names it by (its counter,
// AppendCounterKey; ratelimit's cache key, AppendCacheKey; its stats key,
// AppendStatsKey). Lookup allocates nothing for descriptors of up to 8
// entries of up to 256 bytes each.
//
// LoadRules (and Config.Rules) turns the files into a *rules.Rules the
// decision core runs: one rule per counted limit, named by its FullKey so
// that every edge loading the same files shares the same counters, and
// the rules that count descriptors carrying their own limit;
// DescriptorsOf maps a request's descriptors to them. Windows start at
// whole multiples of their length since the Unix epoch, as ratelimit's
// cache keys align them. IsEnvoy tells these files from poplimit's own;
// ReadFiles, LoadPath and Stamp read a file or a directory of them, each
// file within Loader.MaxFileBytes (refused unread beyond it); Stamp and
// StampOf hash the files' bytes, so a watcher sees any change, and
// Loader.RulesOf loads the very bytes a watcher stamped.
//
// A Config, the Rules built from it and their Index are immutable once
// returned and safe for concurrent use; a reload builds new ones. Nothing
// here starts a goroutine.
package envoyconf
