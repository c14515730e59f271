package rules

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
)

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

// fields validates the fields of one rule: each check reports a bad value
// with the field's path and counts it, so a rule with any bad field is
// dropped whole.
type fields struct {
	path string
	bad  func(path, value, reason string)
	n    int
}

func (f *fields) fail(field, value, reason string) {
	f.n++
	if field == "" {
		f.bad(f.path, value, reason)
		return
	}
	f.bad(f.path+"."+field, value, reason)
}

// amount returns v when it is a whole number within [1, maxLimit), def
// when v is nil (required: a nil v is reported instead).
func (f *fields) amount(field string, v *number, def uint64, required bool) uint64 {
	if v == nil {
		if required {
			f.fail(field, "", "is required")
		}
		return def
	}
	n, why := v.between(1, maxLimit-1)
	if why != "" {
		f.fail(field, v.text, why)
		return def
	}
	return uint64(n)
}

// duration returns s parsed within [lo, hi] (whole milliseconds when
// wholeMillis), or def when s is empty.
func (f *fields) duration(field, s string, def, lo, hi time.Duration, wholeMillis bool, want string) time.Duration {
	if s == "" {
		return def
	}
	d, err := ParseDuration(s)
	if err != nil || d < lo || d > hi || wholeMillis && d%time.Millisecond != 0 {
		f.fail(field, strconv.Quote(s), "must be "+want)
		return def
	}
	return d
}

// only reports a field set on a rule it does not apply to.
func (f *fields) only(set bool, field, value string, applies bool, to string) {
	if set && !applies {
		f.fail(field, value, "applies only to "+to)
	}
}

func enumField[T policy.Algorithm | policy.Action | policy.Mode | policy.Fail](f *fields, field, s string) T {
	v, err := policy.Parse[T](s)
	if err != nil {
		f.fail(field, strconv.Quote(s), err.Error())
	}
	return v
}

func parseRule(y ruleYAML, p string, bad func(path, value, reason string)) *Rule {
	f := &fields{path: p, bad: bad}
	r := &Rule{Name: y.Name, Shadow: y.Shadow}
	parseName(f, y.Name)
	parseMatch(f, y, r)
	parseKind(f, y, r)
	if r.Kind == Shed {
		// A shed rule only classes routes: nothing else applies.
		if y.Limit != nil || y.Window != "" || len(y.Key) > 0 || y.DuplicateKey != "" || y.QuerySemi != "" || y.KeyTrim != "" || y.KeyCase != "" || y.Scope != "" || y.Count != nil {
			f.fail("", "", "a shed rule takes only name, match and priority")
		}
		if f.n > 0 {
			return nil
		}
		r.Limit, r.Window, r.Cost, r.Key = 1, time.Second, 1, []KeyPart{{Source: KeyIP}}
		r.finish()
		return r
	}
	parseKey(f, y, r)
	parsePolicy(f, y, r)
	parseCost(f, y, r)
	parseTiers(f, y, r)
	parseScope(f, y, r)
	parseCount(f, y, r)
	if f.n == 0 && r.Kind == Rate {
		checkCost(f, y, r)
	}
	if f.n > 0 {
		return nil
	}
	r.finish()
	return r
}

// finish derives what a parsed rule computes once.
func (r *Rule) finish() {
	r.nameBytes = []byte(r.Name)
	r.Seed = xxhash.Sum64String(r.Name + "\x00" + r.Window.String() + "\x00" + r.Algorithm.String() + "\x00" + r.Kind.String())
}

func parseScope(f *fields, y ruleYAML, r *Rule) {
	var ok bool
	if r.Scope, ok = parseEnum[Scope](scopeNames, y.Scope); !ok {
		f.fail("scope", strconv.Quote(y.Scope), "must be one of "+strings.Join(scopeNames, ", "))
		return
	}
	if r.Scope == ScopeGlobal {
		f.only(true, "scope", strconv.Quote(y.Scope), r.Kind == Rate && r.Algorithm.IsCounter(),
			"rate rules of algorithm sliding_window or fixed_window (other PoPs' counts are window counts)")
	}
}

