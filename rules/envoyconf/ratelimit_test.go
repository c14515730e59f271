package envoyconf

import (
	"errors"
	"reflect"
	"testing"

	"github.com/poplimit/poplimit/policy"
)

// The answers below are those envoyproxy/ratelimit's own tests expect of
// GetLimit (test/config/config_test.go) for the same shapes of
// configuration.

func TestBasic(t *testing.T) {
	c := mustLoad(t, "ratelimit/basic.yaml")
	const d = "test-domain"
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    answer
	}{
		{"unknown domain", "foo_domain", es("key1", "value1", "subkey1", "x"), answer{}},
		{"no entries", d, nil, answer{}},
		{"unknown value of a placeholder", d, es("key1", "something"), answer{}},
		{"placeholder level alone", d, es("key1", "value1"), answer{}},
		{"leaf reached before the last entry", d, es("key2", "value2", "subkey", "subvalue"), answer{}},
		{"no key-only child at level 2", d, es("key5", "value5", "subkey5", "subvalue"), answer{}},
		{"key-only at level 2", d, es("key1", "value1", "subkey1", "something"), answer{found: true, rpu: 5, unit: Second, stats: "test-domain.key1_value1.subkey1"}},
		{"key_value at level 2", d, es("key1", "value1", "subkey1", "subvalue1"), answer{found: true, rpu: 10, unit: Second, stats: "test-domain.key1_value1.subkey1_subvalue1"}},
		{"key-only at level 1", d, es("key2", "something"), answer{found: true, rpu: 20, unit: Minute, stats: "test-domain.key2"}},
		{"key_value at level 1", d, es("key2", "value2"), answer{found: true, rpu: 30, unit: Minute, stats: "test-domain.key2_value2"}},
		{"allowed value, no limit", d, es("key2", "value3"), answer{}},
		{"hour", d, es("key3", "foo"), answer{found: true, rpu: 1, unit: Hour, stats: "test-domain.key3"}},
		{"named", d, es("key4", "foo"), answer{found: true, rpu: 1, unit: Day, name: "key4_rate_limit", stats: "test-domain.key4"}},
		{"limit at level 1 with children", d, es("key5", "value5"), answer{found: true, rpu: 15, unit: Day}},
		{"limit at level 2 under it", d, es("key5", "value5", "subkey5", "subvalue5"), answer{found: true, rpu: 25, unit: Day}},
		{"unlimited", d, es("key6", "foo"), answer{found: true, unlimited: true, stats: "test-domain.key6"}},
		{"detailed metric", d, es("key7", "unspecified_value"), answer{found: true, rpu: 70, unit: Minute, stats: "test-domain.key7_unspecified_value"}},
		{"detailed metric, another value", d, es("key7", "another_value"), answer{found: true, rpu: 70, unit: Minute, stats: "test-domain.key7_another_value"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkAnswer(t, c, tt.domain, tt.entries, tt.want) })
	}
	if got, want := c.Domains(), []string{"test-domain"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Domains() = %v, want %v", got, want)
	}
	if c.Empty() {
		t.Errorf("Empty() = true, want false")
	}
}

