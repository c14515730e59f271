package rules

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/policy"
)

func TestParseRulesValid(t *testing.T) {
	data, err := os.ReadFile("testdata/rules-valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseRules(data)
	if err != nil {
		t.Fatalf("ParseRules: %v", err)
	}
	if !rs.MatchAll || len(rs.Rules) != 5 {
		t.Fatalf("got MatchAll=%v and %d rules, want true and 5", rs.MatchAll, len(rs.Rules))
	}
	api := rs.Rules[0]
	if api.Host != "api.example.com" || api.PathPrefix != "/v1/" || strings.Join(api.Methods, ",") != "GET,POST" {
		t.Errorf("api match = %q %q %v", api.Host, api.PathPrefix, api.Methods)
	}
	if len(api.Key) != 2 || api.Key[0] != (KeyPart{KeyHeader, "X-API-Key"}) || api.Key[1] != (KeyPart{Source: KeyIP}) || api.MissingKey != MissingKeyDeny {
		t.Errorf("api key = %+v missing %v", api.Key, api.MissingKey)
	}
	if api.Limit != 100 || api.Window != time.Minute || api.Algorithm != policy.SlidingWindow || api.Action != policy.Throttle || api.Mode != policy.Async || api.Fail != policy.FailOpen || api.Cost != 1 {
		t.Errorf("api defaults = %+v", api)
	}
	login := rs.Rules[1]
	if login.Mode != policy.Sync || login.Fail != policy.FailClosed || login.Key[0] != (KeyPart{KeyCookie, "session"}) || login.Key[1] != (KeyPart{KeyQuery, "user"}) {
		t.Errorf("login = %+v", login)
	}
	m := rs.Rules[2]
	if m.Action != policy.Block || m.Timeout != 10*time.Minute || m.CostHeader != "X-Cost" || m.MaxCost != 50 {
		t.Errorf("mitigation = %+v", m)
	}
	if b := rs.Rules[3]; b.Algorithm != policy.TokenBucket || b.Burst != 20 || !b.Shadow {
		t.Errorf("bucket = %+v", b)
	}
	if d := rs.Rules[4]; d.Window != 24*time.Hour || d.Algorithm != policy.FixedWindow || d.Timeout != d.Window {
		t.Errorf("daily = %+v", d)
	}
	if rs.Lookup("login") != login || rs.Lookup("nope") != nil {
		t.Error("Lookup by name failed")
	}
	if api.Seed == login.Seed || api.Hash([]byte("k")) == login.Hash([]byte("k")) {
		t.Error("two rules hash one key alike")
	}
}

func TestParseRulesReportsEveryField(t *testing.T) {
	data, err := os.ReadFile("testdata/rules-invalid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ParseRules(data)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v, want an error wrapping ErrInvalid", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`match: must be "first" or "all" (got "some")`,
		"rules[0].name: is required",
		"rules[0].limit: must be between 1 and 4294967295 (got 0)",
		`rules[1].name: only letters, digits and -_.:/ are allowed (got "bad window")`,
		`rules[1].window: must be a duration of whole milliseconds between 1ms and 366d (got "-5s")`,
		`rules[1].algorithm: must be one of sliding_window, fixed_window, token_bucket, leaky_bucket, sliding_log (got "magic")`,
		`rules[1].action: must be one of throttle, block, delay (got "ban")`,
		`rules[1].mode: must be one of async, sync (got "eventually")`,
		`rules[1].fail: must be one of open, closed (got "maybe")`,
		`rules[2].key[0]: "ip" takes no name (got "ip:x")`,
		`rules[2].key[1]: needs a name, as in "header:NAME" (got "header:")`,
		`rules[2].key[2]: must be "ip", "header:NAME", "query:NAME", "cookie:NAME", "form:NAME" or "json:/POINTER" (got "bogus")`,
		`rules[2].key[3]: name is not a valid token (got "header:Bad Header")`,
		`rules[2].timeout: applies only to action: block (got "1m")`,
		`rules[2].path_prefix: must start with "/" (got "v1")`,
		`rules[2].methods[0]: is not an HTTP method (got "G3T")`,
		`rules[4].mode: a sliding_log runs in sync mode only (exact across edges, one store operation per request); use sliding_window for an async limit (got async)`,
		`rules[4].limit: a sliding_log keeps every request's instant and takes at most 1000 per window; use sliding_window for large limits (got 2000)`,
		`rules[4].tiers.pro: must be between 1 and 4294967295 (got -1)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}
}

func TestParseRulesRejectsMalformedYAML(t *testing.T) {
	for _, in := range []string{"", "rules: {", "rules: [{name: a, limit: 1, window: 1m, colour: red}]", "rules: 5", "\x00\xff"} {
		if _, err := ParseRules([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRules(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestDuplicateRuleNamesRejected(t *testing.T) {
	_, err := ParseRules([]byte("rules: [{name: a, limit: 1, window: 1m}, {name: a, limit: 2, window: 1m}]"))
	if err == nil || !strings.Contains(err.Error(), `rules[1].name: duplicates rules[0] (got "a")`) {
		t.Errorf("got %v", err)
	}
}

func TestRuleMatches(t *testing.T) {
	rs := mustRules(t, `
rules:
  - {name: a, host: api.example.com, path_prefix: /v1/, methods: [GET], limit: 1, window: 1m}
  - {name: fold, path_prefix: /Login, path_case: insensitive, methods: [POST, head], limit: 1, window: 1m}
`)
	a, fold := rs.Rules[0], rs.Rules[1]
	tests := []struct {
		r                  *Rule
		host, method, path string
		want               bool
	}{
		{a, "api.example.com", "GET", "/v1/users", true},
		{a, "API.Example.COM", "GET", "/v1/", true},
		{a, "api.example.com", "HEAD", "/v1/users", true}, // GET covers HEAD
		{a, "api.example.com", "POST", "/v1/users", false},
		{a, "api.example.com", "get", "/v1/users", false}, // methods are case-sensitive
		{a, "api.example.com", "GET", "/v2/users", false},
		{a, "api.example.com", "GET", "/V1/users", false}, // paths are case-sensitive by default
		{a, "api.example.com", "GET", "/v1", false},
		{a, "www.example.com", "GET", "/v1/users", false},
		{fold, "x", "POST", "/login", true},
		{fold, "x", "POST", "/LOGIN/x", true},
		{fold, "x", "HEAD", "/lOgIn", true},
		{fold, "x", "GET", "/login", false}, // HEAD does not cover GET
		{fold, "x", "POST", "/logi", false},
		{fold, "x", "POST", "/lo\xc7in", false},
	}
	for _, tt := range tests {
		if got := tt.r.Matches([]byte(tt.host), []byte(tt.method), []byte(tt.path)); got != tt.want {
			t.Errorf("%s.Matches(%q, %q, %q) = %v, want %v", tt.r.Name, tt.host, tt.method, tt.path, got, tt.want)
		}
	}
	host, head, path := []byte("x"), []byte("HEAD"), []byte("/LOGIN/x")
	if n := testing.AllocsPerRun(100, func() { fold.Matches(host, head, path) }); n != 0 {
		t.Errorf("Matches under path_case: insensitive: %v allocs/op, want 0", n)
	}
}

func TestParseRulesKeyAndMatchOptions(t *testing.T) {
	rs := mustRules(t, `
rules:
  - {name: d, key: ["header:K"], limit: 1, window: 1m}
  - {name: r, key: ["header:K"], duplicate_key: refuse, limit: 1, window: 1m}
  - {name: f, key: ["query:k", ip], duplicate_key: first, limit: 1, window: 1m}
  - {name: l, key: ["cookie:k"], duplicate_key: last, path_prefix: /a, path_case: insensitive, limit: 1, window: 1m}
  - {name: s, path_prefix: /a, path_case: sensitive, limit: 1, window: 1m}
  - {name: q, key: ["query:k"], query_semicolon: split, key_trim: unicode, limit: 1, window: 1m}
`)
	if q := rs.Rules[5]; q.QuerySemicolon != QuerySemicolonSplit || q.KeyTrim != KeyTrimUnicode || rs.Rules[0].QuerySemicolon != QuerySemicolonKeep || rs.Rules[0].KeyTrim != KeyTrimNone {
		t.Errorf("query_semicolon, key_trim: %v %v, default %v %v", q.QuerySemicolon, q.KeyTrim, rs.Rules[0].QuerySemicolon, rs.Rules[0].KeyTrim)
	}
	for i, want := range []struct {
		dup  DuplicateKey
		fold bool
	}{{DuplicateKeyRefuse, false}, {DuplicateKeyRefuse, false}, {DuplicateKeyFirst, false}, {DuplicateKeyLast, true}, {DuplicateKeyRefuse, false}} {
		if r := rs.Rules[i]; r.DuplicateKey != want.dup || r.PathFold != want.fold {
			t.Errorf("rule %s: duplicate_key %v, path fold %v; want %v, %v", r.Name, r.DuplicateKey, r.PathFold, want.dup, want.fold)
		}
	}
}

// Every bad number, cost and empty file is reported naming the field and
// the reason, in the words an operator reads.
func TestParseRulesNumberAndCostMessages(t *testing.T) {
	const head = "rules: [{name: a, window: 1m, "
	tests := []struct{ in, want string }{
		{"", "rules: at least one rule is required; the file holds no YAML document (it is empty or only comments)"},
		{"# nothing yet\n", "rules: at least one rule is required; the file holds no YAML document (it is empty or only comments)"},
		{"rules: []", "rules: at least one rule is required"},
		{head + "limit: 1.5}]", "rules[0].limit: must be a whole number between 1 and 4294967295 (got 1.5)"},
		{head + "limit: 1e3}]", "rules[0].limit: must be a whole number between 1 and 4294967295 (got 1e3)"},
		{head + "limit: \"100\"}]", `rules[0].limit: must be a whole number between 1 and 4294967295 (got "100")`},
		{head + "limit: [1]}]", "rules[0].limit: must be a whole number between 1 and 4294967295 (got a list)"},
		{head + "limit: 18446744073709551616}]", "rules[0].limit: must be between 1 and 4294967295 (got 18446744073709551616)"},
		{head + "limit: 18446744073709551615}]", "rules[0].limit: must be between 1 and 4294967295 (got 18446744073709551615)"},
		{head + "limit: 4294967296}]", "rules[0].limit: must be between 1 and 4294967295 (got 4294967296)"},
		{head + "limit: 010}]", "rules[0].limit: must be a whole number between 1 and 4294967295 written without a leading zero (YAML reads 010 as octal 8) (got 010)"},
		{head + "limit: 10, burst: 2.5, algorithm: token_bucket}]", "rules[0].burst: must be a whole number between 1 and 4294967295 (got 2.5)"},
		{head + "limit: 10, cost: 0.5}]", "rules[0].cost: must be a whole number between 1 and 4294967295 (got 0.5)"},
		{head + "limit: 10, ipv6_prefix: 56.5}]", "rules[0].ipv6_prefix: must be a whole number between 8 and 128 bits (got 56.5)"},
		{head + "limit: 10, tiers: {pro: 1.5}}]", "rules[0].tiers.pro: must be a whole number between 1 and 4294967295 (got 1.5)"},
		{"shedding: {max_in_flight: 2.5}\n" + head + "limit: 10}]", "shedding.max_in_flight: must be a whole number between 0 and 16777216 (0: off) (got 2.5)"},
		{head + "limit: 10, cost: 11}]", "rules[0].cost: must be at most the limit, 10, or every request is refused (got 11)"},
		{head + "limit: 10, burst: 3, algorithm: token_bucket, cost: 4}]", "rules[0].cost: must be at most the burst, 3, or every request is refused (got 4)"},
		{head + "limit: 10, cost: 5, tiers: {free: 4, pro: 100}}]", "rules[0].tiers.free: must be at least 5 (a request costs 5), or every request of the tier is refused (got 4)"},
		{head + "limit: 10, cost_header: X-Cost, max_cost: 11}]", "rules[0].max_cost: must be at most the limit, 10: a request costing more is refused on every try (got 11)"},
		{head + "limit: 10, cost_header: X-Cost, max_cost: 101, tiers: {pro: 100}}]", "rules[0].max_cost: must be at most the largest limit of the rule and its tiers, 100: a request costing more is refused on every try (got 101)"},
		{head + "limit: 10}]\n---\nrules: []\n", "file: a rules file is one YAML document; this one holds more after a ---, which would be ignored"},
		{head + "limit: 10, duplicate_key: twice, key: [\"header:K\"]}]", `rules[0].duplicate_key: must be one of refuse, first, last (got "twice")`},
		{head + "limit: 10, duplicate_key: last}]", `rules[0].duplicate_key: applies only to rules keyed by a header, query parameter or cookie (got "last")`},
		{head + "limit: 10, query_semicolon: yes, key: [\"query:k\"]}]", `rules[0].query_semicolon: must be one of keep, split (got "yes")`},
		{head + "limit: 10, query_semicolon: split, key: [\"header:K\"]}]", `rules[0].query_semicolon: applies only to rules keyed by a query parameter (got "split")`},
		{head + "limit: 10, key_trim: all, key: [\"header:K\"]}]", `rules[0].key_trim: must be one of none, unicode (got "all")`},
		{head + "limit: 10, key_trim: unicode}]", `rules[0].key_trim: applies only to rules keyed by a header, query parameter or cookie (got "unicode")`},
		{head + "limit: 10, path_case: upper, path_prefix: /a}]", `rules[0].path_case: must be "sensitive" or "insensitive" (got "upper")`},
		{head + "limit: 10, path_case: insensitive}]", `rules[0].path_case: applies only to rules with path_prefix (got "insensitive")`},
	}
	for _, tt := range tests {
		_, err := ParseRules([]byte(tt.in))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRules(%q) = %v, want ErrInvalid", tt.in, err)
			continue
		}
		got := err.Error()
		if !strings.HasPrefix(got, "rules: invalid configuration:\n") || !strings.Contains(got, "\n"+tt.want) {
			t.Errorf("ParseRules(%q):\n got %q\nwant rules: invalid configuration:\\n%s", tt.in, got, tt.want)
		}
	}
	// What still parses: the whole numbers YAML writes, a trailing ---,
	// a cost equal to the capacity.
	for _, in := range []string{
		head + "limit: 1_000}]", head + "limit: 0x10}]", head + "limit: +7}]",
		head + "limit: 10}]\n---\n", head + "limit: 10, cost: 10}]",
		head + "limit: 10, burst: 3, algorithm: leaky_bucket, action: delay, cost: 4}]",
		head + "limit: 10, cost: 5, tiers: {free: 5}, cost_header: X-C, max_cost: 10}]",
	} {
		if _, err := ParseRules([]byte(in)); err != nil {
			t.Errorf("ParseRules(%q): %v", in, err)
		}
	}
}

func TestLimitForTiers(t *testing.T) {
	rs := mustRules(t, "rules: [{name: a, limit: 100, window: 1d, tiers: {free: 100, pro: 10000}}, {name: b, limit: 7, window: 1m}]")
	ov, err := ParseOverrides([]byte("overrides:\n  key-pro: pro\n  key-odd: gold\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs.Overrides = ov
	a, b := rs.Rules[0], rs.Rules[1]
	for _, tt := range []struct {
		r    *Rule
		key  string
		want uint64
	}{{a, "key-pro", 10000}, {a, "anyone", 100}, {a, "key-odd", 100}, {b, "key-pro", 7}} {
		if got := rs.LimitFor(tt.r, []byte(tt.key)); got != tt.want {
			t.Errorf("LimitFor(%s, %q) = %d, want %d", tt.r.Name, tt.key, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { rs.LimitFor(a, []byte("key-pro")) }); n != 0 {
		t.Errorf("LimitFor: %v allocs/op, want 0", n)
	}
	if _, err := ParseOverrides([]byte("overrides: {k: \"bad tier\"}")); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad tier name: got %v, want ErrInvalid", err)
	}
}

func FuzzParseRules(f *testing.F) {
	for _, name := range []string{"testdata/rules-valid.yaml", "testdata/rules-invalid.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("rules: [{name: a, limit: 1, window: 1m}]"))
	f.Add([]byte("rules: [{name: a, limit: 99999999999999999999, window: 9999999h}]"))
	for _, s := range []string{
		"", "# comment only\n",
		"rules: [{name: a, limit: 1.5, window: 1m}]",
		"rules: [{name: a, limit: 18446744073709551616, window: 1m}]",
		"rules: [{name: a, limit: 010, window: 1m}]",
		"rules: [{name: a, limit: 10, window: 1m, cost: 11}]",
		"rules: [{name: a, limit: 10, window: 1m, cost: 5, tiers: {free: 4}}]",
		"rules: [{name: a, limit: 10, window: 1m, cost_header: X, max_cost: 11}]",
		"rules: [{name: a, limit: 10, window: 1s, burst: 3, algorithm: token_bucket, cost: 4}]",
		"rules: [{name: a, limit: 1, window: 1m}]\n---\nrules: [{name: b, limit: 1, window: 1m}]",
		"rules: [{name: a, limit: 1, window: 1m, key: [\"header:K\"], duplicate_key: last, path_prefix: /a, path_case: insensitive}]",
		"shedding: {max_in_flight: 1.5}\nrules: [{name: a, limit: 1, window: 1m}]",
		"rules: [{name: a, limit: 1, window: 1m, key: [\"query:k\", \"cookie:c\"], query_semicolon: split, key_trim: unicode}]",
		"rules: [{name: a, limit: 1, window: 1m, query_semicolon: split, key_trim: none}]",
	} {
		f.Add([]byte(s))
	}
	// Files large enough to be counted before they are decoded: a valid
	// one, and one of MaxRules+1 rules.
	pad := "#" + strings.Repeat("x", countRulesFrom) + "\n"
	f.Add([]byte(pad + "rules: [{name: a, limit: 1, window: 1m}]"))
	var many strings.Builder
	many.WriteString(pad + "rules:\n")
	for i := 0; i <= MaxRules; i++ {
		fmt.Fprintf(&many, "  - {name: r%d, limit: 1, window: 1m}\n", i)
	}
	f.Add([]byte(many.String()))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := ParseRules(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if len(rs.Rules) > MaxRules {
			t.Fatalf("accepted %d rules", len(rs.Rules))
		}
		for _, r := range rs.Rules {
			if r.Limit == 0 || r.Window <= 0 || r.Name == "" || len(r.Key) == 0 || r.Cost == 0 {
				t.Fatalf("accepted an unusable rule %+v", r)
			}
			bucket := r.Algorithm == policy.TokenBucket || r.Algorithm == policy.LeakyBucket
			if r.Kind == Rate && !bucket && (r.Cost > r.Limit || r.CostHeader != "" && r.MaxCost > r.Limit && len(r.Tiers) == 0) {
				t.Fatalf("accepted rule %s whose cost %d or max_cost %d exceeds its limit %d", r.Name, r.Cost, r.MaxCost, r.Limit)
			}
			for tier, l := range r.Tiers {
				if r.Kind == Rate && !bucket && r.Cost > l {
					t.Fatalf("accepted rule %s whose tier %s (limit %d) is below its cost %d", r.Name, tier, l, r.Cost)
				}
			}
			if r.DuplicateKey > DuplicateKeyLast {
				t.Fatalf("accepted rule %s with duplicate_key %v", r.Name, r.DuplicateKey)
			}
		}
	})
}

func ExampleParseRules() {
	rs, err := ParseRules([]byte(`
rules:
  - name: per-client
    limit: 100
    window: 1m
`))
	if err != nil {
		panic(err)
	}
	r := rs.Rules[0]
	fmt.Println(r.Name, r.Limit, r.Window, r.Algorithm, r.Action, r.Mode, r.Fail)
	// Output: per-client 100 1m0s sliding_window throttle async open
}

func mustRules(t testing.TB, yaml string) *Rules {
	t.Helper()
	rs, err := ParseRules([]byte(yaml))
	if err != nil {
		t.Fatalf("ParseRules: %v", err)
	}
	return rs
}

// FuzzParseOverrides: any input is parsed or refused with ErrInvalid,
// never a panic; what is accepted holds only keys and tiers within bounds.
func FuzzParseOverrides(f *testing.F) {
	f.Add([]byte("overrides:\n  api-key-123: pro\n"))
	f.Add([]byte("overrides: {\"\": pro}"))
	f.Add([]byte("overrides:\n  k: \"not a tier!\"\n"))
	f.Add([]byte("overrides: [1, 2]"))
	f.Add([]byte("nope: 1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ov, err := ParseOverrides(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for k, tier := range ov {
			if k == "" || len(k) > maxOverrideKey || tier == "" || len(tier) > MaxRuleName || !printableName(tier) {
				t.Fatalf("accepted %q: %q", k, tier)
			}
		}
	})
}

func TestParseRulesLogSyncAndDelay(t *testing.T) {
	rs, err := ParseRules([]byte(`
rules:
  - {name: login, limit: 5, window: 1m, algorithm: sliding_log}
  - {name: queue, limit: 10, window: 1s, burst: 5, algorithm: leaky_bucket, action: delay}
  - {name: bucket, limit: 10, window: 1s, burst: 20, algorithm: token_bucket, mode: sync}
`))
	if err != nil {
		t.Fatal(err)
	}
	if rs.Rules[0].Mode != policy.Sync || rs.Rules[1].Action != policy.Delay || rs.Rules[2].Mode != policy.Sync {
		t.Errorf("login mode %v, queue action %v, bucket mode %v", rs.Rules[0].Mode, rs.Rules[1].Action, rs.Rules[2].Mode)
	}
	_, err = ParseRules([]byte(`rules: [{name: q, limit: 10, window: 1s, algorithm: token_bucket, action: delay}]`))
	if err == nil || !strings.Contains(err.Error(), "rules[0].action: queues requests as a leaky bucket: needs algorithm: leaky_bucket, not token_bucket (got delay)") {
		t.Errorf("delay on a token bucket: %v", err)
	}
}
