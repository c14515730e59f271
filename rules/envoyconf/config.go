package envoyconf

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
)

// Unit is a rate limit's unit of time. Its values are the numbers of the
// protobuf enum envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit,
// so a front end converts it with a plain integer conversion. The zero value
// is UnitUnknown.
type Unit uint8

// The units envoyproxy/ratelimit accepts (src/config/config_impl.go looks
// the upper-cased name up in the protobuf enum; src/utils/utilities.go
// UnitToDivider gives their lengths).
const (
	UnitUnknown Unit = 0 // no unit: unlimited limits, and windows that are not a unit
	Second      Unit = 1 // 1 s
	Minute      Unit = 2 // 60 s
	Hour        Unit = 3 // 3,600 s
	Day         Unit = 4 // 86,400 s
	Month       Unit = 5 // 30 days: 2,592,000 s
	Year        Unit = 6 // 365 days: 31,536,000 s
	Week        Unit = 7 // 7 days: 604,800 s
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

var unitSeconds = [...]int64{0, 1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400}

// String returns the unit's name in lower case ("second").
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unit(" + itoa(int64(u)) + ")"
}

// Seconds returns the unit's length in seconds, the divider ratelimit aligns
// windows with; 0 for UnitUnknown and values outside the enum.
func (u Unit) Seconds() int64 {
	if int(u) < len(unitSeconds) {
		return unitSeconds[u]
	}
	return 0
}

// ParseUnit reads a unit name as ratelimit does: the name upper-cased
// (strings.ToUpper) must be one of the enum's names other than UNKNOWN.
func ParseUnit(s string) (Unit, bool) {
	up := strings.ToUpper(s)
	for u := Second; u <= Week; u++ {
		if strings.ToUpper(unitNames[u]) == up {
			return u, true
		}
	}
	return UnitUnknown, false
}

// unitOf returns the unit exactly d long, or UnitUnknown.
func unitOf(d time.Duration) Unit {
	for u := Second; u <= Week; u++ {
		if time.Duration(unitSeconds[u])*time.Second == d {
			return u
		}
	}
	return UnitUnknown
}

// The poplimit extensions algorithm, mode, action and fail take the names
// of poplimit's rules file (package policy) and are parsed into package
// policy's values; only their defaults differ, being what
// envoyproxy/ratelimit does: a fixed window (policy.FixedWindow), counted
// in the store before the answer (policy.Sync), failing open
// (policy.FailOpen), and the action "count", ratelimit's own: every hit is
// counted, refused or not, and a key is refused while its window's count
// exceeds the limit (ratelimit increments before it compares). "count" is
// policy.Block with no Timeout: refused while over, no longer. "throttle"
// admits up to the limit and counts admitted hits only (policy.Throttle);
// "block" counts every hit and, once over, refuses the key for Timeout
// (policy.Block).

// actionNames are the names of the action extension, in the order of
// actionOf's cases.
var actionNames = []string{"count", policy.Throttle.String(), policy.Block.String()}

// actionOf returns the policy action of actionNames[i] and whether it is
// "count" (policy.Block without a timeout).
func actionOf(i int) (a policy.Action, count bool) {
	switch i {
	case 1:
		return policy.Throttle, false
	case 2:
		return policy.Block, false
	}
	return policy.Block, true
}

func enumIndex(names []string, s string) (int, bool) {
	for i, n := range names {
		if n == s {
			return i, true
		}
	}
	return 0, false
}

