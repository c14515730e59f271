package envoyconf

import (
	"errors"
	"strings"
	"testing"
)

// firstError loads text and returns its first FieldError.
func loadErrors(t *testing.T, name string, data []byte) *LoadError {
	t.Helper()
	c, err := Parse(name, data)
	if err == nil {
		t.Fatalf("Parse(%s) = %v, nil; want an error", name, c.Domains())
	}
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("Parse(%s) error %T %v, want *LoadError", name, err, err)
	}
	return le
}

// The files ratelimit's own tests refuse (test/config), refused here with
// the same reason, the place and the path.
func TestRatelimitRejects(t *testing.T) {
	tests := []struct {
		file   string
		line   int
		path   string
		err    error
		reason string // ratelimit's message, contained in ours
	}{
		{"bad_limit_unit.yaml", 6, "descriptors[0].rate_limit.unit", ErrInvalid, "invalid rate limit unit 'foo'"},
		{"bad_yaml.yaml", 2, "", ErrSyntax, "found unexpected end of stream"},
		{"duplicate_key.yaml", 6, "descriptors[1]", ErrDuplicateDescriptor, "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"empty_domain.yaml", 1, "domain", ErrInvalid, "config file cannot have empty domain"},
		{"empty_key.yaml", 3, "descriptors[0].key", ErrInvalid, "descriptor has empty key"},
		{"misspelled_key.yaml", 5, "descriptors[0].ratelimit", ErrUnknownField, `unknown field "ratelimit"`},
		{"misspelled_key2.yaml", 7, "descriptors[0].rate_limit.requestsperunit", ErrUnknownField, `unknown field "requestsperunit"`},
		{"non_map_list.yaml", 3, "descriptors[0]", ErrType, `a descriptor must be a mapping (got the string "a")`},
		{"non_string_key.yaml", 1, "", ErrType, "key a float is not a string"},
		{"replaces_empty.yaml", 10, "descriptors[0].descriptors[0].rate_limit.replaces[0].name", ErrInvalid, "should not have an empty replaces entry"},
		{"replaces_self.yaml", 10, "descriptors[0].descriptors[0].rate_limit.replaces[0].name", ErrInvalid, "replaces should not contain name of same descriptor"},
		{"unlimited_with_unit.yaml", 6, "descriptors[0].rate_limit.unit", ErrInvalid, "should not specify rate limit unit when unlimited"},
		{"share_without_wildcard.yaml", 4, "descriptors[0].share_threshold", ErrInvalid, "share_threshold can only be used with wildcard values (containing '*'), but found key 'foo_plain'"},
		{"float_value.yaml", 4, "descriptors[0].value", ErrType, "ratelimit rejects floats"},
		{"negative_rpu.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", ErrInvalid, "must be between 0 and 4294967295 (got -1)"},
		{"quoted_rpu.yaml", 4, "descriptors[0].rate_limit.requests_per_unit", ErrType, `must be an integer (got the string "5")`},
		{"alias_cycle.yaml", 4, "descriptors[0].descriptors[0].descriptors", ErrSyntax, "alias *d contains itself"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			le := loadErrors(t, tt.file, readFixture(t, "bad/"+tt.file))
			fe := le.Errors[0]
			if fe.File != tt.file || fe.Line != tt.line || fe.Path != tt.path || !errors.Is(fe, tt.err) || !strings.Contains(fe.Reason, tt.reason) {
				t.Errorf("first error = {file %q line %d path %q err %v reason %q}\nwant          {file %q line %d path %q err %v reason containing %q}",
					fe.File, fe.Line, fe.Path, fe.Err, fe.Reason, tt.file, tt.line, tt.path, tt.err, tt.reason)
			}
			if !errors.Is(le, tt.err) {
				t.Errorf("errors.Is(LoadError, %v) = false", tt.err)
			}
		})
	}
}

