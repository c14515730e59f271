package edge_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// A running edge keeps its rules when a reload brings a file with a
// number it would misread, a cost no request can meet, or nothing, and
// the error names the field.
func TestBadNumbersRejectedOnReload(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 2, window: 1m}]"})
	file := e.Options.RulesFile
	for _, tc := range []struct{ file, want string }{
		{"rules: [{name: api, limit: 1.5, window: 1m}]", "rules[0].limit: must be a whole number between 1 and 4294967295 (got 1.5)"},
		{"rules: [{name: api, limit: 18446744073709551616, window: 1m}]", "rules[0].limit: must be between 1 and 4294967295 (got 18446744073709551616)"},
		{"rules: [{name: api, limit: 010, window: 1m}]", "rules[0].limit: must be a whole number between 1 and 4294967295 written without a leading zero"},
		{"rules: [{name: api, limit: 5, window: 1m, cost: 6}]", "rules[0].cost: must be at most the limit, 5, or every request is refused (got 6)"},
		{"", "rules: at least one rule is required; the file holds no YAML document"},
		{"rules: [{name: api, limit: 5, window: 1m}]\n---\nrules: []\n", "file: a rules file is one YAML document"},
		{"rules: [{name: api, limit: 5, window: 1m, duplicate_key: sometimes, key: [\"header:K\"]}]", `rules[0].duplicate_key: must be one of refuse, first, last (got "sometimes")`},
	} {
		if err := os.WriteFile(file, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		err := e.Reload()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "rules: rules:") {
			t.Errorf("reload of %q: %v; want an error with %q", tc.file, err, tc.want)
		}
		if r := e.Rules().Lookup("api"); r == nil || r.Limit != 2 {
			t.Fatalf("after the reload of %q: rule api %+v, want the running one, limit 2", tc.file, r)
		}
	}
	for i, want := range []int{200, 200, 429} {
		if s := get(t, e.addr, "/").StatusCode; s != want {
			t.Errorf("request %d under the running rules: %d, want %d", i, s, want)
		}
	}
	if n := metricSum(t, e, "poplimit_edge_rule_reloads_total", "result", "rejected"); n != 7 {
		t.Errorf("rule_reloads_total{result=rejected} = %v, want 7", n)
	}
}

// A key moves from the free tier to pro while the edge runs: the
// overrides file is reloaded and its next requests get pro's limit.
func TestTiersAndOverridesReload(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	over := filepath.Join(dir, "overrides.yaml")
	os.WriteFile(rules, []byte(`
rules:
  - {name: api, key: ["header:X-API-Key"], limit: 2, window: 1m, tiers: {free: 2, pro: 5}}
`), 0o644)
	os.WriteFile(over, []byte("overrides:\n  other: pro\n"), 0o644)
	e := startEdge(t, edgeOpts{rulesFile: rules, overridesFile: over, reloadPoll: 20 * time.Millisecond})
	send := func(n int) (ok int, limit string) {
		for i := 0; i < n; i++ {
			r := get(t, e.addr, "/check/", "X-API-Key", "k1")
			if r.StatusCode == 200 {
				ok++
			}
			limit = r.Header.Get("X-RateLimit-Limit")
		}
		return ok, limit
	}
	if ok, limit := send(3); ok != 2 || limit != "2" {
		t.Fatalf("free: %d admitted of 3, limit %s; want 2, 2", ok, limit)
	}
	e.blocks.Wait() // the refusal's block is in the cache before the reload clears it
	os.WriteFile(over+".new", []byte("overrides:\n  other: pro\n  k1: pro\n"), 0o644)
	os.Rename(over+".new", over) // replaced whole, as a deploy does
	testenv.WaitFor(t, 5*time.Second, "the overrides file reloaded", func() bool { return e.srv.Rules().Overrides["k1"] == "pro" })
	// Pro's limit over the same window: 5, of which 2 are spent.
	if ok, limit := send(4); ok != 3 || limit != "5" {
		t.Errorf("pro: %d admitted of 4, limit %s; want 3, 5", ok, limit)
	}
	// A bad overrides file is refused whole; the tiers stay.
	os.WriteFile(over, []byte("overrides:\n  k1: \"not a tier!\"\n"), 0o644)
	if err := e.Reload(); err == nil {
		t.Error("bad overrides: want an error")
	}
	if e.srv.Rules().Overrides["k1"] != "pro" {
		t.Error("a rejected overrides file changed the running tiers")
	}
}
