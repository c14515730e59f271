package envoyconf

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/internal/filestamp"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/window"
	"go.yaml.in/yaml/v3"
)

// OverrideCeiling is the limit of the rules that count the descriptors
// carrying their own limit (RateLimitDescriptor.limit): they never refuse
// below it, and the front end compares their count with the request's
// limit (rules.DescriptorOverride).
const OverrideCeiling = math.MaxUint32

// IsEnvoy reports whether data is an envoyproxy/ratelimit file rather than
// a poplimit rules file: a YAML mapping whose first document has a
// top-level "domain" key (a poplimit rules file has "rules" and never
// "domain"). It reads the YAML only as far as the top level (aliases are
// not expanded) and never panics.
func IsEnvoy(data []byte) bool {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return false
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i]; k.Kind == yaml.ScalarNode && k.Value == "domain" {
			return true
		}
	}
	return false
}

// MaxDirFiles bounds the files ReadFiles reads from one directory.
const MaxDirFiles = 1024

// ReadFiles reads path with the zero Loader: see Loader.ReadFiles.
func ReadFiles(path string) (map[string][]byte, error) { return Loader{}.ReadFiles(path) }

// ReadFiles reads the files a rules path names, as LoadRules takes them
// (name → contents): a file alone, or every *.yaml and *.yml file of a
// directory (not its subdirectories, not names that start with a dot, so
// that a Kubernetes ConfigMap volume's "..data" is skipped while its
// symlinked files are read), as envoyproxy/ratelimit reads its runtime
// directory. Names are base names; a directory without such files is an
// error. A file over l.MaxFileBytes is refused before any of it is read
// (rules.ReadFile), with an error naming it, its size and the bound.
func (l Loader) ReadFiles(path string) (map[string][]byte, error) {
	limit := int64(l.MaxFileBytes)
	if limit <= 0 {
		limit = DefaultMaxFileBytes
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("envoyconf: read %s: %w", path, err)
	}
	if !st.IsDir() {
		b, err := rules.ReadFile(path, limit)
		if err != nil {
			return nil, fmt.Errorf("envoyconf: %w", tooLarge(err))
		}
		return map[string][]byte{filepath.Base(path): b}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("envoyconf: read %s: %w", path, err)
	}
	files := make(map[string][]byte)
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		p := filepath.Join(path, n)
		fst, err := os.Stat(p) // follows symlinks
		if err != nil {
			return nil, fmt.Errorf("envoyconf: read %s: %w", p, err)
		}
		if !fst.Mode().IsRegular() {
			continue
		}
		if len(files) == MaxDirFiles {
			return nil, fmt.Errorf("envoyconf: read %s: more than %d files: %w", path, MaxDirFiles, ErrTooLarge)
		}
		b, err := rules.ReadFile(p, limit)
		if err != nil {
			return nil, fmt.Errorf("envoyconf: %w", tooLarge(err))
		}
		files[n] = b
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("envoyconf: read %s: no *.yaml or *.yml file: %w", path, ErrInvalid)
	}
	return files, nil
}

// tooLarge makes a *rules.SizeError match ErrTooLarge too.
func tooLarge(err error) error {
	if se, ok := err.(*rules.SizeError); ok {
		return sizeError{se}
	}
	return err
}

type sizeError struct{ *rules.SizeError }

func (e sizeError) Unwrap() []error { return []error{e.SizeError, ErrTooLarge} }

// Stamp returns a summary of what ReadFiles would read at path: the name
// of each file and a 64-bit hash of its contents (symlinks followed), so
// that a watcher reloads when any byte changes, whatever the files' sizes
// and times say: a Kubernetes ConfigMap's swap of its "..data" symlink
// may bring files of the same size and time. It is "error: …" when path
// cannot be read (a file over the bound is not read: its size is the
// stamp).
func Stamp(path string) string {
	files, err := ReadFiles(path)
	if err != nil {
		return "error: " + err.Error()
	}
	return StampOf(files)
}

// StampOf is Stamp of files already read.
func StampOf(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b []byte
	for _, n := range names {
		b = filestamp.Append(b, n, files[n])
	}
	return string(b)
}

// LoadRules loads files (name → contents) as Load does and converts them
// with Config.Rules: the edge's loader calls it for envoyproxy/ratelimit
// files (IsEnvoy).
func LoadRules(files map[string][]byte) (*rules.Rules, error) { return Loader{}.LoadRules(files) }

// LoadRules is LoadRules with l's options.
func (l Loader) LoadRules(files map[string][]byte) (*rules.Rules, error) {
	c, err := l.Load(files)
	if err != nil {
		return nil, err
	}
	return c.Rules()
}