// TestEveryErrorListed checks that one file's problems are all reported,
// each with its path.
func TestEveryErrorListed(t *testing.T) {
	le := loadErrors(t, "many.yaml", []byte(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: bogus}
    descriptors:
      - value: x
      - key: c
        bogus: 1
  - key: a
`))
	want := []string{
		"many.yaml:5:24: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight' (want second, minute, hour, day, week, month or year)",
		`many.yaml:7:65: descriptors[1].rate_limit.algorithm: unknown algorithm "bogus" (want sliding_window, fixed_window, token_bucket, leaky_bucket or sliding_log)`,
		"many.yaml:9:9: descriptors[1].descriptors[0].key: descriptor has empty key",
		`many.yaml:11:9: descriptors[1].descriptors[1].bogus: unknown field "bogus"`,
		"many.yaml:12:5: descriptors[2]: duplicate descriptor composite key 'd.a' (first at line 4)",
	}
	if len(le.Errors) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(le.Errors), len(want), le)
	}
	for i, fe := range le.Errors {
		if got := fe.Error(); got != want[i] {
			t.Errorf("error %d = %s\nwant      %s", i, got, want[i])
		}
	}
	if !strings.HasPrefix(le.Error(), "envoyconf: 5 errors:\n\tmany.yaml:5:24: ") {
		t.Errorf("LoadError.Error() = %q", le.Error())
	}
}

// TestExtensionErrors checks the poplimit extensions' own checks.
func TestExtensionErrors(t *testing.T) {
	tests := []struct {
		name   string
		rl     string // the rate_limit block's fields
		path   string
		reason string
	}{
		{"window and unit", "{requests_per_unit: 1, unit: second, window: 90s}", "rate_limit.window", `set either unit or window, not both (unit is "second")`},
		{"window without a unit suffix", "{requests_per_unit: 1, window: 90}", "rate_limit.window", `invalid duration "90"`},
		{"window too short", "{requests_per_unit: 1, window: 100us}", "rate_limit.window", "must be between 1ms and 366d"},
		{"window too long", "{requests_per_unit: 1, window: 400d}", "rate_limit.window", "must be between 1ms and 366d"},
		{"window fraction of ms", "{requests_per_unit: 1, window: 1500us}", "rate_limit.window", "must be whole milliseconds"},
		{"window negative", "{requests_per_unit: 1, window: -1s}", "rate_limit.window", "must be between 1ms and 366d"},
		{"burst without bucket", "{requests_per_unit: 1, unit: second, burst: 5}", "rate_limit.burst", "applies to token_bucket and leaky_bucket only (algorithm is fixed_window)"},
		{"burst zero", "{requests_per_unit: 1, unit: second, algorithm: token_bucket, burst: 0}", "rate_limit.burst", "must be between 1 and 4294967295 (got 0)"},
		{"timeout without block", "{requests_per_unit: 1, unit: second, timeout: 1m}", "rate_limit.timeout", "applies to action block only (action is count)"},
		{"unknown mode", "{requests_per_unit: 1, unit: second, mode: eventually}", "rate_limit.mode", `unknown mode "eventually" (want async or sync)`},
		{"unknown action", "{requests_per_unit: 1, unit: second, action: ban}", "rate_limit.action", `unknown action "ban" (want count, throttle or block)`},
		{"unknown fail", "{requests_per_unit: 1, unit: second, fail: maybe}", "rate_limit.fail", `unknown fail "maybe" (want open or closed)`},
		{"extension on unlimited", "{unlimited: true, algorithm: token_bucket}", "rate_limit.algorithm", "has no effect on an unlimited limit"},
		{"window on unlimited", "{unlimited: true, window: 1m}", "rate_limit.window", "has no effect on an unlimited limit"},
		{"no unit nor window", "{requests_per_unit: 1}", "rate_limit.unit", "invalid rate limit unit ''"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tt.rl + "\n"
			le := loadErrors(t, "x.yaml", []byte(text))
			fe := le.Errors[0]
			if want := "descriptors[0]." + tt.path; fe.Path != want || !strings.Contains(fe.Reason, tt.reason) {
				t.Errorf("first error = %s\nwant path %s, reason containing %q", fe, want, tt.reason)
			}
		})
	}

	misplaced := []struct {
		name, text, path, reason string
	}{
		{"extension outside rate_limit", "domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n",
			"descriptors[0].algorithm", `unknown field "algorithm" (poplimit's algorithm goes inside rate_limit)`},
		{"poplimit block nested", "domain: d\ndescriptors:\n  - key: k\n    poplimit: {}\n",
			"descriptors[0].poplimit", "the poplimit block goes at the top of the file"},
		{"unknown key in the poplimit block", "poplimit: {window: 1m}\ndomain: d\n",
			"poplimit.window", "the poplimit block takes algorithm, mode, action, fail"},
		{"poplimit block not a mapping", "poplimit: sliding_window\ndomain: d\n",
			"poplimit", "must be a mapping"},
		{"file not a mapping", "- domain: d\n", "", "the file must be a mapping"},
		{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n", "descriptors", "must be a list of descriptors (got a mapping)"},
		{"rate_limit not a mapping", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: 5\n", "descriptors[0].rate_limit", "must be a mapping (got an integer)"},
		{"bool field quoted", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: \"true\"\n", "descriptors[0].shadow_mode", "must be true or false"},
		{"replaces not a list", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: {name: x}}\n", "descriptors[0].rate_limit.replaces", "must be a list"},
		{"replaces of scalars", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [x]}\n", "descriptors[0].rate_limit.replaces[0]", "must be a mapping"},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: a\n    metadata: [1]\n", "descriptors[0].metadata", "must be a mapping"},
		{"ignored key with an unknown key inside", "domain: d\nrate_limit: {bogus: 1}\n", "rate_limit.bogus", `unknown field "bogus"`},
		{"ignored key with a list of scalars", "domain: d\nkey: [1, 2]\n", "key[0]", "lists of mappings only"},
		{"integer beyond int64", "domain: 18446744073709551615\n", "domain", "is out of range"},
		{"integer beyond uint64 is a float", "domain: 99999999999999999999\n", "domain", "ratelimit rejects floats"},
		{"key a mapping", "domain: d\ndescriptors:\n  - key: {a: 1}\n", "descriptors[0].key", "must be a string (got a mapping)"},
	}
	for _, tt := range misplaced {
		t.Run(tt.name, func(t *testing.T) {
			le := loadErrors(t, "x.yaml", []byte(tt.text))
			fe := le.Errors[0]
			if fe.Path != tt.path || !strings.Contains(fe.Reason, tt.reason) {
				t.Errorf("first error = %s\nwant path %q, reason containing %q", fe, tt.path, tt.reason)
			}
		})
	}
}

func TestLoaderBounds(t *testing.T) {
	if _, err := (Loader{MaxFileBytes: -1}).Load(nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "MaxFileBytes: must not be negative (got -1)") {
		t.Errorf("Loader{MaxFileBytes: -1}.Load = %v", err)
	}
	if _, err := (Loader{MaxFileBytes: 10}).Load(map[string][]byte{"big.yaml": []byte("domain: a-long-domain\n")}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over MaxFileBytes: %v, want ErrTooLarge", err)
	}
	// A billion laughs: each level doubles the nodes behind its alias.
	var b strings.Builder
	b.WriteString("domain: d\na0: &a0 {key: x}\n")
	for i := 1; i < 40; i++ {
		b.WriteString("a" + itoa(int64(i)) + ": &a" + itoa(int64(i)) + " [*a" + itoa(int64(i-1)) + ", *a" + itoa(int64(i-1)) + "]\n")
	}
	// a1..a39 are unknown keys; put the bomb under a known, ignored one.
	bomb := strings.ReplaceAll(b.String(), "\na", "\n  a")
	bomb = strings.Replace(bomb, "domain: d\n", "domain: d\nkey:\n", 1)
	_, err := (Loader{MaxNodes: 100_000}).Load(map[string][]byte{"bomb.yaml": []byte(bomb)})
	if !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrUnknownField) {
		t.Errorf("alias bomb: %v, want ErrTooLarge or ErrUnknownField", err)
	}
	// The same expansion under keys that are checked: the budget stops it.
	var d strings.Builder
	d.WriteString("domain: d\nkey:\n  descriptors: &a0 [{key: x}]\n")
	for i := 1; i < 40; i++ {
		d.WriteString("  rate_limit: &a" + itoa(int64(i)) + " [{descriptors: *a" + itoa(int64(i-1)) + "}, {descriptors: *a" + itoa(int64(i-1)) + "}]\n")
	}
	_, err = (Loader{MaxNodes: 100_000}).Load(map[string][]byte{"bomb2.yaml": []byte(d.String())})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("alias bomb: %v, want ErrTooLarge", err)
	}
}

