// Package envoyconf reads envoyproxy/ratelimit's configuration files and
// answers which rate limit applies to a descriptor, exactly as ratelimit
// does, so that poplimit can serve Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// files operators already have. SERVICE.md, beside this file, writes down
// the service semantics a gRPC front end must follow around it.
//
// # The format
//
// A file is one domain (envoyproxy/ratelimit README, "Configuration"):
//
//	domain: messaging                # required, unique across files
//	descriptors:
//	  - key: message_type            # required
//	    value: marketing             # optional; "*" anywhere is a wildcard
//	    descriptors:                 # nested levels (optional)
//	      - key: to_number
//	        rate_limit:              # optional: no block and no children allows everything
//	          unit: day              # second, minute, hour, day, week, month (30 d), year (365 d)
//	          requests_per_unit: 5   # 0 to 4294967295; 0 (or missing) refuses everything
//	          name: marketing        # optional, for replaces
//	          replaces: [{name: x}]  # optional: drop the limit named x when both match
//	          unlimited: false       # true: answer OK without counting (no unit then)
//	        shadow_mode: false       # count, never refuse
//	        quota_mode: false        # see SERVICE.md
//	        detailed_metric: false   # stats keys carry the request's values
//	        value_to_metric: false   # this level's stats key part carries the request's value
//	        share_threshold: false   # wildcard values share one counter
//	        metadata: {...}          # returned as dynamic metadata (SERVICE.md)
//
// The loader reads it as ratelimit does (src/config/config_impl.go). Keys
// ratelimit does not know anywhere are rejected; a key it knows in a place
// where it means nothing (shadow_mode inside rate_limit) is ignored, as
// ratelimit ignores it, and reported by Config.Warnings. Lists must hold
// mappings and floats are refused outside metadata, as ratelimit's key check
// refuses them. YAML is read with ratelimit's YAML 1.1 habits where a file
// can tell: yes/no/on/off are booleans, merge keys (<<) apply in order, a
// key written twice keeps its last value (with a warning), only the first
// document counts. Errors name the file, the line and column, the field's
// path and the reason:
//
//	a.yaml:7:15: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight' (want ...)
//
// Load reports every problem of every file at once, and never panics.
// ratelimit's README describes a few things its code does otherwise; the
// code wins here: wildcards may sit anywhere in a value (or a key), and
// with share_threshold and value_to_metric the stats key keeps the whole
// wildcard ("route_api/*"), not its prefix.
//
// # poplimit extensions
//
// Inside a rate_limit block, all optional; without them a limit behaves as
// in ratelimit (a fixed window, every hit counted, the store incremented
// before the answer):
//
//	rate_limit:
//	  requests_per_unit: 100
//	  window: 90s              # instead of unit: any whole-millisecond duration, 1ms to 366d ("1d12h")
//	  algorithm: fixed_window  # fixed_window (default), sliding_window, token_bucket, leaky_bucket, sliding_log
//	  burst: 20                # token_bucket and leaky_bucket only; default requests_per_unit
//	  mode: sync               # sync (default): count in the store before answering; async: local view
//	  action: count            # count (default): every hit counts, refused while over;
//	                           # throttle: only admitted hits count; block: refused for timeout once over
//	  timeout: 10m             # block only; default the window
//	  fail: open               # open (default) or closed, when the store cannot answer
//
// A file switches every limit it holds with one top-level block, which its
// limits may still override one by one:
//
//	poplimit: {algorithm: sliding_window}   # also mode, action, fail
//
// Windows of every algorithm are aligned as ratelimit aligns them: a window
// starts at a whole multiple of its length since the Unix epoch (unix time
// divided by the unit's seconds, times them; src/limiter/cache_key.go), so
// every server agrees on them without talking. ratelimit rejects files with
// these keys; they are poplimit's only.
//
// # Matching
//
// Config.Lookup returns a Match: the Limit (with every extension resolved)
// and what the request's keys need. Match.AppendCounterKey gives the
// counter's identity as ratelimit's cache key names it, per request value
// unless share_threshold merges them; Match.AppendStatsKey the key ratelimit
// names statistics by; ApplyReplaces applies replaces across one request's
// descriptors. Lookup does not allocate for descriptors of up to 8 entries
// of up to 256 bytes each.
//
// # As poplimit rules
//
// LoadRules (and Config.Rules) turns the files into a *rules.Rules the
// edge's decision core runs: one rule per rate_limit block that is not
// unlimited (named by its FullKey within the rules alphabet, so every edge
// that loads the same files shares the same counters), and seven rules per
// combination of file defaults that count the descriptors carrying their
// own limit. DescriptorsOf returns the rules.Descriptors that maps a
// request's descriptors to those rules and to what Envoy's answer says of
// their limits; the Rules and its index are one value, swapped whole on
// reload. IsEnvoy tells these files from poplimit's own rules files;
// ReadFiles, LoadPath and Stamp read a file or a directory of them, as
// ratelimit reads its runtime directory. The rate limit service itself is
// rls.Service.
//
// # Concurrency
//
// A Config, the Rules built from it and their Index are immutable once
// returned and safe for concurrent use; a reload builds new ones. Nothing
// here starts a goroutine.
package envoyconf