// Limit is one rate_limit block of a file, with the descriptor flags that
// govern it and every poplimit extension resolved to its value (defaults
// filled in). A Limit is immutable once loaded and safe to share between
// goroutines; a Config's Limits live as long as it does.
type Limit struct {
	Domain string
	// FullKey is the descriptor path ratelimit names the limit by: the
	// domain, then each level's "key" or "key_value", joined by dots
	// ("messaging.message_type_marketing.to_number"). The stats key of one
	// request may differ (Match.AppendStatsKey).
	FullKey  string
	Name     string   // rate_limit.name; empty when unnamed
	Replaces []string // rate_limit.replaces[].name, in file order; never empty strings

	// RequestsPerUnit is the limit, in requests (hits) per Window. 0 is
	// valid and refuses everything (ratelimit: a count after the increment
	// is always above 0).
	RequestsPerUnit uint32
	// Unit is rate_limit.unit; with the window extension it is the unit
	// exactly Window long, or UnitUnknown. UnitUnknown when Unlimited.
	Unit Unit
	// Window is the unit's length (a month is 30 days, a year 365), or the
	// window extension; 0 when Unlimited. Windows are aligned to whole
	// multiples of Window since the Unix epoch, as ratelimit aligns them.
	Window time.Duration

	Unlimited      bool // rate_limit.unlimited: answered OK without counting
	ShadowMode     bool // the descriptor's shadow_mode: counted, never refused
	QuotaMode      bool // the descriptor's quota_mode (see SERVICE.md)
	DetailedMetric bool // the descriptor's detailed_metric (stats keys only)
	// Metadata is the descriptor's metadata, as values that
	// structpb.NewStruct accepts (nil, bool, int64, uint64, float64,
	// string, []any, map[string]any); nil when absent. Read only.
	Metadata map[string]any

	// The poplimit extensions, defaults filled in: ratelimit's behaviour
	// unless the file's poplimit block or the rate_limit says otherwise.
	Algorithm policy.Algorithm // default policy.FixedWindow
	Burst     uint64           // bucket capacity in requests; for buckets, defaults to RequestsPerUnit
	Mode      policy.Mode      // default policy.Sync
	// Action is policy.Throttle, or policy.Block: with a Timeout for the
	// action "block" (its default Window), without one for "count" (the
	// default, ratelimit's: refused while over, no longer).
	Action  policy.Action
	Timeout time.Duration // how long Block refuses once over; 0 for "count"
	Fail    policy.Fail   // default policy.FailOpen
	// Count is the count extension: which responses spend the limit's
	// hits (settled at stream end, see SERVICE.md); zero: every hit.
	Count rules.Count

	File string // the file that defined it
	Line int    // the line of its rate_limit block
}

// WindowStart returns the start of the aligned window that holds now:
// now truncated to a whole multiple of Window since the Unix epoch, in whole
// seconds for whole-second windows (ratelimit: (unix / divider) * divider).
// It returns now for a Limit without a window.
func (l *Limit) WindowStart(now time.Time) time.Time {
	if l.Window <= 0 {
		return now
	}
	if l.Window%time.Second == 0 {
		d := int64(l.Window / time.Second)
		s := now.Unix()
		return time.Unix(floorDiv(s, d)*d, 0)
	}
	d := l.Window.Milliseconds()
	ms := now.UnixMilli()
	return time.UnixMilli(floorDiv(ms, d) * d)
}

// UntilReset returns how long until the aligned window that holds now ends,
// as ratelimit's duration_until_reset computes it for whole-second windows:
// divider − unix mod divider, in whole seconds (1 s to Window). For windows
// of a fraction of a second it is exact to the millisecond. 0 for a Limit
// without a window.
func (l *Limit) UntilReset(now time.Time) time.Duration {
	if l.Window <= 0 {
		return 0
	}
	if l.Window%time.Second == 0 {
		d := int64(l.Window / time.Second)
		return time.Duration(d-floorMod(now.Unix(), d)) * time.Second
	}
	d := l.Window.Milliseconds()
	return time.Duration(d-floorMod(now.UnixMilli(), d)) * time.Millisecond
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// Entry is one key/value pair of a request's descriptor, in the order Envoy
// sent them: the same type as rules.DescriptorEntry, so that a front end
// passes one slice to both.
type Entry = rules.DescriptorEntry

// Config is a loaded set of files: several domains, each a tree of
// descriptors. It is immutable and safe for concurrent use by any number of
// goroutines; a reload builds a new Config. The zero value and a nil *Config
// hold no domain.
type Config struct {
	domains  map[string]*domainTree
	names    []string // sorted
	limits   []*Limit // in load order
	warnings []string
}

// domainTree is one domain: the root of its descriptor tree.
type domainTree struct {
	name     string
	root     node
	file     string       // the first file that defined it
	defaults fileDefaults // that file's poplimit block, for overrides
}

// Domains returns the names of the loaded domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.names...)
}