func parseName(f *fields, name string) {
	switch {
	case name == "":
		f.fail("name", "", "is required")
	case len(name) > MaxRuleName:
		f.fail("name", strconv.Itoa(len(name))+" bytes", "at most "+strconv.Itoa(MaxRuleName)+" bytes")
	case !printableName(name):
		f.fail("name", strconv.Quote(name), "only letters, digits and -_.:/ are allowed")
	}
}

func parseMatch(f *fields, y ruleYAML, r *Rule) {
	// One trailing dot is dropped: a fully qualified name is the same host,
	// and the front ends drop it from requests too.
	r.Host, r.PathPrefix = strings.TrimSuffix(strings.ToLower(y.Host), "."), y.PathPrefix
	if y.PathPrefix != "" && y.PathPrefix[0] != '/' {
		f.fail("path_prefix", strconv.Quote(y.PathPrefix), `must start with "/"`)
	}
	switch y.PathCase {
	case "", "sensitive":
	case "insensitive":
		r.PathFold = true
		f.only(true, "path_case", strconv.Quote(y.PathCase), y.PathPrefix != "", "rules with path_prefix")
	default:
		f.fail("path_case", strconv.Quote(y.PathCase), `must be "sensitive" or "insensitive"`)
	}
	for j, m := range y.Methods {
		u := strings.ToUpper(m)
		if u == "" || strings.IndexFunc(u, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
			f.fail("methods["+strconv.Itoa(j)+"]", strconv.Quote(m), "is not an HTTP method")
		}
		r.Methods = append(r.Methods, u)
	}
}

func parseKind(f *fields, y ruleYAML, r *Rule) {
	var ok bool
	if r.Kind, ok = parseEnum[Kind](kindNames, y.Kind); !ok {
		f.fail("kind", strconv.Quote(y.Kind), "must be one of "+strings.Join(kindNames, ", "))
	}
	r.Priority = Normal
	if y.Priority != "" {
		if r.Priority, ok = parseEnum[Priority](priorityNames, y.Priority); !ok {
			f.fail("priority", strconv.Quote(y.Priority), "must be one of "+strings.Join(priorityNames, ", "))
		}
		f.only(true, "priority", strconv.Quote(y.Priority), r.Kind == Shed, "kind: shed")
	}
}

func parseKey(f *fields, y ruleYAML, r *Rule) {
	if len(y.Key) == 0 {
		r.Key = []KeyPart{{Source: KeyIP}}
	}
	if len(y.Key) > MaxKeyParts {
		f.fail("key", strconv.Itoa(len(y.Key))+" parts", "at most "+strconv.Itoa(MaxKeyParts)+" parts")
	}
	for j, k := range y.Key {
		kp, err := parseKeyPart(k)
		if err != "" {
			f.fail("key["+strconv.Itoa(j)+"]", strconv.Quote(k), err)
			continue
		}
		r.Key = append(r.Key, kp)
	}
	var ok bool
	if r.MissingKey, ok = parseEnum[MissingKey](missingKeyNames, y.MissingKey); !ok {
		f.fail("missing_key", strconv.Quote(y.MissingKey), "must be one of "+strings.Join(missingKeyNames, ", "))
	}
	if r.DuplicateKey, ok = parseEnum[DuplicateKey](duplicateKeyNames, y.DuplicateKey); !ok {
		f.fail("duplicate_key", strconv.Quote(y.DuplicateKey), "must be one of "+strings.Join(duplicateKeyNames, ", "))
	}
	fieldKey := false
	for _, p := range r.Key {
		fieldKey = fieldKey || p.Source != KeyIP
	}
	f.only(y.DuplicateKey != "", "duplicate_key", strconv.Quote(y.DuplicateKey), fieldKey || len(r.Key) < len(y.Key),
		"rules keyed by a header, query parameter or cookie")
	if r.QuerySemicolon, ok = parseEnum[QuerySemicolon](querySemicolonNames, y.QuerySemi); !ok {
		f.fail("query_semicolon", strconv.Quote(y.QuerySemi), "must be one of "+strings.Join(querySemicolonNames, ", "))
	}
	queryKey := false
	for _, p := range r.Key {
		queryKey = queryKey || p.Source == KeyQuery
	}
	f.only(y.QuerySemi != "", "query_semicolon", strconv.Quote(y.QuerySemi), queryKey || len(r.Key) < len(y.Key),
		"rules keyed by a query parameter")
	if r.KeyTrim, ok = parseEnum[KeyTrim](keyTrimNames, y.KeyTrim); !ok {
		f.fail("key_trim", strconv.Quote(y.KeyTrim), "must be one of "+strings.Join(keyTrimNames, ", "))
	}
	f.only(y.KeyTrim != "", "key_trim", strconv.Quote(y.KeyTrim), fieldKey || len(r.Key) < len(y.Key),
		"rules keyed by a header, query parameter or cookie")
	parseKeyCase(f, y, r, fieldKey || len(r.Key) < len(y.Key))
	r.IPv6Prefix = 64
	if n := y.IPv6Prefix; n != nil {
		if v, why := n.between(8, 128); why != "" {
			f.fail("ipv6_prefix", n.text, why+" bits")
		} else {
			r.IPv6Prefix = int(v)
		}
	}
}

