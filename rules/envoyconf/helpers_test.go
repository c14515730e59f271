package envoyconf

import (
	"os"
	"path/filepath"
	"testing"
)

// readFixture returns testdata/<path>.
func readFixture(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mustLoad loads fixtures as one Config.
func mustLoad(t testing.TB, paths ...string) *Config {
	t.Helper()
	files := make(map[string][]byte, len(paths))
	for _, p := range paths {
		files[p] = readFixture(t, p)
	}
	c, err := Load(files)
	if err != nil {
		t.Fatalf("Load(%v): %v", paths, err)
	}
	return c
}

// mustParse parses YAML text.
func mustParse(t testing.TB, text string) *Config {
	t.Helper()
	c, err := Parse("inline.yaml", []byte(text))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, text)
	}
	return c
}

// es builds entries from key, value pairs.
func es(kv ...string) []Entry {
	out := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// answer is what one lookup is expected to give; zero fields are not
// checked, except that rpu is checked whenever found is.
type answer struct {
	found     bool
	rpu       uint32
	unit      Unit
	unlimited bool
	shadow    bool
	name      string
	fullKey   string
	stats     string
	counter   string
}

func checkAnswer(t *testing.T, c *Config, domain string, entries []Entry, want answer) {
	t.Helper()
	m := c.Lookup(domain, entries)
	if got := m.Found(); got != want.found {
		t.Fatalf("Lookup(%q, %v).Found() = %v, want %v", domain, entries, got, want.found)
	}
	if !want.found {
		return
	}
	l := m.Limit
	if l.RequestsPerUnit != want.rpu {
		t.Errorf("Lookup(%q, %v): requests_per_unit = %d, want %d", domain, entries, l.RequestsPerUnit, want.rpu)
	}
	if want.unit != UnitUnknown && l.Unit != want.unit {
		t.Errorf("Lookup(%q, %v): unit = %v, want %v", domain, entries, l.Unit, want.unit)
	}
	if l.Unlimited != want.unlimited {
		t.Errorf("Lookup(%q, %v): unlimited = %v, want %v", domain, entries, l.Unlimited, want.unlimited)
	}
	if l.ShadowMode != want.shadow {
		t.Errorf("Lookup(%q, %v): shadow = %v, want %v", domain, entries, l.ShadowMode, want.shadow)
	}
	if l.Name != want.name {
		t.Errorf("Lookup(%q, %v): name = %q, want %q", domain, entries, l.Name, want.name)
	}
	if want.fullKey != "" && l.FullKey != want.fullKey {
		t.Errorf("Lookup(%q, %v): FullKey = %q, want %q", domain, entries, l.FullKey, want.fullKey)
	}
	if want.stats != "" {
		if got := string(m.AppendStatsKey(nil)); got != want.stats {
			t.Errorf("Lookup(%q, %v): stats key = %q, want %q", domain, entries, got, want.stats)
		}
	}
	if want.counter != "" {
		if got := string(m.AppendCounterKey(nil)); got != want.counter {
			t.Errorf("Lookup(%q, %v): counter key = %q, want %q", domain, entries, got, want.counter)
		}
	}
}