func TestWarnings(t *testing.T) {
	c := mustLoad(t, "ext/lenient.yaml")
	checkAnswer(t, c, "lenient", es("a", "on"), answer{found: true, rpu: 16, unit: Minute})
	checkAnswer(t, c, "lenient", es("b", "z"), answer{found: true, rpu: 7, unit: Hour, shadow: true})
	checkAnswer(t, c, "lenient", es("c", "z"), answer{found: true, rpu: 8, unit: Hour})
	checkAnswer(t, c, "lenient", es("d", "z"), answer{found: true, rpu: 0, unit: Hour})
	checkAnswer(t, c, "lenient", es("d", "y"), answer{found: true, rpu: 1, unit: Hour})
	checkAnswer(t, c, "lenient", es("d", "x"), answer{found: true, rpu: 0, unit: Hour})
	if c.HasDomain("second-document-is-ignored") {
		t.Errorf("the second document was read")
	}
	want := []string{
		`ext/lenient.yaml:3:1: key: ratelimit accepts "key" here but it has no effect; ignored`,
		`ext/lenient.yaml:10:7: descriptors[0].rate_limit.shadow_mode: ratelimit accepts "shadow_mode" here but it has no effect; ignored`,
		"ext/lenient.yaml:22:7: descriptors[3].rate_limit.requests_per_unit: missing: the limit is 0 requests and refuses every request (as in ratelimit)",
		"ext/lenient.yaml:25:5: descriptors[4].value: written twice in one mapping; the last one counts (as in ratelimit)",
		"ext/lenient.yaml:29:1: only the first YAML document of a file is read (as ratelimit reads it)",
	}
	got := c.Warnings()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Warnings() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
