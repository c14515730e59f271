package envoyconf

import (
	"testing"
	"time"
)

// lookupCases are descriptors of the kinds a PoP sends, each reaching its
// limit a different way.
var lookupCases = []struct {
	name    string
	domain  string
	entries []Entry
}{
	{"value", "edge_proxy_per_ip", es("remote_address", "50.0.0.5")},
	{"key", "edge_proxy_per_ip", es("remote_address", "203.0.113.77")},
	{"nested", "messaging", es("message_type", "marketing", "to_number", "2061111111")},
	{"wildcard", "test-domain", es("midWild", "bar-some-longer-value-b")},
	{"share", "test-domain", es("user", "user/alice", "resource", "res/file1", "action", "read")},
	{"miss", "test-domain", es("nothing", "here")},
}

func benchConfig(t testing.TB) *Config {
	t.Helper()
	c, err := Loader{MergeDomains: true}.Load(map[string][]byte{
		"ex2.yaml":      readFixture(t, "readme/ex2.yaml"),
		"ex3.yaml":      readFixture(t, "readme/ex3.yaml"),
		"wildcard.yaml": readFixture(t, "ratelimit/wildcard.yaml"),
		"share.yaml":    readFixture(t, "ratelimit/share.yaml"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLookupAllocs proves the request path does not allocate: Lookup, the
// counter, cache and stats keys into a buffer with room.
func TestLookupAllocs(t *testing.T) {
	c := benchConfig(t)
	buf := make([]byte, 0, 512)
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range lookupCases {
		allocs := testing.AllocsPerRun(1000, func() {
			m := c.Lookup(tc.domain, tc.entries)
			buf = m.AppendCounterKey(buf[:0])
			buf = m.AppendCacheKey(buf[:0], "rl_", now)
			buf = m.AppendStatsKey(buf[:0])
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per lookup, want 0", tc.name, allocs)
		}
	}
}

func BenchmarkLookup(b *testing.B) {
	c := benchConfig(b)
	for _, tc := range lookupCases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := c.Lookup(tc.domain, tc.entries)
				_ = m.Limit
			}
		})
	}
}

func BenchmarkLookupAndKeys(b *testing.B) {
	c := benchConfig(b)
	buf := make([]byte, 0, 512)
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range lookupCases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := c.Lookup(tc.domain, tc.entries)
				buf = m.AppendCacheKey(buf[:0], "rl_", now)
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	data := readFixture(b, "ratelimit/share.yaml")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("share.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}
