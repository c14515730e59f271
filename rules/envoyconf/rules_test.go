package envoyconf

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/window"
)

func mustRules(t testing.TB, paths ...string) (*rules.Rules, *Index) {
	t.Helper()
	files := make(map[string][]byte, len(paths))
	for _, p := range paths {
		files[p] = readFixture(t, p)
	}
	rs, err := LoadRules(files)
	if err != nil {
		t.Fatalf("LoadRules(%v): %v", paths, err)
	}
	x, ok := DescriptorsOf(rs).(*Index)
	if !ok || x == nil {
		t.Fatalf("DescriptorsOf(LoadRules(%v)) = %v, want the index", paths, DescriptorsOf(rs))
	}
	return rs, x
}

// TestRulesNames checks the names Config.Rules gives: the FullKey when it
// fits the rules alphabet, a cleaned and hashed one otherwise, all valid,
// unique, and the same for the same files.
func TestRulesNames(t *testing.T) {
	paths := []string{"readme/ex2.yaml", "readme/ex3.yaml", "readme/ex9a.yaml", "readme/ex11a.yaml", "ext/switch.yaml"}
	rs, _ := mustRules(t, paths...)
	seen := map[string]bool{}
	for i, r := range rs.Rules {
		if r.Index != i {
			t.Errorf("rule %q: Index = %d, want %d", r.Name, r.Index, i)
		}
		if len(r.Name) == 0 || len(r.Name) > rules.MaxRuleName {
			t.Errorf("rule name %q: %d bytes, want 1 to %d", r.Name, len(r.Name), rules.MaxRuleName)
		}
		for j := 0; j < len(r.Name); j++ {
			if !nameByte(r.Name[j]) {
				t.Errorf("rule name %q: byte %q outside [A-Za-z0-9-_.:/]", r.Name, r.Name[j])
			}
		}
		if seen[r.Name] {
			t.Errorf("rule name %q: given twice", r.Name)
		}
		seen[r.Name] = true
		if string(r.NameBytes()) != r.Name || r.Seed == 0 {
			t.Errorf("rule %q: NameBytes %q, Seed %#x: want them derived (rules.Finish)", r.Name, r.NameBytes(), r.Seed)
		}
	}
	for _, want := range []string{"messaging.message_type_marketing.to_number", "messaging.to_number",
		"edge_proxy_per_ip.remote_address", "edge_proxy_per_ip.remote_address_50.0.0.5", "override:second", "override:week",
		"override:minute:sliding_window:sync:open"} {
		if !seen[want] {
			t.Errorf("no rule named %q among %v", want, names(rs))
		}
	}
	// Wildcards are outside the alphabet: cleaned and hashed.
	if got := ruleName("example9.key1_value*"); !strings.HasPrefix(got, "example9.key1_value_:") || len(got) != len("example9.key1_value_")+nameHashLen {
		t.Errorf("ruleName(wildcard) = %q, want example9.key1_value_:<16 hex>", got)
	}
	long := strings.Repeat("a", 300)
	if got := ruleName(long); len(got) != rules.MaxRuleName || got == ruleName(long+"b") {
		t.Errorf("ruleName of 300 bytes = %q (%d bytes), want 128 bytes, distinct from a longer key's", got, len(got))
	}
	again, _ := mustRules(t, paths...)
	if got, want := names(again), names(rs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("names of a second load = %v, want %v", got, want)
	}
}

func names(rs *rules.Rules) []string {
	var out []string
	for _, r := range rs.Rules {
		out = append(out, r.Name)
	}
	return out
}