// Rules converts c to poplimit rules and the index that maps descriptors
// to them (DescriptorsOf). The rules are, in this order:
//
//   - one per rate_limit block of the files (Config.Limits order), except
//     unlimited ones, which answer OK without a rule. Its Name is the
//     limit's FullKey ("messaging.message_type_marketing.to_number") when
//     that is 1 to 128 bytes of letters, digits and -_.:/; otherwise the
//     FullKey with every other byte made '_', cut to 111 bytes, and ":"
//     and 16 hex digits of its xxhash appended, so names stay unique and
//     every edge that loads the same files names (and so shares) the
//     same counters. Its Policy is the limit's: window (the
//     unit, or the window extension), algorithm (fixed_window unless the
//     file or the limit says otherwise), mode, fail, burst; action count
//     runs as policy.Block with no Timeout (every hit counted, refused
//     while over, no refusal outlasting the count), throttle as
//     policy.Throttle, block as policy.Block for its timeout. A limit of 0
//     is a rule of limit 0 (it refuses every hit, and a check-only
//     request answers OK until one is counted, as in ratelimit); run as a
//     fixed window when its algorithm keeps a state rather than counters
//     (buckets, sliding_log), which a limit of 0 cannot; those rules take
//     mode async here (the limiter runs a sliding log in sync mode
//     whatever its mode).
//   - seven per distinct combination of the files' top-level poplimit
//     defaults (algorithm, mode, fail), one per unit, named
//     "override:<unit>" for ratelimit's defaults and
//     "override:<unit>:<algorithm>:<mode>:<fail>" otherwise: they count the
//     descriptors that carry their own limit (rules.DescriptorOverride),
//     with limit OverrideCeiling, action count and a fixed or sliding
//     window (buckets and logs cannot count for a limit they do not know).
//
// Every rule matches no HTTP request (rules.Rule.Envoy), costs 1 by
// default, and takes any cost (MaxCost is the largest uint64): a request's
// hits are the descriptor's. Limits whose bucket arithmetic does not fit
// are reported with their file and line, all at once, in a *LoadError.
func (c *Config) Rules() (*rules.Rules, error) {
	if c.Empty() {
		return nil, &LoadError{Errors: []*FieldError{{File: "envoyconf", Reason: "no domain is configured", Err: ErrInvalid}}}
	}
	x := &Index{cfg: c, limits: make(map[*Limit]limitRule), over: make(map[string]*overrideRules)}
	rs := &rules.Rules{}
	names := make(map[string]string) // rule name → what it names, for uniqueness
	var p problems
	add := func(r *rules.Rule, what string) int {
		for n := 2; names[r.Name] != ""; n++ {
			// Only a 64-bit hash collision gets here.
			r.Name = strings.TrimSuffix(r.Name, ":"+strconv.Itoa(n-1)) + ":" + strconv.Itoa(n)
		}
		names[r.Name] = what
		r.Index = len(rs.Rules)
		rs.Rules = append(rs.Rules, rules.Finish(r))
		return r.Index
	}
	for _, l := range c.limits {
		if l.Unlimited {
			continue
		}
		r, err := limitRuleOf(l)
		if err != "" {
			p.add(&FieldError{File: l.File, Line: l.Line, Path: l.FullKey + ".rate_limit", Reason: err, Err: ErrInvalid})
			continue
		}
		unit, mult := unitOfWindow(l.Window)
		x.limits[l] = limitRule{rule: add(r, l.FullKey), unit: unit, mult: mult}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	combos := make(map[fileDefaults]*overrideRules)
	for _, name := range c.names {
		d := c.domains[name]
		def := overrideDefaults(d.defaults)
		o := combos[def]
		if o == nil {
			o = new(overrideRules)
			for u := Second; u <= Week; u++ {
				o[u] = add(overrideRule(def, u), "override "+u.String())
			}
			combos[def] = o
		}
		x.over[name] = o
	}
	rs.Descriptors = x
	return rs, nil
}

// limitRule is what the Index keeps of a counted limit.
type limitRule struct {
	rule int    // index in the Rules
	unit uint8  // current_limit.unit
	mult uint32 // current_limit.unit_multiplier; 0 for one unit
}

// overrideRules are the indexes of the override rules of one combination
// of defaults, by Unit.
type overrideRules [Week + 1]int

// Index maps descriptors to the rules Config.Rules built from the same
// Config; it implements rules.Descriptors. It is immutable and safe for
// concurrent use; its methods do not allocate for descriptors of up to 8
// entries of up to 256 bytes.
type Index struct {
	cfg    *Config
	limits map[*Limit]limitRule
	over   map[string]*overrideRules // by domain
}

var _ rules.Descriptors = (*Index)(nil)

// Config returns the Config the Index was built from.
func (x *Index) Config() *Config { return x.cfg }

// HasDomain reports whether domain is configured.
func (x *Index) HasDomain(domain string) bool { return x.cfg.HasDomain(domain) }

// Descriptor looks the descriptor up as Config.Lookup does and appends its
// counter key (Match.AppendCounterKey).
func (x *Index) Descriptor(domain string, entries []Entry, key []byte) (rules.DescriptorMatch, []byte) {
	m := x.cfg.Lookup(domain, entries)
	l := m.Limit
	if l == nil {
		return rules.DescriptorMatch{Rule: -1}, key
	}
	dm := rules.DescriptorMatch{Answer: rules.DescriptorUnlimited, Rule: -1, Name: l.Name, Replaces: l.Replaces}
	if l.Unlimited {
		return dm, key
	}
	lr := x.limits[l]
	dm.Answer, dm.Rule = rules.DescriptorCounted, lr.rule
	dm.RequestsPerUnit, dm.Unit, dm.UnitMultiplier, dm.Window = l.RequestsPerUnit, lr.unit, lr.mult, l.Window
	dm.Shadow, dm.Quota = l.ShadowMode, l.QuotaMode
	return dm, m.AppendCounterKey(key)
}

// Override answers a descriptor that carries its own limit, as
// Config.Override does: its counter key is the entries as sent
// ("domain_k1_v1_k2_v2_", ratelimit's), counted by the domain's override
// rule of that unit.
func (x *Index) Override(domain string, entries []Entry, requestsPerUnit uint32, unit uint8, key []byte) (rules.DescriptorMatch, []byte, error) {
	o := x.over[domain]
	if o == nil {
		return rules.DescriptorMatch{Rule: -1}, key, nil
	}
	u := Unit(unit)
	if u.Seconds() == 0 {
		return rules.DescriptorMatch{Rule: -1}, key, fmt.Errorf("envoyconf: override %s: rate limit unit %v: %w", domain, u, ErrInvalid)
	}
	dm := rules.DescriptorMatch{Answer: rules.DescriptorOverride, Rule: o[u], RequestsPerUnit: requestsPerUnit,
		Unit: unit, Window: time.Duration(u.Seconds()) * time.Second}
	key = append(key, domain...)
	key = append(key, '_')
	for i := range entries {
		key = append(key, entries[i].Key...)
		key = append(key, '_')
		key = append(key, entries[i].Value...)
		key = append(key, '_')
	}
	return dm, key, nil
}

// limitRuleOf builds the rule of a counted limit, or says why it cannot.
func limitRuleOf(l *Limit) (*rules.Rule, string) {
	pol := window.Policy{Limit: uint64(l.RequestsPerUnit), Window: l.Window, Fail: l.Fail,
		Algorithm: l.Algorithm, Action: l.Action, Timeout: l.Timeout} // "count": Block, Timeout 0
	if l.RequestsPerUnit == 0 && !pol.Algorithm.IsCounter() {
		pol.Algorithm = policy.FixedWindow
	}
	pol.Mode = policy.Async
	if l.Mode == policy.Sync && pol.Algorithm.IsCounter() {
		pol.Mode = policy.Sync
	}
	pol.Burst = pol.Limit
	if l.Algorithm.IsBucket() && pol.Limit > 0 {
		pol.Burst = l.Burst
		var err error
		if pol.Algorithm == policy.TokenBucket {
			err = algo.TokenBucket{Rate: int64(pol.Limit), Per: pol.Window, Burst: int64(pol.Burst)}.Validate()
		} else {
			err = algo.LeakyBucket{Rate: int64(pol.Limit), Per: pol.Window, Capacity: int64(pol.Burst)}.Validate()
		}
		if err != nil {
			return nil, "burst " + strconv.FormatUint(pol.Burst, 10) + " does not fit the " + l.Algorithm.String() +
				"'s exact arithmetic with this limit and window: " + err.Error()
		}
	}
	r := descriptorRule(ruleName(l.FullKey), pol, l.ShadowMode)
	r.Count = l.Count
	return r, ""
}

// overrideDefaults returns the defaults an override rule runs with: the
// file's, with a shared algorithm and action count.
func overrideDefaults(d fileDefaults) fileDefaults {
	if d.algorithm != policy.SlidingWindow {
		d.algorithm = policy.FixedWindow
	}
	d.action, d.count = policy.Block, true
	return d
}

func overrideRule(d fileDefaults, u Unit) *rules.Rule {
	name := "override:" + u.String()
	if d != envoyDefaults {
		name += ":" + d.algorithm.String() + ":" + d.mode.String() + ":" + d.fail.String()
	}
	pol := window.Policy{Limit: OverrideCeiling, Window: time.Duration(u.Seconds()) * time.Second,
		Algorithm: d.algorithm, Action: policy.Block, Mode: policy.Async, Fail: d.fail}
	pol.Burst = pol.Limit
	if d.mode == policy.Sync {
		pol.Mode = policy.Sync
	}
	return descriptorRule(name, pol, false)
}

func descriptorRule(name string, pol window.Policy, shadow bool) *rules.Rule {
	return &rules.Rule{
		Name: name, Kind: rules.Rate, Priority: rules.Normal, Policy: pol,
		Envoy:      true,
		Key:        []rules.KeyPart{{Source: rules.KeyIP}},
		IPv6Prefix: 64,
		Shadow:     shadow,
		Cost:       1, MaxCost: math.MaxUint64,
	}
}

// nameHashLen is ":" and 16 hex digits.
const nameHashLen = 17

// ruleName returns the rule name of a limit's FullKey (see Config.Rules).
func ruleName(fullKey string) string {
	clean := len(fullKey) > 0 && len(fullKey) <= rules.MaxRuleName
	for i := 0; clean && i < len(fullKey); i++ {
		clean = nameByte(fullKey[i])
	}
	if clean {
		return fullKey
	}
	n := min(len(fullKey), rules.MaxRuleName-nameHashLen)
	b := make([]byte, 0, n+nameHashLen)
	for i := 0; i < n; i++ {
		c := fullKey[i]
		if !nameByte(c) {
			c = '_'
		}
		b = append(b, c)
	}
	b = append(b, ':')
	b = fmt.Appendf(b, "%016x", xxhash.Sum64String(fullKey))
	return string(b)
}

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:/", c) >= 0
}

