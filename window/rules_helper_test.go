package window

import (
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/poplimit/poplimit/internal/mix"
	"github.com/poplimit/poplimit/policy"
	"go.yaml.in/yaml/v3"
)

// The Limiter's tests write their policies as rule files do (package rules
// parses those and imports window, so these tests cannot import it): a
// testRule is a Policy with a name and a key hash of its own.
type testRule struct {
	Policy
	Name string
	seed uint64
}

// Hash returns key's 64-bit identity under the rule, as rules.Rule.Hash does.
func (r *testRule) Hash(key []byte) uint64 { return mix.Mix64(xxhash.Sum64(key) ^ r.seed) }

type testRules struct{ Rules []*testRule }

func mustRules(t testing.TB, doc string) *testRules {
	t.Helper()
	var f struct {
		Rules []struct {
			Name, Kind, Window, Algorithm, Action, Timeout, Mode, Fail, Lease string
			Limit, Burst                                                      uint64
		}
	}
	if err := yaml.Unmarshal([]byte(doc), &f); err != nil {
		t.Fatalf("rules: %v", err)
	}
	dur := func(s string, def time.Duration) time.Duration {
		if s == "" {
			return def
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
		return d
	}
	enum := func(err error) {
		if err != nil {
			t.Fatalf("rules: %v", err)
		}
	}
	rs := &testRules{}
	for _, y := range f.Rules {
		r := &testRule{Name: y.Name, seed: xxhash.Sum64String(y.Name)}
		var err error
		r.Algorithm, err = policy.Parse[policy.Algorithm](y.Algorithm)
		enum(err)
		r.Action, err = policy.Parse[policy.Action](y.Action)
		enum(err)
		r.Mode, err = policy.Parse[policy.Mode](y.Mode)
		enum(err)
		r.Fail, err = policy.Parse[policy.Fail](y.Fail)
		enum(err)
		r.Lease = dur(y.Lease, 30*time.Second)
		r.Window = dur(y.Window, r.Lease)
		r.Limit, r.Burst, r.Timeout = y.Limit, y.Burst, dur(y.Timeout, r.Window)
		if r.Burst == 0 {
			r.Burst = r.Limit
		}
		rs.Rules = append(rs.Rules, r)
	}
	return rs
}

func (rs *testRules) Lookup(name string) *testRule {
	for _, r := range rs.Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}