// HasDomain reports whether the domain is loaded.
func (c *Config) HasDomain(domain string) bool {
	return c != nil && c.domains[domain] != nil
}

// Empty reports whether no domain is loaded (ratelimit reports itself
// unhealthy then, when HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is set).
func (c *Config) Empty() bool { return c == nil || len(c.domains) == 0 }

// Limits returns every rate_limit of every file, in load order (files by
// name, then document order). The Limits are shared; do not modify them.
func (c *Config) Limits() []*Limit {
	if c == nil {
		return nil
	}
	return append([]*Limit(nil), c.limits...)
}

// Warnings returns what the files do that ratelimit accepts but that has no
// effect or is likely a mistake: known keys in a place where they mean
// nothing (ratelimit ignores them too), keys written twice in one mapping
// (the last wins, as in ratelimit), rate limits without requests_per_unit
// (a limit of 0), documents after the first (ignored).
func (c *Config) Warnings() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.warnings...)
}

// Default bounds of a Loader.
const (
	DefaultMaxFileBytes = 4 << 20   // 4 MiB per file
	DefaultMaxNodes     = 1_000_000 // YAML nodes visited per file, aliases expanded
)

// Loader loads files with options; the zero value loads as envoyproxy/ratelimit
// does by default.
type Loader struct {
	// MergeDomains lets several files define one domain, their descriptors
	// merged into one tree (ratelimit's MERGE_DOMAIN_CONFIG=true); a
	// descriptor defined twice is still an error. Default false: a domain
	// in two files is an error.
	MergeDomains bool
	// MaxFileBytes bounds each file's size in bytes. Default (0):
	// DefaultMaxFileBytes.
	MaxFileBytes int
	// MaxNodes bounds the YAML nodes one file may make the loader visit,
	// counting each expansion of an alias. Default (0): DefaultMaxNodes.
	MaxNodes int
}

func (l Loader) validate() error {
	var p problems
	if l.MaxFileBytes < 0 {
		p.add(&FieldError{File: "Loader", Path: "MaxFileBytes", Reason: "must not be negative (got " + itoa(int64(l.MaxFileBytes)) + ")", Err: ErrInvalid})
	}
	if l.MaxNodes < 0 {
		p.add(&FieldError{File: "Loader", Path: "MaxNodes", Reason: "must not be negative (got " + itoa(int64(l.MaxNodes)) + ")", Err: ErrInvalid})
	}
	return p.err()
}

// Parse loads one file. name is used in errors and in Limit.File.
func Parse(name string, data []byte) (*Config, error) {
	return Loader{}.Load(map[string][]byte{name: data})
}

// Load loads a set of files (name → contents) as ratelimit loads its
// runtime directory, with the zero Loader.
func Load(files map[string][]byte) (*Config, error) {
	return Loader{}.Load(files)
}

// Load loads a set of files (name → contents) into one Config. Files are
// read in name order, so errors, warnings and merges are deterministic.
// Every problem of every file is reported, in one *LoadError; no Config is
// returned then. Load never panics, whatever the input.
func (l Loader) Load(files map[string][]byte) (*Config, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	if l.MaxNodes == 0 {
		l.MaxNodes = DefaultMaxNodes
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)

	c := &Config{domains: make(map[string]*domainTree)}
	var p problems
	for _, name := range names {
		fp := &fileParser{name: name, loader: &l, cfg: c, probs: &p, budget: l.MaxNodes, defaults: envoyDefaults}
		fp.parseFile(files[name])
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	for n := range c.domains {
		c.names = append(c.names, n)
	}
	sort.Strings(c.names)
	c.warnings = p.warnings
	return c, nil
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