// unitsBySize are the units from the longest, for unitOfWindow.
var unitsBySize = [...]Unit{Year, Month, Week, Day, Hour, Minute, Second}

// unitOfWindow returns how current_limit names a window: one unit
// (multiplier 0), the longest unit that divides it and how many of them,
// or no unit for a window that is not whole seconds.
func unitOfWindow(w time.Duration) (uint8, uint32) {
	if u := unitOf(w); u != UnitUnknown {
		return uint8(u), 0
	}
	if w <= 0 || w%time.Second != 0 {
		return 0, 0
	}
	s := int64(w / time.Second)
	for _, u := range unitsBySize {
		if s%u.Seconds() == 0 && s/u.Seconds() <= math.MaxUint32 {
			return uint8(u), uint32(s / u.Seconds())
		}
	}
	return 0, 0
}

// DescriptorsOf returns the descriptor index of rs when Config.Rules (or
// LoadRules) built it, nil otherwise (a poplimit rules file). It does not
// allocate and is safe for concurrent use.
func DescriptorsOf(rs *rules.Rules) rules.Descriptors {
	if rs == nil {
		return nil
	}
	return rs.Descriptors
}

// ErrNotEnvoy is returned by LoadPath for a file that is not an
// envoyproxy/ratelimit file.
var ErrNotEnvoy = errors.New("not an envoyproxy/ratelimit file (no top-level domain)")

// LoadPath reads path with ReadFiles and loads it with LoadRules; every
// file must be an envoyproxy/ratelimit file (IsEnvoy), or ErrNotEnvoy
// names the first that is not. Files load in name order.
func LoadPath(path string) (*rules.Rules, error) { return Loader{}.LoadPath(path) }

// LoadPath is LoadPath with l's options.
func (l Loader) LoadPath(path string) (*rules.Rules, error) {
	files, err := l.ReadFiles(path)
	if err != nil {
		return nil, err
	}
	return l.RulesOf(files)
}

// RulesOf loads files as read by ReadFiles, as LoadPath does: every file
// must be an envoyproxy/ratelimit file (IsEnvoy). A watcher that stamps
// what it read (StampOf) loads the very bytes it stamped.
func (l Loader) RulesOf(files map[string][]byte) (*rules.Rules, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !IsEnvoy(files[n]) {
			return nil, fmt.Errorf("envoyconf: %s: %w", n, ErrNotEnvoy)
		}
	}
	return l.LoadRules(files)
}
