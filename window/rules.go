package window

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.yaml.in/yaml/v3"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm uint8

// The algorithms a rule can name. SlidingWindowCounter and FixedWindowCounter
// run over the shared Store and hold across the fleet; the others keep their
// state on each edge (a per-edge limit), as their state does not fit an
// increment-only counter.
const (
	SlidingWindowCounter Algorithm = iota // "sliding_window" (default)
	FixedWindowCounter                    // "fixed_window"
	TokenBucketAlgorithm                  // "token_bucket": rate Limit per Window, burst Burst
	LeakyBucketAlgorithm                  // "leaky_bucket": leaks Limit per Window, capacity Burst
	SlidingLogAlgorithm                   // "sliding_log": exact, O(Limit) memory per key
)

var algorithmNames = []string{"sliding_window", "fixed_window", "token_bucket", "leaky_bucket", "sliding_log"}

func (a Algorithm) String() string { return enumName(algorithmNames, int(a)) }

// Shared reports whether the algorithm counts in the shared Store.
func (a Algorithm) Shared() bool { return a <= FixedWindowCounter }

// Action is what a rule does with a key over its limit.
type Action uint8

const (
	// Throttle admits while the estimate of admitted units in the trailing
	// window stays within the limit; only admitted requests are counted, and
	// a refused key is refused until its computed release time.
	Throttle Action = iota
	// Block counts every request and, when the estimated rate of all of
	// them exceeds the limit, blocks the key for the rule's Timeout; blocked
	// requests are still counted.
	Block
)

var actionNames = []string{"throttle", "block"}

func (a Action) String() string { return enumName(actionNames, int(a)) }

// Mode is where a rule's counting happens relative to the request.
type Mode uint8

const (
	// Async decides from the local view and flushes increments in the
	// background: no network on the request path.
	Async Mode = iota
	// Sync increments the shared counter on the request path and decides on
	// the reply: exact, one store round trip per request.
	Sync
)

var modeNames = []string{"async", "sync"}

func (m Mode) String() string { return enumName(modeNames, int(m)) }

// FailPolicy is what a rule decides when the store cannot answer.
type FailPolicy uint8

const (
	FailOpen   FailPolicy = iota // admit (Stripe's and Cloudflare's default)
	FailClosed                   // refuse (logins and other abuse-first rules)
)

var failNames = []string{"open", "closed"}

func (f FailPolicy) String() string { return enumName(failNames, int(f)) }

// Kind is what a rule limits.
type Kind uint8

const (
	// Rate limits requests per window (the default).
	Rate Kind = iota
	// Concurrency limits requests in flight per key across the PoP: a slot
	// is taken when the request is admitted and given back when its
	// response completes; slots of an edge that died expire with their
	// lease. Only the proxy mode sees responses complete.
	Concurrency
	// Shed gives matching routes a priority class for load shedding: when
	// the upstream is overloaded, the lowest classes are refused first with
	// 503. It counts nothing per key.
	Shed
)

var kindNames = []string{"rate", "concurrency", "shed"}

func (k Kind) String() string { return enumName(kindNames, int(k)) }

// Priority is a route's class for load shedding, most important first.
type Priority uint8

const (
	Critical Priority = iota // shed last, with a reserved share of capacity
	High
	Normal // routes under no shed rule
	Low    // shed first
)

var priorityNames = []string{"critical", "high", "normal", "low"}

func (p Priority) String() string { return enumName(priorityNames, int(p)) }

// Shedding configures load shedding for the whole edge: the upstream counts
// as overloaded in proportion to max(in flight ÷ MaxInFlight, latency ÷
// Latency). Low routes are shed from 60 %, normal from 80 %, high from
// 100 % of the share left after Reserved; critical routes only at 100 %.
type Shedding struct {
	MaxInFlight int           // upstream requests in flight at full load; 0 disables shedding
	Latency     time.Duration // upstream latency (moving average) at full load; 0: in flight only
	Reserved    float64       // share of capacity only critical routes may use (default 0.1)
}

// KeySource names where one part of a rule's key comes from.
type KeySource uint8

const (
	KeyIP     KeySource = iota // the client IP (trusted-proxy aware, resolved by the edge)
	KeyHeader                  // a request header
	KeyQuery                   // a query parameter
	KeyCookie                  // a cookie
)

var keySourceNames = []string{"ip", "header", "query", "cookie"}