// TestRulesPolicy checks each limit's window.Policy.
func TestRulesPolicy(t *testing.T) {
	rs, _ := mustRules(t, "readme/ex2.yaml", "readme/ex3.yaml", "readme/ex6.yaml", "ext/extensions.yaml", "ext/switch.yaml")
	count := window.Policy{Action: policy.Block, Mode: policy.Sync, Algorithm: policy.FixedWindow}
	tests := []struct {
		rule   string
		want   window.Policy
		shadow bool
	}{
		{"messaging.to_number", with(count, 100, 24*time.Hour), false},
		{"edge_proxy_per_ip.remote_address_50.0.0.5", with(count, 0, time.Second), false},
		{"example6.service.user_user-a", with(count, 10, time.Second), true},
		{"edge.remote_address", window.Policy{Limit: 100, Burst: 100, Window: 90 * time.Second, Algorithm: policy.SlidingWindow, Action: policy.Block, Mode: policy.Async}, false},
		{"edge.api_key", window.Policy{Limit: 10, Burst: 50, Window: time.Second, Algorithm: policy.TokenBucket, Action: policy.Block, Mode: policy.Async}, false},
		{"edge.login", window.Policy{Limit: 5, Burst: 5, Window: time.Minute, Algorithm: policy.FixedWindow, Action: policy.Block, Timeout: 15 * time.Minute, Mode: policy.Sync, Fail: policy.FailClosed}, false},
		{"edge.report", window.Policy{Limit: 3, Burst: 3, Window: 36 * time.Hour, Algorithm: policy.FixedWindow, Action: policy.Throttle, Mode: policy.Sync}, false},
		{"edge.tick", window.Policy{Limit: 10, Burst: 10, Window: 250 * time.Millisecond, Algorithm: policy.LeakyBucket, Action: policy.Block, Mode: policy.Async}, false},
		{"switched.remote_address", window.Policy{Limit: 10, Burst: 10, Window: time.Second, Algorithm: policy.SlidingWindow, Action: policy.Block, Mode: policy.Sync}, false},
		{"switched.exact", with(count, 10, time.Minute), false},
		{"override:day", window.Policy{Limit: math.MaxUint32, Burst: math.MaxUint32, Window: 24 * time.Hour, Algorithm: policy.FixedWindow, Action: policy.Block, Mode: policy.Sync}, false},
		{"override:hour:sliding_window:sync:open", window.Policy{Limit: math.MaxUint32, Burst: math.MaxUint32, Window: time.Hour, Algorithm: policy.SlidingWindow, Action: policy.Block, Mode: policy.Sync}, false},
	}
	for _, tt := range tests {
		r := rs.Lookup(tt.rule)
		if r == nil {
			t.Errorf("no rule %q among %v", tt.rule, names(rs))
			continue
		}
		if r.Policy != tt.want {
			t.Errorf("rule %q: Policy = %+v, want %+v", tt.rule, r.Policy, tt.want)
		}
		if r.Shadow != tt.shadow || r.Kind != rules.Rate || r.Cost != 1 || r.MaxCost != math.MaxUint64 {
			t.Errorf("rule %q: Shadow %v Kind %v Cost %d MaxCost %d, want %v rate 1 max", tt.rule, r.Shadow, r.Kind, r.Cost, r.MaxCost, tt.shadow)
		}
		if r.Matches([]byte("api.example.com"), []byte("GET"), []byte("/")) {
			t.Errorf("rule %q matches an HTTP request", tt.rule)
		}
	}
}

func with(p window.Policy, limit uint64, w time.Duration) window.Policy {
	p.Limit, p.Burst, p.Window = limit, limit, w
	return p
}

// TestRulesZeroBucket checks that a limit of 0 with a per-edge algorithm
// runs as a fixed window (a bucket of rate 0 cannot run).
func TestRulesZeroBucket(t *testing.T) {
	c := mustParse(t, "domain: z\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0, algorithm: token_bucket}\n")
	rs, err := c.Rules()
	if err != nil {
		t.Fatal(err)
	}
	if r := rs.Lookup("z.k"); r == nil || r.Algorithm != policy.FixedWindow || r.Limit != 0 {
		t.Errorf("zero token bucket: rule %+v, want a fixed window of limit 0", r)
	}
}

