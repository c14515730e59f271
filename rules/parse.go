package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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
	MaxInFlight *number  `yaml:"max_in_flight"`
	Latency     string   `yaml:"latency"`
	Reserved    *float64 `yaml:"reserved"`
}

type ruleYAML struct {
	Name         string             `yaml:"name"`
	Kind         string             `yaml:"kind"`
	Priority     string             `yaml:"priority"`
	Lease        string             `yaml:"lease"`
	Host         string             `yaml:"host"`
	PathPrefix   string             `yaml:"path_prefix"`
	PathCase     string             `yaml:"path_case"`
	Methods      []string           `yaml:"methods"`
	Key          []string           `yaml:"key"`
	MissingKey   string             `yaml:"missing_key"`
	DuplicateKey string             `yaml:"duplicate_key"`
	QuerySemi    string             `yaml:"query_semicolon"`
	KeyTrim      string             `yaml:"key_trim"`
	KeyCase      string             `yaml:"key_case"`
	IPv6Prefix   *number            `yaml:"ipv6_prefix"`
	Limit        *number            `yaml:"limit"`
	Window       string             `yaml:"window"`
	Burst        *number            `yaml:"burst"`
	Algorithm    string             `yaml:"algorithm"`
	Action       string             `yaml:"action"`
	Timeout      string             `yaml:"timeout"`
	Mode         string             `yaml:"mode"`
	Fail         string             `yaml:"fail"`
	Shadow       bool               `yaml:"shadow"`
	Scope        string             `yaml:"scope"`
	Cost         *number            `yaml:"cost"`
	CostHeader   string             `yaml:"cost_header"`
	MaxCost      *number            `yaml:"max_cost"`
	Tiers        map[string]*number `yaml:"tiers"`
	Count        *countYAML         `yaml:"count"`
}

// number is an integer field as the file writes it: decoding keeps what
// was written and validation judges it, naming the field. (Decoded into
// an integer, YAML would truncate 1.5 to 1, read 010 as octal 8, and
// report 2^64 as a "!!float" without naming the field.)
type number struct {
	v     int64
	text  string // as written, quoted when a string, for messages
	whole bool   // v holds a YAML integer within int64
	huge  bool   // a whole number beyond int64
	octal bool   // a YAML 1.1 octal, 0 followed by digits
}

// UnmarshalYAML keeps node for validation; it never fails, so that every
// bad number is reported with its field's path.
func (n *number) UnmarshalYAML(node *yaml.Node) error {
	*n = number{text: node.Value}
	switch {
	case node.Kind == yaml.SequenceNode:
		n.text = "a list"
	case node.Kind == yaml.MappingNode:
		n.text = "a mapping"
	case node.Kind != yaml.ScalarNode:
		n.text = "an alias"
	case node.ShortTag() == "!!str":
		n.text = strconv.Quote(node.Value)
	case node.ShortTag() == "!!int":
		digits := strings.TrimLeft(strings.ReplaceAll(node.Value, "_", ""), "+-")
		if len(digits) > 1 && digits[0] == '0' && strings.Trim(digits, "0123456789") == "" {
			n.octal = true
			return nil
		}
		n.whole = node.Decode(&n.v) == nil
		n.huge = !n.whole
	case node.ShortTag() == "!!float":
		// YAML resolves a string of digits beyond uint64 as a float.
		digits := strings.TrimLeft(strings.ReplaceAll(node.Value, "_", ""), "+-")
		n.huge = digits != "" && strings.Trim(digits, "0123456789") == ""
	}
	return nil
}

// between returns n's value when it is a whole number within [lo, hi],
// else the reason it is not.
func (n *number) between(lo, hi int64) (int64, string) {
	rng := "between " + strconv.FormatInt(lo, 10) + " and " + strconv.FormatInt(hi, 10)
	switch {
	case n.octal:
		return 0, "must be a whole number " + rng + " written without a leading zero (YAML reads 010 as octal 8)"
	case n.huge:
		return 0, "must be " + rng
	case !n.whole:
		return 0, "must be a whole number " + rng
	case n.v < lo || n.v > hi:
		return 0, "must be " + rng
	}
	return n.v, ""
}

// ParseRules parses and validates a YAML rules file. It reports every
// invalid field, each with its path and the bad value, joined in one error
// that wraps ErrInvalid; it never panics on any input.
func ParseRules(data []byte) (*Rules, error) {
	if n := countRules(data); n > MaxRules {
		// Refused before every rule is decoded and checked: a file of
		// 100,000 small rules (4 MB) would cost some 100 MB more.
		return nil, fmt.Errorf("rules: %w:\n%w", ErrInvalid,
			&FieldError{Path: "rules", Value: strconv.Itoa(n), Reason: "at most " + strconv.Itoa(MaxRules) + " rules"})
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&f)
	empty := errors.Is(err, io.EOF) // no document: empty, or only comments
	if err != nil && !empty {
		return nil, fmt.Errorf("rules: %w: %v", ErrInvalid, err)
	}
	var errs []error
	bad := func(path, value, reason string) {
		errs = append(errs, &FieldError{Path: path, Value: value, Reason: reason})
	}
	if !empty && !lastDocument(dec) {
		bad("file", "", "a rules file is one YAML document; this one holds more after a ---, which would be ignored")
	}
	rs := &Rules{}
	switch f.Match {
	case "", "first":
	case "all":
		rs.MatchAll = true
	default:
		bad("match", strconv.Quote(f.Match), `must be "first" or "all"`)
	}
	rs.Shedding = Shedding{Reserved: 0.1}
	if n := f.Shedding.MaxInFlight; n != nil {
		if v, why := n.between(0, 1<<24); why != "" {
			bad("shedding.max_in_flight", n.text, why+" (0: off)")
		} else {
			rs.Shedding.MaxInFlight = int(v)
		}
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
	switch {
	case empty:
		bad("rules", "", "at least one rule is required; the file holds no YAML document (it is empty or only comments)")
	case len(f.Rules) == 0:
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
		return nil, fmt.Errorf("rules: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	return rs, nil
}

// lastDocument reports whether dec holds no document after the one
// decoded, but for empty ones (a trailing ---).
func lastDocument(dec *yaml.Decoder) bool {
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			return errors.Is(err, io.EOF)
		}
		if len(n.Content) > 0 && n.Content[0].ShortTag() != "!!null" {
			return false
		}
	}
}

// ParseDuration is time.ParseDuration that also takes whole days ("1d").
func ParseDuration(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("rules: duration %q: %w", s, err)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("rules: %w", err)
	}
	return d, nil
}

// countRulesFrom is the size from which ParseRules counts a file's rules
// before decoding them: a smaller file costs little either way.
const countRulesFrom = 64 << 10

// countRules returns how many items the top-level rules list of a file
// of at least countRulesFrom bytes holds (0 for a smaller file, or one
// that does not read), from the YAML's nodes alone.
func countRules(data []byte) int {
	if len(data) < countRulesFrom {
		return 0
	}
	var f struct {
		Rules ruleCount `yaml:"rules"`
	}
	if yaml.Unmarshal(data, &f) != nil {
		return 0
	}
	return int(f.Rules)
}

// ruleCount decodes a YAML sequence into its length.
type ruleCount int

func (c *ruleCount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		*c = ruleCount(len(n.Content))
	}
	return nil
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
		return nil, fmt.Errorf("rules: overrides: %w: %v", ErrInvalid, err)
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
		return nil, fmt.Errorf("rules: overrides: %w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	if f.Overrides == nil {
		f.Overrides = map[string]string{}
	}
	return f.Overrides, nil
}