func TestWildcard(t *testing.T) {
	c := mustLoad(t, "ratelimit/wildcard.yaml")
	const d = "test-domain"
	tests := []struct {
		name    string
		entries []Entry
		want    answer
	}{
		{"no value", es("noVal", "foo1"), answer{found: true, rpu: 20, stats: "test-domain.noVal"}},
		{"trailing", es("wild", "foo1"), answer{found: true, rpu: 20, stats: "test-domain.wild_foo*", counter: "test-domain_wild_foo1_"}},
		{"trailing, other value", es("wild", "foo2"), answer{found: true, rpu: 20, stats: "test-domain.wild_foo*", counter: "test-domain_wild_foo2_"}},
		{"nested", es("nestedWild", "val1", "wild", "goo2"), answer{found: true, rpu: 20, stats: "test-domain.nestedWild_val1.wild_goo*"}},
		{"no match", es("wild", "bar"), answer{}},
		{"no eager match", es("noWild", "foo1"), answer{}},
		{"middle", es("midWild", "barab"), answer{found: true, rpu: 20, stats: "test-domain.midWild_bar*b"}},
		{"middle, longer", es("midWild", "bar123b"), answer{found: true, rpu: 20}},
		{"middle, empty", es("midWild", "barb"), answer{found: true, rpu: 20}},
		{"middle, no suffix", es("midWild", "bara"), answer{}},
		{"middle, no prefix", es("midWild", "xbarb"), answer{}},
		{"multi", es("multiWild", "foo123bar456baz"), answer{found: true, rpu: 10, stats: "test-domain.multiWild_foo*bar*baz"}},
		{"multi, empty", es("multiWild", "foobarbaz"), answer{found: true, rpu: 10}},
		{"multi, missing middle", es("multiWild", "foo123baz"), answer{}},
		{"multi, missing prefix", es("multiWild", "bar456baz"), answer{}},
		{"the wildcard itself matches by value", es("wild", "foo*"), answer{found: true, rpu: 20, stats: "test-domain.wild_foo*"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkAnswer(t, c, d, tt.entries, tt.want) })
	}
}

func TestShareThreshold(t *testing.T) {
	c := mustLoad(t, "ratelimit/share.yaml")
	const d = "test-domain"
	tests := []struct {
		name    string
		entries []Entry
		want    answer
	}{
		{"basic a", es("files", "files/a.pdf"), answer{found: true, rpu: 100, stats: "test-domain.files_files/*", counter: "test-domain_files_files/*_"}},
		{"basic b", es("files", "files/b.csv"), answer{found: true, rpu: 100, stats: "test-domain.files_files/*", counter: "test-domain_files_files/*_"}},
		{"with value_to_metric", es("route", "api/v1", "method", "GET"), answer{found: true, rpu: 60, stats: "test-domain.route_api/*.method", counter: "test-domain_route_api/*_method_GET_"}},
		{"with detailed_metric", es("service", "svc/user", "endpoint", "get"), answer{found: true, rpu: 80, stats: "test-domain.service_svc/*.endpoint_get", counter: "test-domain_service_svc/*_endpoint_get_"}},
		{"nested", es("nested", "parent", "files", "nested/file1.txt"), answer{found: true, rpu: 200, stats: "test-domain.nested_parent.files_nested/*", counter: "test-domain_nested_parent_files_nested/*_"}},
		{"same key at two levels", es("files", "top/file1.txt", "files", "nested/file1.txt"), answer{found: true, rpu: 300, stats: "test-domain.files_top/*.files_nested/*", counter: "test-domain_files_top/*_files_nested/*_"}},
		{"parent shares, child does not", es("path", "path/foo", "file", "file/doc1", "type", "pdf"), answer{found: true, rpu: 120, stats: "test-domain.path_path/*.file_file/*.type", counter: "test-domain_path_path/*_file_file/doc1_type_pdf_"}},
		{"both share", es("user", "user/alice", "resource", "res/file1", "action", "read"), answer{found: true, rpu: 150, stats: "test-domain.user_user/*.resource_res/*.action", counter: "test-domain_user_user/*_resource_res/*_action_read_"}},
		{"exact value first", es("file", "test1"), answer{found: true, rpu: 50, stats: "test-domain.file_test1", counter: "test-domain_file_test1_"}},
		{"then the wildcard", es("file", "test23"), answer{found: true, rpu: 100, stats: "test-domain.file_test*", counter: "test-domain_file_test*_"}},
		{"middle wildcard", es("midpath", "/api-beta-v1"), answer{found: true, rpu: 100, stats: "test-domain.midpath_/api*v1", counter: "test-domain_midpath_/api*v1_"}},
		{"middle wildcard, no match", es("midpath", "/api/v2"), answer{}},
		{"multi wildcard", es("multiroute", "svceprpc"), answer{found: true, rpu: 50, stats: "test-domain.multiroute_svc*ep*rpc"}},
		{"share over value_to_metric", es("midroute", "/api/v2"), answer{found: true, rpu: 80, stats: "test-domain.midroute_/api*v2"}},
		{"nested middle wildcards", es("tenant", "t99prod", "resource", "resBBBv2"), answer{found: true, rpu: 60, stats: "test-domain.tenant_t*prod.resource_res*v2", counter: "test-domain_tenant_t*prod_resource_res*v2_"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkAnswer(t, c, d, tt.entries, tt.want) })
	}
}