// TestRulesErrors checks what Config.Rules refuses: every bad limit at
// once, with its file and line.
func TestRulesErrors(t *testing.T) {
	_, err := LoadRules(map[string][]byte{"b.yaml": []byte(`domain: b
descriptors:
  - key: k1
    rate_limit: {window: 366d, requests_per_unit: 5, algorithm: token_bucket, burst: 4000000000}
  - key: k2
    rate_limit: {window: 366d, requests_per_unit: 5, algorithm: leaky_bucket, burst: 4000000000}
`)})
	var le *LoadError
	if !errors.As(err, &le) || len(le.Errors) != 2 || !errors.Is(err, ErrInvalid) {
		t.Fatalf("LoadRules(overflowing buckets) = %v, want a *LoadError of 2 ErrInvalid", err)
	}
	for i, want := range []string{"b.yaml:4:", "b.yaml:6:"} {
		if got := le.Errors[i].Error(); !strings.HasPrefix(got, want) || !strings.Contains(got, "burst") {
			t.Errorf("error %d = %q, want it to start %q and name the burst", i, got, want)
		}
	}
	if _, err := (&Config{}).Rules(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Rules of an empty Config = %v, want ErrInvalid", err)
	}
	if _, err := LoadRules(map[string][]byte{"x.yaml": []byte("domain: [")}); !errors.Is(err, ErrSyntax) {
		t.Errorf("LoadRules(bad YAML) = %v, want ErrSyntax", err)
	}
}

// TestIndex checks the answers of the descriptor index.
func TestIndex(t *testing.T) {
	rs, x := mustRules(t, "readme/ex2.yaml", "readme/ex5.yaml", "readme/ex7.yaml", "readme/ex11a.yaml", "ext/extensions.yaml")
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		answer  rules.DescriptorAnswer
		rule    string
		rpu     uint32
		unit    uint8
		mult    uint32
		key     string
	}{
		{"nested", "messaging", es("message_type", "marketing", "to_number", "206"), rules.DescriptorCounted,
			"messaging.message_type_marketing.to_number", 5, uint8(Day), 0, "messaging_message_type_marketing_to_number_206_"},
		{"placeholder level", "messaging", es("message_type", "marketing"), rules.DescriptorNone, "", 0, 0, 0, ""},
		{"unknown domain", "nope", es("to_number", "1"), rules.DescriptorNone, "", 0, 0, 0, ""},
		{"unlimited", "internal", es("ldap", "x"), rules.DescriptorUnlimited, "", 0, 0, 0, ""},
		{"shared wildcard", "example11", es("files", "files/a.pdf"), rules.DescriptorCounted,
			"", 10, uint8(Hour), 0, "example11_files_files/*_"},
		{"90s window", "edge", es("remote_address", "1.2.3.4"), rules.DescriptorCounted, "edge.remote_address", 100, uint8(Second), 90, "edge_remote_address_1.2.3.4_"},
		{"1d12h window", "edge", es("report", "r"), rules.DescriptorCounted, "edge.report", 3, uint8(Hour), 36, "edge_report_r_"},
		{"250ms window", "edge", es("tick", "t"), rules.DescriptorCounted, "edge.tick", 10, 0, 0, "edge_tick_t_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, key := x.Descriptor(tt.domain, tt.entries, nil)
			if m.Answer != tt.answer {
				t.Fatalf("Answer = %v, want %v", m.Answer, tt.answer)
			}
			if string(key) != tt.key {
				t.Errorf("key = %q, want %q", key, tt.key)
			}
			if tt.answer != rules.DescriptorCounted {
				if m.Rule != -1 {
					t.Errorf("Rule = %d, want -1", m.Rule)
				}
				return
			}
			if tt.rule != "" && rs.Rules[m.Rule].Name != tt.rule {
				t.Errorf("rule = %q, want %q", rs.Rules[m.Rule].Name, tt.rule)
			}
			if m.RequestsPerUnit != tt.rpu || m.Unit != tt.unit || m.UnitMultiplier != tt.mult || m.Window != rs.Rules[m.Rule].Window {
				t.Errorf("rpu %d unit %d×%d window %v, want %d unit %d×%d window %v", m.RequestsPerUnit, m.Unit, m.UnitMultiplier, m.Window,
					tt.rpu, tt.unit, tt.mult, rs.Rules[m.Rule].Window)
			}
		})
	}
	m, _ := x.Descriptor("example7", es("key_2", "value_2", "user", "bkthomps"), nil)
	if len(m.Replaces) != 1 || m.Replaces[0] != "specific_limit" {
		t.Errorf("example7 key_2: Replaces = %v, want [specific_limit]", m.Replaces)
	}
	if m, _ := x.Descriptor("example7", es("key_1", "value_1", "user", "bkthomps"), nil); m.Name != "specific_limit" {
		t.Errorf("example7 key_1: Name = %q, want specific_limit", m.Name)
	}

	// Overrides.
	m, key, err := x.Override("messaging", es("to_number", "1"), 42, uint8(Minute), nil)
	if err != nil || m.Answer != rules.DescriptorOverride || rs.Rules[m.Rule].Name != "override:minute" || m.RequestsPerUnit != 42 ||
		m.Window != time.Minute || string(key) != "messaging_to_number_1_" {
		t.Errorf("Override(messaging) = %+v, %q, %v; want override:minute, 42 per minute, key messaging_to_number_1_", m, key, err)
	}
	if m, key, err := x.Override("nope", es("a", "b"), 1, uint8(Second), nil); err != nil || m.Answer != rules.DescriptorNone || len(key) != 0 {
		t.Errorf("Override(unknown domain) = %+v, %q, %v; want no limit", m, key, err)
	}
	for _, u := range []uint8{0, 8, 200} {
		if _, _, err := x.Override("messaging", es("a", "b"), 1, u, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("Override(unit %d) error = %v, want ErrInvalid", u, err)
		}
	}
	if !x.HasDomain("messaging") || x.HasDomain("nope") {
		t.Errorf("HasDomain(messaging, nope) = %v, %v; want true, false", x.HasDomain("messaging"), x.HasDomain("nope"))
	}
}