func (k KeySource) String() string { return enumName(keySourceNames, int(k)) }

// KeyPart is one part of a rule's key recipe.
type KeyPart struct {
	Source KeySource
	Name   string // header, query parameter or cookie name; empty for KeyIP
}

// MissingKey is what a rule does with a request that lacks part of its key.
type MissingKey uint8

const (
	// MissingKeyIP falls back to the client IP alone, so keyless requests
	// are still limited per client, never pooled in one shared bucket.
	MissingKeyIP   MissingKey = iota
	MissingKeySkip            // the rule does not apply to the request
	MissingKeyDeny            // refuse the request (e.g. an API key is required)
)

var missingKeyNames = []string{"ip", "skip", "deny"}

func (m MissingKey) String() string { return enumName(missingKeyNames, int(m)) }

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "unknown(" + strconv.Itoa(i) + ")"
}

// Rule is one parsed, validated rate-limiting rule. Rules are immutable once
// parsed and safe for concurrent use; a reload builds new ones.
type Rule struct {
	Name     string
	Kind     Kind
	Priority Priority      // for Kind Shed
	Lease    time.Duration // for Kind Concurrency: how long a dead edge's slots live

	// Match: every non-empty condition must hold.
	Host       string   // exact host, without port; empty matches any
	PathPrefix string   // empty matches any
	Methods    []string // upper case; empty matches any

	Key        []KeyPart // the key recipe; parts are joined
	MissingKey MissingKey
	// IPv6Prefix is how many leading bits of an IPv6 client address key
	// the rule (default 64: one subscriber holds a whole /64 and can
	// rotate addresses inside it; 128 keys each address).
	IPv6Prefix int

	Limit     uint64        // units per Window (for a token bucket, the refill per Window)
	Window    time.Duration // the period of the limit
	Burst     uint64        // token and leaky bucket capacity; defaults to Limit
	Algorithm Algorithm
	Action    Action
	Timeout   time.Duration // how long Block blocks; defaults to Window
	Mode      Mode
	Fail      FailPolicy
	Shadow    bool // decide and count, never refuse

	Cost       uint64 // units one request costs (default 1)
	CostHeader string // if set, a request's cost is read from this header ...
	MaxCost    uint64 // ... and refused above this bound (default Limit)

	Tiers map[string]uint64 // tier name → limit, chosen by the key's override

	// Index is the rule's position in its Rules; Seed mixes the rule's
	// identity (name, window, algorithm) into key hashes, so a reload that
	// changes a rule's window starts it on fresh counters.
	Index int
	Seed  uint64
	// nameBytes is Name as bytes, for allocation-free event encoding.
	nameBytes []byte
}

// NameBytes returns the rule's name as a byte slice that must not be
// modified; it lives as long as the rule.
func (r *Rule) NameBytes() []byte { return r.nameBytes }

// Matches reports whether a request with this host (without port), method
// and path is under the rule. It does not allocate.
func (r *Rule) Matches(host, method, path []byte) bool {
	if r.Host != "" && !bytesEqualFold(host, r.Host) {
		return false
	}
	if r.PathPrefix != "" && !bytes.HasPrefix(path, []byte(r.PathPrefix)) {
		return false
	}
	if len(r.Methods) == 0 {
		return true
	}
	for _, m := range r.Methods {
		if string(method) == m {
			return true
		}
	}
	return false
}

func bytesEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Hash returns the 64-bit identity of key under the rule: the name of the
// key's counters in the store and in the block cache. Any bytes of any
// length are fine; the key itself is never stored.
func (r *Rule) Hash(key []byte) uint64 {
	return mix64(xxhash.Sum64(key) ^ r.Seed)
}

// mix64 is the splitmix64 finalizer: it spreads the rule seed through every
// bit, so two rules never share a key's hash.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Rules is an immutable snapshot of parsed rules and key overrides, safe for
// concurrent use. A reload builds a new snapshot and swaps it in whole.
type Rules struct {
	Rules []*Rule
	// MatchAll applies every matching rule to a request; otherwise the first
	// matching rule wins.
	MatchAll bool
	// Overrides maps a key (as the rule's recipe builds it) to a tier name.
	Overrides map[string]string
	// Shedding is the edge's load-shedding configuration.
	Shedding Shedding
}