func TestValueToMetric(t *testing.T) {
	c := mustLoad(t, "ratelimit/value_to_metric.yaml")
	tests := []struct {
		name    string
		entries []Entry
		stats   string
	}{
		{"runtime values", es("route", "draw", "http_method", "GET", "subject_id", "123"), "vtm.route_draw.http_method_GET.subject_id"},
		{"empty first value", es("route", "", "http_method", "GET", "subject_id", "123"), "vtm.route.http_method_GET.subject_id"},
		{"empty middle value", es("route", "draw", "http_method", "", "subject_id", "123"), "vtm.route_draw.http_method.subject_id"},
		{"both empty", es("route", "", "http_method", "", "subject_id", "123"), "vtm.route.http_method.subject_id"},
		{"middle level only", es("k1", "X", "k2", "Y", "k3", "Z"), "vtm.k1.k2_Y.k3"},
		{"detailed_metric wins", es("d1", "draw", "d2", "123"), "vtm.d1_draw.d2_123"},
		{"detailed_metric, empty value", es("d1", "draw", "d2", ""), "vtm.d1_draw.d2_"},
		{"wildcard kept on another level's flag", es("wild", "foo1", "other", "bar", "limit", "X"), "vtm.wild_foo*.other_bar.limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := c.Lookup("vtm", tt.entries)
			if !m.Found() {
				t.Fatalf("Lookup(%v) found nothing", tt.entries)
			}
			if got := string(m.AppendStatsKey(nil)); got != tt.stats {
				t.Errorf("stats key = %q, want %q", got, tt.stats)
			}
		})
	}
}

func TestDetailedMetricNested(t *testing.T) {
	c := mustParse(t, `
domain: nested
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
  - key: plain-1
    rate_limit: {requests_per_unit: 100, unit: minute}
    descriptors:
      - key: plain-2
        rate_limit: {requests_per_unit: 5, unit: minute}
`)
	tests := []struct {
		entries []Entry
		rpu     uint32
		stats   string
	}{
		{es("key-1", "value-1"), 100, "nested.key-1_value-1"},
		{es("key-1", "value-1", "key-2", "value-2"), 5, "nested.key-1_value-1.key-2_value-2"},
		{es("plain-1", "value-1"), 100, "nested.plain-1"},
		{es("plain-1", "value-1", "plain-2", "value-2"), 5, "nested.plain-1.plain-2"},
	}
	for _, tt := range tests {
		m := c.Lookup("nested", tt.entries)
		if !m.Found() || m.Limit.RequestsPerUnit != tt.rpu {
			t.Fatalf("Lookup(%v) = %+v, want %d", tt.entries, m.Limit, tt.rpu)
		}
		if got := string(m.AppendStatsKey(nil)); got != tt.stats {
			t.Errorf("Lookup(%v) stats key = %q, want %q", tt.entries, got, tt.stats)
		}
	}
}

