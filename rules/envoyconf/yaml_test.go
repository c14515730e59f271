package envoyconf

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/policy"
)

// TestMergeKeys checks merge keys as ratelimit's YAML 1.1 decoder applies
// them: in order, so a later key replaces an earlier one whichever side of
// the merge it is on, and in a list of mappings the first wins.
func TestMergeKeys(t *testing.T) {
	c := mustParse(t, `
domain: d
descriptors:
  - key: sec
    rate_limit: &sec {unit: second, requests_per_unit: 1}
  - key: min
    rate_limit: &min {unit: minute, requests_per_unit: 2}
  - key: after
    rate_limit: {<<: *sec, requests_per_unit: 9}
  - key: before
    rate_limit: {requests_per_unit: 9, <<: *sec}
  - key: list
    rate_limit: {<<: [*min, *sec]}
  - &desc {key: aliased, rate_limit: *min}
`)
	checkAnswer(t, c, "d", es("after", "x"), answer{found: true, rpu: 9, unit: Second})
	checkAnswer(t, c, "d", es("before", "x"), answer{found: true, rpu: 1, unit: Second})
	checkAnswer(t, c, "d", es("list", "x"), answer{found: true, rpu: 2, unit: Minute})
	checkAnswer(t, c, "d", es("aliased", "x"), answer{found: true, rpu: 2, unit: Minute})

	bad := []struct{ text, path, reason string }{
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {<<: 5}\n", "descriptors[0].rate_limit", "a merge (<<) takes a mapping or a list of mappings (got an integer)"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {<<: [5]}\n", "descriptors[0].rate_limit", "a merge (<<) takes a mapping or a list of mappings (got an integer)"},
		{"domain: d\nx: &m {<<: *m}\n", "x", "unknown field \"x\""},
		{"domain: d\nkey: &m {<<: *m}\n", "key", "alias *m contains itself"},
		{"domain: d\n? [a]\n: 1\n", "", "a mapping key must be a string (got a list)"},
	}
	for _, tt := range bad {
		le := loadErrors(t, "m.yaml", []byte(tt.text))
		found := false
		for _, fe := range le.Errors {
			found = found || (fe.Path == tt.path && strings.Contains(fe.Reason, tt.reason))
		}
		if !found {
			t.Errorf("%q: errors %v\nwant one at path %q with reason containing %q", tt.text, le, tt.path, tt.reason)
		}
	}
}

func TestDefaultsBlock(t *testing.T) {
	c := mustParse(t, `
poplimit: {algorithm: token_bucket, mode: async, action: block, fail: closed}
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: j
    rate_limit: {unit: minute, requests_per_unit: 6, mode: sync, action: throttle, algorithm: sliding_log}
  - key: u
    rate_limit: {unlimited: true}
`)
	k := c.Lookup("d", es("k", "v")).Limit
	if k.Algorithm != policy.TokenBucket || k.Burst != 6 || k.Mode != policy.Async || k.Action != policy.Block || k.Timeout != k.Window || k.Fail != policy.FailClosed {
		t.Errorf("k = %+v, want the file's defaults", k)
	}
	j := c.Lookup("d", es("j", "v")).Limit
	if j.Algorithm != policy.SlidingLog || j.Burst != 0 || j.Mode != policy.Sync || j.Action != policy.Throttle || j.Timeout != 0 || j.Fail != policy.FailClosed {
		t.Errorf("j = %+v, want its own values over the file's", j)
	}
	u := c.Lookup("d", es("u", "v")).Limit
	if u.Algorithm != policy.FixedWindow || u.Mode != policy.Sync || u.Action != policy.Block || u.Timeout != 0 || u.Fail != policy.FailOpen {
		t.Errorf("unlimited u = %+v, want no extension", u)
	}
	for _, bad := range []string{"{algorithm: x}", "{mode: x}", "{action: x}", "{fail: x}"} {
		if _, err := Parse("p.yaml", []byte("poplimit: "+bad+"\ndomain: d\n")); !errors.Is(err, ErrInvalid) {
			t.Errorf("poplimit: %s: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := Parse("p.yaml", []byte("poplimit: ~\ndomain: d\n")); err != nil {
		t.Errorf("poplimit: ~: %v", err)
	}
}

// TestDeep checks descriptors deeper than a Match holds inline.
func TestDeep(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n")
	indent := "  "
	var entries []Entry
	for i := 0; i < 12; i++ {
		k := "k" + itoa(int64(i))
		b.WriteString(indent + "- key: " + k + "\n")
		entries = append(entries, Entry{Key: k, Value: "*"})
		if i == 11 {
			b.WriteString(indent + "  share_threshold: false\n")
			b.WriteString(indent + "  rate_limit: {unit: second, requests_per_unit: 12}\n")
			break
		}
		b.WriteString(indent + "  descriptors:\n")
		indent += "    "
	}
	c := mustParse(t, b.String())
	checkAnswer(t, c, "deep", entries, answer{found: true, rpu: 12, stats: "deep.k0.k1.k2.k3.k4.k5.k6.k7.k8.k9.k10.k11"})
	compare(t, c, "deep", entries)
	checkAnswer(t, c, "deep", entries[:11], answer{})
}

func TestEmptyAndNil(t *testing.T) {
	var nilCfg *Config
	if m := nilCfg.Lookup("d", es("k", "v")); m.Found() || nilCfg.HasDomain("d") || !nilCfg.Empty() ||
		nilCfg.Domains() != nil || nilCfg.Limits() != nil || nilCfg.Warnings() != nil {
		t.Errorf("a nil Config answers something")
	}
	c, err := Load(nil)
	if err != nil || !c.Empty() {
		t.Errorf("Load(nil) = %v, %v; want an empty Config", c, err)
	}
	for _, text := range []string{"", "# only a comment\n", "~\n"} {
		le := loadErrors(t, "e.yaml", []byte(text))
		if fe := le.Errors[0]; !strings.Contains(fe.Reason, "config file cannot have empty domain") {
			t.Errorf("%q: %s, want the empty domain error", text, fe)
		}
	}
	var m Match
	if m.AppendCounterKey(nil) != nil || m.AppendStatsKey(nil) != nil || m.AppendCacheKey(nil, "p", time.Time{}) != nil {
		t.Errorf("the zero Match appends keys")
	}
	if got := Unit(42).String(); got != "unit(42)" {
		t.Errorf("Unit(42).String() = %q", got)
	}
	// The action names map to policy's: "count" is Block without a
	// timeout, "throttle" and "block" are policy's own.
	for i, name := range actionNames {
		a, count := actionOf(i)
		if want := name == "count"; count != want || (!count && a.String() != name) || (count && a != policy.Block) {
			t.Errorf("action %q: actionOf = %v, count %v", name, a, count)
		}
	}
}