// LimitFor returns the limit of rule r for key: the limit of the key's tier
// when the rule has tiers and the key has an override, else r.Limit. It does
// not allocate.
func (rs *Rules) LimitFor(r *Rule, key []byte) uint64 {
	if len(r.Tiers) == 0 || len(rs.Overrides) == 0 {
		return r.Limit
	}
	tier, ok := rs.Overrides[string(key)]
	if !ok {
		return r.Limit
	}
	if l, ok := r.Tiers[tier]; ok {
		return l
	}
	return r.Limit
}

// Lookup returns the rule named name, or nil.
func (rs *Rules) Lookup(name string) *Rule {
	for _, r := range rs.Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Limits on rule files, so a hostile or broken file costs bounded memory.
const (
	MaxRules       = 1024
	MaxRuleName    = 128
	MaxKeyParts    = 8
	maxWindow      = 366 * 24 * time.Hour
	maxLimit       = 1 << 32 // counters are 32-bit in the Limiter's local view
	maxOverrideKey = 1024
)

// ruleFile is the YAML form of a rules file.
type ruleFile struct {
	Match    string       `yaml:"match"` // "first" (default) or "all"
	Rules    []ruleYAML   `yaml:"rules"`
	Shedding sheddingYAML `yaml:"shedding"`
}

type sheddingYAML struct {
	MaxInFlight int      `yaml:"max_in_flight"`
	Latency     string   `yaml:"latency"`
	Reserved    *float64 `yaml:"reserved"`
}

type ruleYAML struct {
	Name       string            `yaml:"name"`
	Kind       string            `yaml:"kind"`
	Priority   string            `yaml:"priority"`
	Lease      string            `yaml:"lease"`
	Host       string            `yaml:"host"`
	PathPrefix string            `yaml:"path_prefix"`
	Methods    []string          `yaml:"methods"`
	Key        []string          `yaml:"key"`
	MissingKey string            `yaml:"missing_key"`
	IPv6Prefix *int              `yaml:"ipv6_prefix"`
	Limit      *int64            `yaml:"limit"`
	Window     string            `yaml:"window"`
	Burst      *int64            `yaml:"burst"`
	Algorithm  string            `yaml:"algorithm"`
	Action     string            `yaml:"action"`
	Timeout    string            `yaml:"timeout"`
	Mode       string            `yaml:"mode"`
	Fail       string            `yaml:"fail"`
	Shadow     bool              `yaml:"shadow"`
	Cost       *int64            `yaml:"cost"`
	CostHeader string            `yaml:"cost_header"`
	MaxCost    *int64            `yaml:"max_cost"`
	Tiers      map[string]*int64 `yaml:"tiers"`
}

// FieldError is one problem with one field of a configuration file.
type FieldError struct {
	Path   string // e.g. "rules[2].limit"
	Value  string // the offending value, quoted as found
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return e.Path + ": " + e.Reason
	}
	return e.Path + ": " + e.Reason + " (got " + e.Value + ")"
}

// ErrInvalid is wrapped by every error of ParseRules and ParseOverrides about
// the content of a file.
var ErrInvalid = errors.New("invalid configuration")

