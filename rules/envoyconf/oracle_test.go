package envoyconf

import (
	"strings"
	"testing"
)

// oracle answers a lookup the plain way, shaped like ratelimit's GetLimit
// and GenerateCacheKey (src/config/config_impl.go, src/limiter/cache_key.go):
// strings concatenated, a map of share patterns, the two metric keys built
// along the walk. Lookup and the Append methods must agree with it.
func oracle(c *Config, domain string, entries []Entry) (lim *Limit, stats, counter string) {
	d := c.domains[domain]
	if d == nil {
		return nil, "", ""
	}
	children := d.root.children
	prev := &d.root
	detailedKey := domain
	valueKey := domain
	sharePatterns := map[int]string{}
	var patterns []string
	for i, e := range entries {
		finalKey := e.Key + "_" + e.Value
		detailedKey += "." + finalKey
		next := children[finalKey]
		matchedWildcard := ""
		if next == nil {
			for _, w := range prev.wild {
				if oracleWildcard(strings.Split(w.node.finalKey, "*"), finalKey) {
					next = children[w.node.finalKey]
					matchedWildcard = w.node.finalKey
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = children[e.Key]
			byValue = false
		}
		if matchedWildcard != "" && next != nil && next.share {
			sharePatterns[i] = strings.TrimPrefix(next.finalKey, e.Key+"_")
		}
		valueKey += "."
		if next != nil {
			use := ""
			switch {
			case matchedWildcard != "" && sharePatterns[i] != "":
				use = sharePatterns[i]
			case matchedWildcard != "" && next.valueToMetric:
				use = e.Value
			case matchedWildcard != "":
				use = strings.TrimPrefix(matchedWildcard, e.Key+"_")
			case byValue:
				use = e.Value
			case next.valueToMetric:
				use = e.Value
			}
			valueKey += e.Key
			if use != "" {
				valueKey += "_" + use
			}
		} else {
			valueKey += e.Key
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			lim = next.limit
			if len(sharePatterns) > 0 {
				patterns = make([]string, len(entries))
				for k, v := range sharePatterns {
					patterns[k] = v
				}
			}
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		children = next.children
		prev = next
	}
	if lim == nil {
		return nil, "", ""
	}
	switch {
	case lim.DetailedMetric && patterns != nil:
		stats = domain
		for i, e := range entries {
			stats += "."
			if patterns[i] != "" {
				stats += e.Key + "_" + patterns[i]
			} else {
				stats += e.Key
				if e.Value != "" {
					stats += "_" + e.Value
				}
			}
		}
	case lim.DetailedMetric:
		stats = detailedKey
	default:
		stats = valueKey
	}
	counter = domain + "_"
	for i, e := range entries {
		v := e.Value
		if patterns != nil && patterns[i] != "" {
			v = patterns[i]
		}
		counter += e.Key + "_" + v + "_"
	}
	return lim, stats, counter
}

// oracleWildcard is ratelimit's wildcardMatch, step by step.
func oracleWildcard(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	if !strings.HasPrefix(value, parts[0]) || !strings.HasSuffix(value, parts[len(parts)-1]) {
		return false
	}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if len(value) < total {
		return false
	}
	remaining := value[len(parts[0]):]
	if last := parts[len(parts)-1]; last != "" {
		remaining = remaining[:len(remaining)-len(last)]
	}
	for _, part := range parts[1 : len(parts)-1] {
		idx := strings.Index(remaining, part)
		if idx < 0 {
			return false
		}
		remaining = remaining[idx+len(part):]
	}
	return true
}

// compare checks Lookup against the oracle for one descriptor.
func compare(t *testing.T, c *Config, domain string, entries []Entry) {
	t.Helper()
	lim, stats, counter := oracle(c, domain, entries)
	m := c.Lookup(domain, entries)
	if m.Limit != lim {
		t.Fatalf("Lookup(%q, %q).Limit = %+v, oracle %+v", domain, entries, m.Limit, lim)
	}
	if got := string(m.AppendStatsKey(nil)); got != stats {
		t.Fatalf("Lookup(%q, %q) stats key = %q, oracle %q", domain, entries, got, stats)
	}
	if got := string(m.AppendCounterKey(nil)); got != counter {
		t.Fatalf("Lookup(%q, %q) counter key = %q, oracle %q", domain, entries, got, counter)
	}
}

// quirks are configurations whose answers follow from ratelimit's composite
// keys ("key_value" strings) rather than from what they seem to say.
const quirks = `
domain: quirk
descriptors:
  - key: a_b            # stored as "a_b": the entry (a, b) looks that up first
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: c*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: "x*"           # a wildcard in the key: any composite starting with x
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: ""           # an empty value is no value
    descriptors:
      - key: k
        value: "*"
        detailed_metric: true
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 4}
  - key: e
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 5}
`

func quirkConfig(t testing.TB) *Config {
	t.Helper()
	files := map[string][]byte{"quirk.yaml": []byte(quirks)}
	for _, p := range []string{"ratelimit/basic.yaml", "ratelimit/wildcard.yaml", "ratelimit/share.yaml", "ratelimit/value_to_metric.yaml", "readme/ex2.yaml", "readme/ex8.yaml", "readme/ex9c.yaml"} {
		files[p] = readFixture(t, p)
	}
	c, err := Loader{MergeDomains: true}.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestQuirks(t *testing.T) {
	c := quirkConfig(t)
	tests := []struct {
		entries []Entry
		want    answer
	}{
		{es("a", "b"), answer{found: true, rpu: 1, stats: "quirk.a_b", counter: "quirk_a_b_"}},
		{es("a_b", "zzz"), answer{found: true, rpu: 1, stats: "quirk.a_b", counter: "quirk_a_b_zzz_"}},
		{es("a", "cat"), answer{found: true, rpu: 2, stats: "quirk.a_c*", counter: "quirk_a_c*_"}},
		{es("a_c", "at"), answer{found: true, rpu: 2, stats: "quirk.a_c_a_c*", counter: "quirk_a_c_a_c*_"}},
		{es("xyz", "1"), answer{found: true, rpu: 3, stats: "quirk.xyz_1", counter: "quirk_xyz_1_"}},
		{es("k", "v", "k", "w"), answer{found: true, rpu: 4, stats: "quirk.k_v.k_*", counter: "quirk_k_v_k_*_"}},
		{es("k", "", "k", ""), answer{found: true, rpu: 4, stats: "quirk.k.k_*", counter: "quirk_k__k_*_"}},
		{es("e", ""), answer{found: true, rpu: 5, stats: "quirk.e_", counter: "quirk_e__"}},
	}
	for _, tt := range tests {
		checkAnswer(t, c, "quirk", tt.entries, tt.want)
		compare(t, c, "quirk", tt.entries)
	}
}

// FuzzLookup compares Lookup with the oracle for descriptors of up to four
// entries made of the fuzzer's strings, in the domains of quirkConfig.
func FuzzLookup(f *testing.F) {
	seeds := []struct {
		domain uint8
		n      uint8
		kv     [8]string
	}{
		{0, 2, [8]string{"key1", "value1", "subkey1", "subvalue1"}},
		{0, 1, [8]string{"wild", "foo1"}},
		{0, 3, [8]string{"path", "path/foo", "file", "file/doc1", "type", "pdf"}},
		{0, 3, [8]string{"route", "draw", "http_method", "GET", "subject_id", "1"}},
		{0, 2, [8]string{"tenant", "t99prod", "resource", "resBBBv2"}},
		{1, 2, [8]string{"k", "", "k", "x"}},
		{1, 1, [8]string{"a", "cat"}},
		{1, 1, [8]string{"x_", "*"}},
		{2, 2, [8]string{"message_type", "marketing", "to_number", "1"}},
		{3, 1, [8]string{"route", "/api/v1/resource/1/action"}},
		{4, 1, [8]string{"key1", "v"}},
	}
	for _, s := range seeds {
		f.Add(s.domain, s.n, s.kv[0], s.kv[1], s.kv[2], s.kv[3], s.kv[4], s.kv[5], s.kv[6], s.kv[7])
	}
	c := quirkConfig(f)
	domains := []string{"test-domain", "quirk", "messaging", "example9", "example8", "vtm", "nope"}
	f.Fuzz(func(t *testing.T, domain, n uint8, k0, v0, k1, v1, k2, v2, k3, v3 string) {
		kv := []string{k0, v0, k1, v1, k2, v2, k3, v3}
		entries := es(kv[:2*int(n%5)]...)
		compare(t, c, domains[int(domain)%len(domains)], entries)
	})
}