func parsePolicy(f *fields, y ruleYAML, r *Rule) {
	r.Lease = f.duration("lease", y.Lease, 30*time.Second, time.Second, 24*time.Hour, true, "a duration of whole milliseconds between 1s and 24h")
	f.only(y.Lease != "", "lease", strconv.Quote(y.Lease), r.Kind == Concurrency, "kind: concurrency")
	if r.Kind == Concurrency && y.Window == "" {
		y.Window = r.Lease.String() // slots are counted per lease period
	}
	r.Algorithm = enumField[policy.Algorithm](f, "algorithm", y.Algorithm)
	r.Action = enumField[policy.Action](f, "action", y.Action)
	r.Mode = enumField[policy.Mode](f, "mode", y.Mode)
	r.Fail = enumField[policy.Fail](f, "fail", y.Fail)
	r.Limit = f.amount("limit", y.Limit, 0, true)
	if y.Window == "" {
		f.fail("window", "", "is required")
	}
	r.Window = f.duration("window", y.Window, 0, time.Millisecond, maxWindow, true, "a duration of whole milliseconds between 1ms and 366d")
	r.Burst = f.amount("burst", y.Burst, r.Limit, false)
	r.Timeout = f.duration("timeout", y.Timeout, r.Window, time.Nanosecond, maxWindow, false, "a positive duration of at most 366d")
	f.only(y.Timeout != "", "timeout", strconv.Quote(y.Timeout), r.Action == policy.Block, "action: block")
	switch {
	case f.n > 0:
	case r.Algorithm == policy.TokenBucket:
		if err := (algo.TokenBucket{Rate: int64(r.Limit), Per: r.Window, Burst: int64(r.Burst)}).Validate(); err != nil {
			f.fail("burst", strconv.FormatUint(r.Burst, 10), "does not fit the token bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	case r.Algorithm == policy.LeakyBucket:
		if err := (algo.LeakyBucket{Rate: int64(r.Limit), Per: r.Window, Capacity: int64(r.Burst)}).Validate(); err != nil {
			f.fail("burst", strconv.FormatUint(r.Burst, 10), "does not fit the leaky bucket's exact arithmetic with this limit and window: "+err.Error())
		}
	}
	if r.Kind == Concurrency && (y.Algorithm != "" || y.Action != "" || y.Mode != "" || y.Timeout != "") {
		f.fail("kind", "concurrency", "takes no algorithm, action, mode or timeout")
	}
	if r.Algorithm == policy.SlidingLog {
		// An exact limit cannot be decided from a view: a sliding log
		// runs in sync mode, one store operation per request.
		if y.Mode == "" {
			r.Mode = policy.Sync
		} else if r.Mode == policy.Async {
			f.fail("mode", "async", "a sliding_log runs in sync mode only (exact across edges, one store operation per request); use sliding_window for an async limit")
		}
		if r.Limit > algo.MaxSharedLogLimit {
			f.fail("limit", strconv.FormatUint(r.Limit, 10), fmt.Sprintf("a sliding_log keeps every request's instant and takes at most %d per window; use sliding_window for large limits", algo.MaxSharedLogLimit))
		}
	}
	if r.Action == policy.Delay && r.Algorithm != policy.LeakyBucket {
		f.fail("action", "delay", "queues requests as a leaky bucket: needs algorithm: leaky_bucket, not "+r.Algorithm.String())
	}
}

func parseCost(f *fields, y ruleYAML, r *Rule) {
	r.CostHeader = y.CostHeader
	r.Cost = f.amount("cost", y.Cost, 1, false)
	r.MaxCost = f.amount("max_cost", y.MaxCost, r.Limit, false)
	if y.MaxCost != nil {
		f.only(true, "max_cost", y.MaxCost.text, y.CostHeader != "", "rules with cost_header")
	}
	if y.CostHeader != "" && !IsToken(y.CostHeader) {
		f.fail("cost_header", strconv.Quote(y.CostHeader), "is not a valid header name")
	}
}

// checkCost refuses costs no request can ever be admitted at: a rate rule
// admits at most its capacity for one key at once (the limit, or a
// bucket's burst), so a request costing more is refused on every try.
// The capacity of a tier is its limit (and its burst, when the rule's
// burst is its limit, as the limiter scales it).
func checkCost(f *fields, y ruleYAML, r *Rule) {
	capacity := func(limit uint64) (uint64, string) {
		c, what := limit, "limit"
		if r.Algorithm != policy.TokenBucket && r.Algorithm != policy.LeakyBucket {
			return c, what
		}
		if r.Burst != r.Limit {
			c, what = r.Burst, "burst"
		}
		if r.Action == policy.Delay {
			c, what = c+1, what+" plus the one being served" // a queue holds Burst while one is served
		}
		return c, what
	}
	c, what := capacity(r.Limit)
	if r.Cost > c {
		f.fail("cost", strconv.FormatUint(r.Cost, 10), "must be at most the "+what+", "+strconv.FormatUint(c, 10)+
			", or every request is refused")
		return
	}
	most, mostWhat := c, what
	for _, tier := range sortedKeys(r.Tiers) {
		tl := r.Tiers[tier]
		tc, tw := capacity(tl)
		if r.Cost > tc { // tc is the tier's limit (plus one, for a queue)
			f.fail("tiers."+tier, strconv.FormatUint(tl, 10), "must be at least "+strconv.FormatUint(r.Cost-(tc-tl), 10)+
				" (a request costs "+strconv.FormatUint(r.Cost, 10)+"), or every request of the tier is refused")
		}
		if tc > most {
			most, mostWhat = tc, "largest "+tw+" of the rule and its tiers"
		}
	}
	if y.MaxCost != nil && r.MaxCost > most {
		f.fail("max_cost", strconv.FormatUint(r.MaxCost, 10), "must be at most the "+mostWhat+", "+strconv.FormatUint(most, 10)+
			": a request costing more is refused on every try")
	}
}

func sortedKeys(m map[string]uint64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func parseTiers(f *fields, y ruleYAML, r *Rule) {
	for tier, l := range y.Tiers {
		if tier == "" || len(tier) > MaxRuleName || !printableName(tier) {
			f.fail("tiers", strconv.Quote(tier), "tier names are 1 to 128 letters, digits and -_.:/")
			continue
		}
		if l == nil {
			f.fail("tiers."+tier, "null", "must be between 1 and "+strconv.FormatInt(maxLimit-1, 10))
			continue
		}
		if v := f.amount("tiers."+tier, l, 0, true); v > 0 {
			if r.Algorithm == policy.SlidingLog && v > algo.MaxSharedLogLimit {
				f.fail("tiers."+tier, strconv.FormatUint(v, 10), fmt.Sprintf("a sliding_log takes at most %d per window; use sliding_window for large limits", algo.MaxSharedLogLimit))
			}
			if r.Tiers == nil {
				r.Tiers = make(map[string]uint64, len(y.Tiers))
			}
			r.Tiers[tier] = v
		}
	}
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
	case "form", "json":
		return parseBodyKeyPart(src, name, hasName)
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
	return KeyPart{}, `must be "ip", "header:NAME", "query:NAME", "cookie:NAME", "form:NAME" or "json:/POINTER"`
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
