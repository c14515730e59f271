package envoyconf

import (
	"strings"
	"testing"
)

// The count extension: which responses spend a limit's hits, as a rules
// file's count says; bad values name the field and the reason, and a
// bucket or log that cannot give hits back is refused.
func TestCountExtension(t *testing.T) {
	rs, err := LoadRules(map[string][]byte{"a.yaml": []byte(`
domain: login
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 5, count: {status: [401, 4xx], cost_header: X-Cost}}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	var counting, plain int
	for _, r := range rs.Rules {
		switch {
		case r.Count.On():
			counting++
			if !r.Count.Counts(404) || r.Count.Counts(200) || r.Count.CostHeader != "X-Cost" {
				t.Errorf("rule %s: count %+v", r.Name, r.Count)
			}
		case strings.Contains(r.Name, "plain"):
			plain++
		}
	}
	if counting != 1 || plain != 1 {
		t.Errorf("%d counting and %d plain rules, want 1 and 1", counting, plain)
	}
	for _, tt := range []struct{ rl, want string }{
		{"count: {status: [600]}", `count.status[0]: must be a status code from 100 to 599 or a class 1xx to 5xx (got "600")`},
		{"count: {colour: red}", "count.colour: unknown key: count takes status and cost_header"},
		{"count: 401", "count: must be a mapping of status and cost_header"},
	} {
		_, err := LoadRules(map[string][]byte{"a.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, " + tt.rl + "}\n")})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want it to hold %q", tt.rl, err, tt.want)
		}
	}
}