// ParseRules parses and validates a YAML rules file. It reports every
// invalid field, each with its path and the bad value, joined in one error
// that wraps ErrInvalid; it never panics on any input.
func ParseRules(data []byte) (*Rules, error) {
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("window: rules: %w: %v", ErrInvalid, err)
	}
	var errs []error
	bad := func(path, value, reason string) {
		errs = append(errs, &FieldError{Path: path, Value: value, Reason: reason})
	}
	rs := &Rules{}
	switch f.Match {
	case "", "first":
	case "all":
		rs.MatchAll = true
	default:
		bad("match", strconv.Quote(f.Match), `must be "first" or "all"`)
	}
	rs.Shedding = Shedding{MaxInFlight: f.Shedding.MaxInFlight, Reserved: 0.1}
	if f.Shedding.MaxInFlight < 0 || f.Shedding.MaxInFlight > 1<<24 {
		bad("shedding.max_in_flight", strconv.Itoa(f.Shedding.MaxInFlight), "must be between 0 (off) and 16777216")
	}
	if f.Shedding.Latency != "" {
		if d, err := ParseDuration(f.Shedding.Latency); err != nil || d <= 0 || d > time.Hour {
			bad("shedding.latency", strconv.Quote(f.Shedding.Latency), "must be a positive duration of at most 1h")
		} else {
			rs.Shedding.Latency = d
		}
	}
	if r := f.Shedding.Reserved; r != nil {
		if *r < 0 || *r >= 1 {
			bad("shedding.reserved", strconv.FormatFloat(*r, 'g', -1, 64), "must be in [0, 1)")
		} else {
			rs.Shedding.Reserved = *r
		}
	}
	if len(f.Rules) == 0 {
		bad("rules", "", "at least one rule is required")
	}
	if len(f.Rules) > MaxRules {
		bad("rules", strconv.Itoa(len(f.Rules)), "at most "+strconv.Itoa(MaxRules)+" rules")
		f.Rules = f.Rules[:MaxRules]
	}
	names := make(map[string]int)
	for i, y := range f.Rules {
		p := "rules[" + strconv.Itoa(i) + "]"
		r := parseRule(y, p, bad)
		if r == nil {
			continue
		}
		if j, dup := names[r.Name]; dup {
			bad(p+".name", strconv.Quote(r.Name), "duplicates rules["+strconv.Itoa(j)+"]")
			continue
		}
		names[r.Name] = i
		r.Index = len(rs.Rules)
		rs.Rules = append(rs.Rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("window: rules: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	return rs, nil
}

func parseRule(y ruleYAML, p string, bad func(path, value, reason string)) *Rule {
	n0 := 0
	countingBad := func(path, value, reason string) { n0++; bad(path, value, reason) }
	b := countingBad
	r := &Rule{Name: y.Name, Host: strings.ToLower(y.Host), PathPrefix: y.PathPrefix, Shadow: y.Shadow, CostHeader: y.CostHeader}
	switch {
	case y.Name == "":
		b(p+".name", "", "is required")
	case len(y.Name) > MaxRuleName:
		b(p+".name", strconv.Itoa(len(y.Name))+" bytes", "at most "+strconv.Itoa(MaxRuleName)+" bytes")
	case !printableName(y.Name):
		b(p+".name", strconv.Quote(y.Name), "only letters, digits and -_.:/ are allowed")
	}
	if y.PathPrefix != "" && y.PathPrefix[0] != '/' {
		b(p+".path_prefix", strconv.Quote(y.PathPrefix), `must start with "/"`)
	}
	for j, m := range y.Methods {
		u := strings.ToUpper(m)
		if u == "" || strings.IndexFunc(u, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
			b(p+".methods["+strconv.Itoa(j)+"]", strconv.Quote(m), "is not an HTTP method")
		}
		r.Methods = append(r.Methods, u)
	}
	// Key recipe.
	if len(y.Key) == 0 {
		r.Key = []KeyPart{{Source: KeyIP}}
	}
	if len(y.Key) > MaxKeyParts {
		b(p+".key", strconv.Itoa(len(y.Key))+" parts", "at most "+strconv.Itoa(MaxKeyParts)+" parts")
	}
	for j, k := range y.Key {
		kp, err := parseKeyPart(k)
		if err != "" {
			b(p+".key["+strconv.Itoa(j)+"]", strconv.Quote(k), err)
			continue
		}
		r.Key = append(r.Key, kp)
	}
	r.IPv6Prefix = 64
	if y.IPv6Prefix != nil {
		if n := *y.IPv6Prefix; n < 8 || n > 128 {
			b(p+".ipv6_prefix", strconv.Itoa(n), "must be between 8 and 128 bits")
		} else {
			r.IPv6Prefix = n
		}
	}
	var ok bool
	if r.Kind, ok = parseEnum[Kind](kindNames, y.Kind); !ok {
		b(p+".kind", strconv.Quote(y.Kind), "must be one of "+strings.Join(kindNames, ", "))
	}
	r.Priority = Normal
	if y.Priority != "" {
		if r.Priority, ok = parseEnum[Priority](priorityNames, y.Priority); !ok {
			b(p+".priority", strconv.Quote(y.Priority), "must be one of "+strings.Join(priorityNames, ", "))
		}
		if r.Kind != Shed {
			b(p+".priority", strconv.Quote(y.Priority), "applies only to kind: shed")
		}
	}
	if r.Kind == Shed {
		// A shed rule only classes routes: nothing else applies.
		if y.Limit != nil || y.Window != "" || len(y.Key) > 0 {
			b(p, "", "a shed rule takes only name, match and priority")
		}
		if n0 > 0 {
			return nil
		}
		r.Limit, r.Window, r.Cost, r.Key = 1, time.Second, 1, []KeyPart{{Source: KeyIP}}
		r.nameBytes = []byte(r.Name)
		return r
	}
	r.Lease = 30 * time.Second
	if y.Lease != "" {
		if d, err := ParseDuration(y.Lease); err != nil || d < time.Second || d > 24*time.Hour || d%time.Millisecond != 0 {
			b(p+".lease", strconv.Quote(y.Lease), "must be a duration of whole milliseconds between 1s and 24h")
		} else {
			r.Lease = d
		}
		if r.Kind != Concurrency {
			b(p+".lease", strconv.Quote(y.Lease), "applies only to kind: concurrency")
		}
	}
	if r.Kind == Concurrency && y.Window == "" {
		y.Window = r.Lease.String() // slots are counted per lease period
	}
	if r.MissingKey, ok = parseEnum[MissingKey](missingKeyNames, y.MissingKey); !ok {
		b(p+".missing_key", strconv.Quote(y.MissingKey), "must be one of "+strings.Join(missingKeyNames, ", "))
	}
	if r.Algorithm, ok = parseEnum[Algorithm](algorithmNames, y.Algorithm); !ok {
		b(p+".algorithm", strconv.Quote(y.Algorithm), "must be one of "+strings.Join(algorithmNames, ", "))
	}
	if r.Action, ok = parseEnum[Action](actionNames, y.Action); !ok {
		b(p+".action", strconv.Quote(y.Action), "must be one of "+strings.Join(actionNames, ", "))
	}
	if r.Mode, ok = parseEnum[Mode](modeNames, y.Mode); !ok {
		b(p+".mode", strconv.Quote(y.Mode), "must be one of "+strings.Join(modeNames, ", "))
	}
	if r.Fail, ok = parseEnum[FailPolicy](failNames, y.Fail); !ok {
		b(p+".fail", strconv.Quote(y.Fail), "must be one of "+strings.Join(failNames, ", "))
	}
	// Quantities.
	if y.Limit == nil {
		b(p+".limit", "", "is required")
	} else if *y.Limit <= 0 || *y.Limit >= maxLimit {
		b(p+".limit", strconv.FormatInt(*y.Limit, 10), "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
	} else {
		r.Limit = uint64(*y.Limit)
	}
	if y.Window == "" {
		b(p+".window", "", "is required")
	} else if d, err := ParseDuration(y.Window); err != nil || d <= 0 || d > maxWindow || d%time.Millisecond != 0 {
		b(p+".window", strconv.Quote(y.Window), "must be a duration of whole milliseconds between 1ms and 366d")
	} else {
		r.Window = d
	}
	r.Burst = r.Limit
	if y.Burst != nil {
		if *y.Burst <= 0 || *y.Burst >= maxLimit {
			b(p+".burst", strconv.FormatInt(*y.Burst, 10), "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
		} else {
			r.Burst = uint64(*y.Burst)
		}
	}
	r.Timeout = r.Window
	if y.Timeout != "" {
		if d, err := ParseDuration(y.Timeout); err != nil || d <= 0 || d > maxWindow {
			b(p+".timeout", strconv.Quote(y.Timeout), "must be a positive duration of at most 366d")
		} else {
			r.Timeout = d
		}
		if r.Action != Block {
			b(p+".timeout", strconv.Quote(y.Timeout), "applies only to action: block")
		}
	}
	switch {
	case n0 > 0:
	case r.Algorithm == TokenBucketAlgorithm:
		if err := (TokenBucket{Rate: int64(r.Limit), Per: r.Window, Burst: int64(r.Burst)}).Validate(); err != nil {
			b(p+".burst", strconv.FormatUint(r.Burst, 10), "does not fit the token bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	case r.Algorithm == LeakyBucketAlgorithm:
		if err := (LeakyBucket{Rate: int64(r.Limit), Per: r.Window, Capacity: int64(r.Burst)}).Validate(); err != nil {
			b(p+".burst", strconv.FormatUint(r.Burst, 10), "does not fit the leaky bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	}
	if r.Kind == Concurrency && (y.Algorithm != "" || y.Action != "" || y.Mode != "" || y.Timeout != "") {
		b(p+".kind", "concurrency", "takes no algorithm, action, mode or timeout")
	}
	if r.Mode == Sync && !r.Algorithm.Shared() {
		b(p+".mode", "sync", "needs a shared algorithm (sliding_window or fixed_window), not "+r.Algorithm.String())
	}
	r.Cost = 1
	if y.Cost != nil {
		if *y.Cost <= 0 || *y.Cost >= maxLimit {
			b(p+".cost", strconv.FormatInt(*y.Cost, 10), "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
		} else {
			r.Cost = uint64(*y.Cost)
		}
	}
	r.MaxCost = r.Limit
	if y.MaxCost != nil {
		if *y.MaxCost <= 0 || *y.MaxCost >= maxLimit {
			b(p+".max_cost", strconv.FormatInt(*y.MaxCost, 10), "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
		} else {
			r.MaxCost = uint64(*y.MaxCost)
		}
		if y.CostHeader == "" {
			b(p+".max_cost", strconv.FormatInt(*y.MaxCost, 10), "applies only with cost_header")
		}
	}
	if y.CostHeader != "" && !IsToken(y.CostHeader) {
		b(p+".cost_header", strconv.Quote(y.CostHeader), "is not a valid header name")
	}
	for tier, l := range y.Tiers {
		tp := p + ".tiers." + tier
		switch {
		case tier == "" || len(tier) > MaxRuleName || !printableName(tier):
			b(p+".tiers", strconv.Quote(tier), "tier names are 1 to 128 letters, digits and -_.:/")
		case l == nil || *l <= 0 || *l >= maxLimit:
			v := "null"
			if l != nil {
				v = strconv.FormatInt(*l, 10)
			}
			b(tp, v, "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
		default:
			if r.Tiers == nil {
				r.Tiers = make(map[string]uint64, len(y.Tiers))
			}
			r.Tiers[tier] = uint64(*l)
		}
	}
	if n0 > 0 {
		return nil
	}
	r.nameBytes = []byte(r.Name)
	r.Seed = xxhash.Sum64String(r.Name + "\x00" + r.Window.String() + "\x00" + r.Algorithm.String() + "\x00" + r.Kind.String())
	return r
}

func parseEnum[T ~uint8](names []string, s string) (T, bool) {
	if s == "" {
		return 0, true
	}
	for i, n := range names {
		if n == s {
			return T(i), true
		}
	}
	return 0, false
}

func parseKeyPart(s string) (KeyPart, string) {
	src, name, hasName := strings.Cut(s, ":")
	switch src {
	case "ip":
		if hasName {
			return KeyPart{}, `"ip" takes no name`
		}
		return KeyPart{Source: KeyIP}, ""
	case "header", "query", "cookie":
		if !hasName || name == "" {
			return KeyPart{}, `needs a name, as in "` + src + `:NAME"`
		}
		if !IsToken(name) {
			return KeyPart{}, "name is not a valid token"
		}
		k := KeyPart{Name: name}
		switch src {
		case "header":
			k.Source = KeyHeader
		case "query":
			k.Source = KeyQuery
		default:
			k.Source = KeyCookie
		}
		return k, ""
	}
	return KeyPart{}, `must be "ip", "header:NAME", "query:NAME" or "cookie:NAME"`
}

// IsToken reports whether s is an RFC 9110 token (a header name, say) of
// at most 256 bytes.
func IsToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func printableName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:/", c) >= 0) {
			return false
		}
	}
	return true
}

// ParseDuration is time.ParseDuration that also takes whole days ("1d").
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("window: duration %q: %w", s, err)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("window: %w", err)
	}
	return d, nil
}

// ParseOverrides parses a YAML overrides file, a map from key to tier name:
//
//	overrides:
//	  "api-key-123": pro
//
// Every bad entry is reported; the error wraps ErrInvalid.
func ParseOverrides(data []byte) (map[string]string, error) {
	var f struct {
		Overrides map[string]string `yaml:"overrides"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("window: overrides: %w: %v", ErrInvalid, err)
	}
	var errs []error
	for k, t := range f.Overrides {
		switch {
		case k == "" || len(k) > maxOverrideKey:
			errs = append(errs, &FieldError{Path: "overrides", Value: strconv.Itoa(len(k)) + " bytes", Reason: "keys are 1 to 1024 bytes"})
		case t == "" || len(t) > MaxRuleName || !printableName(t):
			errs = append(errs, &FieldError{Path: "overrides." + strconv.Quote(k), Value: strconv.Quote(t), Reason: "tier names are 1 to 128 letters, digits and -_.:/"})
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("window: overrides: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	if f.Overrides == nil {
		f.Overrides = map[string]string{}
	}
	return f.Overrides, nil
}