func TestMetadata(t *testing.T) {
	c := mustLoad(t, "ratelimit/metadata.yaml")
	m := c.Lookup("test-domain", es("key1", "value1", "subkey1", "something"))
	if got, want := m.Limit.Metadata, map[string]any{"name": "service_1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("metadata = %#v, want %#v", got, want)
	}
	m = c.Lookup("test-domain", es("key2", "x"))
	want := map[string]any{
		"service_with_quota": map[string]any{"name": "service_2"},
		"weight":             2.5,
		"tags":               []any{"a", int64(1), true, nil},
	}
	if got := m.Limit.Metadata; !reflect.DeepEqual(got, want) {
		t.Errorf("metadata = %#v, want %#v", got, want)
	}
	if m := c.Lookup("test-domain", es("key1", "value1", "subkey1", "subvalue1")); m.Limit.Metadata != nil {
		t.Errorf("metadata = %#v, want nil", m.Limit.Metadata)
	}
}

func TestOverride(t *testing.T) {
	c := mustLoad(t, "ratelimit/basic.yaml", "ext/switch.yaml")
	entries := es("key1", "value1", "subkey1", "something")
	m, err := c.Override("test-domain", entries, 10, Day)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Limit.FullKey, "test-domain.key1_value1.subkey1_something"; got != want {
		t.Errorf("FullKey = %q, want %q", got, want)
	}
	if got, want := string(m.AppendStatsKey(nil)), "test-domain.key1_value1.subkey1_something"; got != want {
		t.Errorf("stats key = %q, want %q", got, want)
	}
	if got, want := string(m.AppendCounterKey(nil)), "test-domain_key1_value1_subkey1_something_"; got != want {
		t.Errorf("counter key = %q, want %q", got, want)
	}
	if m.Limit.RequestsPerUnit != 10 || m.Limit.Unit != Day || m.Limit.ShadowMode || m.Limit.Name != "" {
		t.Errorf("override limit = %+v, want 10/day, not shadowed, unnamed", m.Limit)
	}
	// An override of a descriptor nothing matches still applies.
	if m, _ := c.Override("test-domain", es("nothing", "here"), 1, Second); !m.Found() {
		t.Errorf("override of an unmatched descriptor: not found")
	}
	// But not in an unknown domain.
	if m, err := c.Override("foo_domain", entries, 10, Day); m.Found() || err != nil {
		t.Errorf("override in an unknown domain = %v, %v; want none, nil", m.Limit, err)
	}
	if _, err := c.Override("test-domain", entries, 10, UnitUnknown); !errors.Is(err, ErrInvalid) {
		t.Errorf("override with unit UNKNOWN: err = %v, want ErrInvalid", err)
	}
	// The file's poplimit defaults apply to its overrides.
	if m, _ := c.Override("switched", es("x", "y"), 3, Minute); m.Limit.Algorithm != policy.SlidingWindow {
		t.Errorf("override in a switched file: algorithm %v, want sliding_window", m.Limit.Algorithm)
	}
}

func TestMergeDomains(t *testing.T) {
	a := []byte("domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	b := []byte("domain: d\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: second, requests_per_unit: 20}\n")
	if _, err := Load(map[string][]byte{"a.yaml": a, "b.yaml": b}); !errors.Is(err, ErrDuplicateDomain) {
		t.Fatalf("Load without merging: %v, want ErrDuplicateDomain", err)
	} else if got, want := err.Error(), "envoyconf: b.yaml:1:9: domain: duplicate domain 'd' in config file (also in a.yaml)"; got != want {
		t.Errorf("error = %q\nwant    %q", got, want)
	}
	c, err := Loader{MergeDomains: true}.Load(map[string][]byte{"a.yaml": a, "b.yaml": b})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, c, "d", es("key1", "value1"), answer{found: true, rpu: 10})
	checkAnswer(t, c, "d", es("key2", "value2"), answer{found: true, rpu: 20})
	// A descriptor defined in both files is still an error.
	_, err = Loader{MergeDomains: true}.Load(map[string][]byte{"a.yaml": a, "c.yaml": a})
	if !errors.Is(err, ErrDuplicateDescriptor) {
		t.Errorf("Load merging a file twice: %v, want ErrDuplicateDescriptor", err)
	}
}