// TestIndexAllocs proves the request path of the index does not allocate:
// DescriptorsOf, Descriptor and Override into a key buffer with room.
func TestIndexAllocs(t *testing.T) {
	rs, _ := mustRules(t, "readme/ex2.yaml", "readme/ex11a.yaml")
	key := make([]byte, 0, 256)
	e1, e2 := es("message_type", "marketing", "to_number", "2061111111"), es("files", "files/x")
	allocs := testing.AllocsPerRun(1000, func() {
		d := DescriptorsOf(rs)
		_, key = d.Descriptor("messaging", e1, key[:0])
		_, key = d.Descriptor("example11", e2, key[:0])
		_, key, _ = d.Override("messaging", e1, 3, uint8(Hour), key[:0])
	})
	if allocs != 0 {
		t.Errorf("%v allocations per lookup, want 0", allocs)
	}
}

// TestDescriptorsOf: nil for rules not built here, the index for those
// that are, and every converted rule matches no HTTP request.
func TestDescriptorsOf(t *testing.T) {
	if d := DescriptorsOf(nil); d != nil {
		t.Errorf("DescriptorsOf(nil) = %v, want nil", d)
	}
	plain, err := rules.ParseRules([]byte("rules:\n  - name: r\n    limit: 1\n    window: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := DescriptorsOf(plain); d != nil {
		t.Errorf("DescriptorsOf(a rules file) = %v, want nil", d)
	}
	rs, err := LoadRules(map[string][]byte{"a.yaml": readFixture(t, "readme/ex1.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	if DescriptorsOf(rs) == nil {
		t.Error("DescriptorsOf(rules from an envoyproxy/ratelimit file) = nil")
	}
	for _, r := range rs.Rules {
		if r.Matches([]byte("h"), []byte("GET"), []byte("/")) {
			t.Errorf("rule %s matches an HTTP request", r.Name)
		}
	}
}

func TestIsEnvoy(t *testing.T) {
	tests := []struct {
		data string
		want bool
	}{
		{"domain: d\ndescriptors: []\n", true},
		{"# comment\n---\ndomain: d\n", true},
		{"descriptors: []\ndomain: d\n", true},
		{"rules:\n  - name: r\n    limit: 1\n    window: 1s\n", false},
		{"", false},
		{"- domain: d\n", false},
		{"domain", false},
		{"x: {domain: d}\n", false},
		{"domain: [", false},
		{"a: &x 1\nb: *x\n", false},
	}
	for _, tt := range tests {
		if got := IsEnvoy([]byte(tt.data)); got != tt.want {
			t.Errorf("IsEnvoy(%q) = %v, want %v", tt.data, got, tt.want)
		}
	}
	for _, p := range []string{"readme/ex1.yaml", "ext/switch.yaml", "ratelimit/basic.yaml"} {
		if !IsEnvoy(readFixture(t, p)) {
			t.Errorf("IsEnvoy(%s) = false, want true", p)
		}
	}
}

// FuzzIsEnvoy feeds any bytes to IsEnvoy and, when it says yes, to
// LoadRules: neither may panic, and rules that load are well formed.
func FuzzIsEnvoy(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*", "*.yaml"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no testdata: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("rules:\n  - name: r\n    limit: 1\n    window: 1s\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: \"k*\\u00e9 \"\n    rate_limit: {unit: hour, requests_per_unit: 0, algorithm: leaky_bucket}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !IsEnvoy(data) {
			return
		}
		rs, err := LoadRules(map[string][]byte{"f.yaml": data})
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for i, r := range rs.Rules {
			if r.Index != i || seen[r.Name] || len(r.Name) > rules.MaxRuleName || r.Window <= 0 {
				t.Fatalf("rule %d: %+v: want unique names of at most 128 bytes, its index, a window", i, r)
			}
			seen[r.Name] = true
		}
		if DescriptorsOf(rs) == nil {
			t.Fatal("rules without their index")
		}
	})
}

func TestReadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	write(".hidden.yaml", "not: read")
	write("notes.txt", "not read")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a.yaml"), filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	files, err := ReadFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || files["a.yaml"] == nil || files["b.yml"] == nil || files["link.yaml"] == nil {
		t.Errorf("ReadFiles(dir) names %v, want a.yaml, b.yml, link.yaml", keys(files))
	}
	one, err := ReadFiles(filepath.Join(dir, "b.yml"))
	if err != nil || len(one) != 1 || one["b.yml"] == nil {
		t.Errorf("ReadFiles(file) = %v, %v; want b.yml", keys(one), err)
	}
	if _, err := ReadFiles(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFiles(missing) = %v, want os.ErrNotExist", err)
	}
	if _, err := ReadFiles(t.TempDir()); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReadFiles(empty dir) = %v, want ErrInvalid", err)
	}
	// LoadPath: the link names domain a again.
	if _, err := LoadPath(dir); !errors.Is(err, ErrDuplicateDomain) {
		t.Errorf("LoadPath(dir with a link) = %v, want ErrDuplicateDomain", err)
	}
	os.Remove(filepath.Join(dir, "link.yaml"))
	rs, err := LoadPath(dir)
	if err != nil || rs.Lookup("a.k") == nil || rs.Lookup("b.k") == nil {
		t.Errorf("LoadPath(dir) = %v, %v; want rules a.k and b.k", rs, err)
	}
	// Stamp changes with a file rewritten in place, and with a new file.
	before := Stamp(dir)
	if missing := Stamp(filepath.Join(dir, "missing")); before == "" || !strings.HasPrefix(missing, "error: ") {
		t.Errorf("Stamp(dir) = %q, Stamp(missing) = %q; want a stamp, and an error", before, missing)
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 22}\n")
	if again := Stamp(dir); again == before {
		t.Errorf("Stamp(dir) after a file was rewritten = %q, unchanged", again)
	}
	before = Stamp(dir)
	write("c.yaml", "rules:\n  - name: r\n    limit: 1\n    window: 1s\n")
	if again := Stamp(dir); again == before {
		t.Errorf("Stamp(dir) after a file was added = %q, unchanged", again)
	}
	if _, err := LoadPath(dir); !errors.Is(err, ErrNotEnvoy) || !strings.Contains(err.Error(), "c.yaml") {
		t.Errorf("LoadPath(dir with a rules file) = %v, want ErrNotEnvoy naming c.yaml", err)
	}
}

// TestStampByContent: a file rewritten with the same size and time, and a
// symlink moved to another file of the same size and time (a Kubernetes
// ConfigMap's "..data" swap), change the stamp.
func TestStampByContent(t *testing.T) {
	dir := t.TempDir()
	doc := func(n int) []byte {
		return []byte(fmt.Sprintf("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n))
	}
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, n := range []int{1, 2} {
		sub := filepath.Join(dir, fmt.Sprintf("..v%d", i))
		os.Mkdir(sub, 0o755)
		os.WriteFile(filepath.Join(sub, "a.yaml"), doc(n), 0o644)
		os.Chtimes(filepath.Join(sub, "a.yaml"), mtime, mtime)
	}
	os.Symlink("..v0", filepath.Join(dir, "..data"))
	os.Symlink("..data/a.yaml", filepath.Join(dir, "a.yaml"))
	before, file := Stamp(dir), Stamp(filepath.Join(dir, "a.yaml"))
	os.Symlink("..v1", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if after := Stamp(dir); after == before || strings.HasPrefix(after, "error") {
		t.Errorf("Stamp(dir) after the ..data swap = %q, was %q", after, before)
	}
	if after := Stamp(filepath.Join(dir, "a.yaml")); after == file || strings.HasPrefix(after, "error") {
		t.Errorf("Stamp(file) after the ..data swap = %q, was %q", after, file)
	}
}

// TestReadFilesSizeBound: a file over the bound is refused, with its name,
// size and the bound, without being read; one under it is read.
func TestReadFilesSizeBound(t *testing.T) {
	dir := t.TempDir()
	ok := []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	os.WriteFile(filepath.Join(dir, "a.yaml"), ok, 0o644)
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(100 << 20) // sparse: 100 MiB that cost no disk
	f.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	alloc := ms.TotalAlloc
	_, err = ReadFiles(dir)
	runtime.ReadMemStats(&ms)
	if grew := ms.TotalAlloc - alloc; grew > 1<<20 {
		t.Errorf("refusing a 100 MiB file allocated %d bytes", grew)
	}
	want := fmt.Sprintf("%s: %d bytes, over the limit of %d bytes", big, 100<<20, DefaultMaxFileBytes)
	if !errors.Is(err, ErrTooLarge) || !errors.Is(err, rules.ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("ReadFiles(dir with a 100 MiB file) = %v, want ErrTooLarge saying %q", err, want)
	}
	if _, err := LoadPath(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("LoadPath(100 MiB file) = %v, want ErrTooLarge", err)
	}
	os.Remove(big)
	if _, err := (Loader{MaxFileBytes: len(ok) - 1}).LoadPath(dir); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, over the limit of %d", len(ok), len(ok)-1)) {
		t.Errorf("LoadPath(dir) with a bound one byte short = %v, want ErrTooLarge", err)
	}
	if _, err := (Loader{MaxFileBytes: len(ok)}).LoadPath(dir); err != nil {
		t.Errorf("LoadPath(dir) with a bound of the file's size = %v", err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
