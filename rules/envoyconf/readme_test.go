package envoyconf

import (
	"errors"
	"testing"
	"time"
)

// The examples of envoyproxy/ratelimit's README ("Configuration",
// "Examples"), with the lookups the README describes and its answers.

func TestReadmeExample1(t *testing.T) {
	c := mustLoad(t, "readme/ex1.yaml")
	checkAnswer(t, c, "mongo_cps", es("database", "users"), answer{found: true, rpu: 500, unit: Second, fullKey: "mongo_cps.database_users"})
	checkAnswer(t, c, "mongo_cps", es("database", "default"), answer{found: true, rpu: 500, unit: Second, fullKey: "mongo_cps.database_default"})
	checkAnswer(t, c, "mongo_cps", es("database", "orders"), answer{})
}

func TestReadmeExample2(t *testing.T) {
	c := mustLoad(t, "readme/ex2.yaml")
	// ("message_type", "marketing"),("to_number", N): 5 a day, each number apart.
	checkAnswer(t, c, "messaging", es("message_type", "marketing", "to_number", "2061111111"), answer{
		found: true, rpu: 5, unit: Day,
		fullKey: "messaging.message_type_marketing.to_number",
		stats:   "messaging.message_type_marketing.to_number",
		counter: "messaging_message_type_marketing_to_number_2061111111_",
	})
	checkAnswer(t, c, "messaging", es("message_type", "marketing", "to_number", "2062222222"), answer{
		found: true, rpu: 5, unit: Day,
		counter: "messaging_message_type_marketing_to_number_2062222222_",
	})
	// ("to_number", N): 100 a day.
	checkAnswer(t, c, "messaging", es("to_number", "2061111111"), answer{
		found: true, rpu: 100, unit: Day, stats: "messaging.to_number", counter: "messaging_to_number_2061111111_",
	})
	// The placeholder level alone has no limit.
	checkAnswer(t, c, "messaging", es("message_type", "marketing"), answer{})
}

func TestReadmeExample3(t *testing.T) {
	c := mustLoad(t, "readme/ex3.yaml")
	checkAnswer(t, c, "edge_proxy_per_ip", es("remote_address", "50.0.0.1"), answer{found: true, rpu: 10, unit: Second})
	// The most specific match: key_value before key.
	checkAnswer(t, c, "edge_proxy_per_ip", es("remote_address", "50.0.0.5"), answer{found: true, rpu: 0, unit: Second, fullKey: "edge_proxy_per_ip.remote_address_50.0.0.5"})
}

func TestReadmeExample4(t *testing.T) {
	req := es("key", "value", "subkey", "subvalue")
	checkAnswer(t, mustLoad(t, "readme/ex4a.yaml"), "example4", req, answer{})
	checkAnswer(t, mustLoad(t, "readme/ex4b.yaml"), "example4", req, answer{found: true, rpu: 300, unit: Second})
	// And a request shorter than the tree gets the limit of its own level only.
	checkAnswer(t, mustLoad(t, "readme/ex4a.yaml"), "example4", es("key", "value"), answer{found: true, rpu: 300, unit: Second})
	checkAnswer(t, mustLoad(t, "readme/ex4b.yaml"), "example4", es("key", "value"), answer{})
}

func TestReadmeExample5(t *testing.T) {
	c := mustLoad(t, "readme/ex5.yaml")
	checkAnswer(t, c, "internal", es("ldap", "anything"), answer{found: true, unlimited: true})
	checkAnswer(t, c, "internal", es("azure", "anything"), answer{found: true, rpu: 100, unit: Minute})
	m := c.Lookup("internal", es("ldap", "x"))
	if m.Limit.Unit != UnitUnknown || m.Limit.Window != 0 {
		t.Errorf("unlimited limit: unit %v window %v, want unknown and 0", m.Limit.Unit, m.Limit.Window)
	}
}

func TestReadmeExample6(t *testing.T) {
	c := mustLoad(t, "readme/ex6.yaml")
	checkAnswer(t, c, "example6", es("service", "auth-service", "user", "user-a"), answer{found: true, rpu: 10, unit: Second, shadow: true})
	checkAnswer(t, c, "example6", es("service", "auth-service", "user", "user-b"), answer{found: true, rpu: 20, unit: Second})
	checkAnswer(t, c, "example6", es("service", "auth-service", "user", "user-c"), answer{})
}

func TestReadmeExample7(t *testing.T) {
	c := mustLoad(t, "readme/ex7.yaml")
	one := es("key_1", "value_1", "user", "bkthomps")
	two := es("key_2", "value_2", "user", "bkthomps")
	checkAnswer(t, c, "example7", one, answer{found: true, rpu: 5, unit: Second, name: "specific_limit"})
	checkAnswer(t, c, "example7", two, answer{found: true, rpu: 10, unit: Second})
}

func TestReadmeExample8(t *testing.T) {
	c := mustLoad(t, "readme/ex8.yaml")
	checkAnswer(t, c, "example8", es("key1", "unspecified_value"), answer{found: true, rpu: 10, unit: Minute, stats: "example8.key1_unspecified_value"})
	checkAnswer(t, c, "example8", es("key1", "unspecified_value2"), answer{found: true, rpu: 10, unit: Minute, stats: "example8.key1_unspecified_value2"})
	checkAnswer(t, c, "example8", es("key1", "value1"), answer{found: true, rpu: 20, unit: Minute, stats: "example8.key1_value1"})
}

func TestReadmeExample9(t *testing.T) {
	// The three configurations name one domain: together they are refused.
	if _, err := Load(map[string][]byte{
		"ex9a.yaml": readFixture(t, "readme/ex9a.yaml"),
		"ex9b.yaml": readFixture(t, "readme/ex9b.yaml"),
	}); !errors.Is(err, ErrDuplicateDomain) {
		t.Fatalf("Load(ex9a, ex9b) = %v, want ErrDuplicateDomain", err)
	}
	a := mustLoad(t, "readme/ex9a.yaml")
	for _, v := range []string{"value1", "value2", "valueXYZ", "value"} {
		checkAnswer(t, a, "example9", es("key1", v), answer{found: true, rpu: 20, unit: Minute, stats: "example9.key1_value*"})
	}
	checkAnswer(t, a, "example9", es("key1", "valu"), answer{})

	b := mustLoad(t, "readme/ex9b.yaml")
	for _, v := range []string{"/api/123/action", "/api/user-id/action"} {
		checkAnswer(t, b, "example9", es("path", v), answer{found: true, rpu: 20, unit: Minute})
	}
	checkAnswer(t, b, "example9", es("path", "/api/123/other"), answer{})

	cfg := mustLoad(t, "readme/ex9c.yaml")
	for _, v := range []string{"/api/v1/resource/123/action", "/api/v2/resource/456/action"} {
		checkAnswer(t, cfg, "example9", es("route", v), answer{found: true, rpu: 20, unit: Minute})
	}
	checkAnswer(t, cfg, "example9", es("route", "/api/v1/resource/123"), answer{})
}

func TestReadmeExample10(t *testing.T) {
	c := mustLoad(t, "readme/ex10a.yaml", "readme/ex10b.yaml")
	checkAnswer(t, c, "example10", es("route", "api", "http_method", "GET", "subject_id", "123"), answer{
		found: true, rpu: 60, unit: Minute, stats: "example10.route_api.http_method_GET.subject_id",
	})
	checkAnswer(t, c, "example10", es("route", "web", "http_method", "POST", "subject_id", "456"), answer{
		found: true, rpu: 60, unit: Minute, stats: "example10.route_web.http_method_POST.subject_id",
	})
	checkAnswer(t, c, "example10_wildcard", es("user", "alice", "action", "readfile", "resource", "documents"), answer{
		found: true, rpu: 100, unit: Minute, stats: "example10_wildcard.user_alice.action_readfile.resource",
	})
}

func TestReadmeExample11(t *testing.T) {
	c := mustLoad(t, "readme/ex11a.yaml", "readme/ex11b.yaml")
	// files/*: one counter for every value.
	for _, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt"} {
		checkAnswer(t, c, "example11", es("files", v), answer{
			found: true, rpu: 10, unit: Hour, counter: "example11_files_files/*_", stats: "example11.files_files/*",
		})
	}
	// files_no_share/*: a counter per value.
	for _, v := range []string{"files_no_share/a.pdf", "files_no_share/b.csv"} {
		checkAnswer(t, c, "example11", es("files_no_share", v), answer{
			found: true, rpu: 10, unit: Hour, counter: "example11_files_no_share_" + v + "_",
		})
	}
	// The README says "example11_metrics.route_api.method_GET"; ratelimit's
	// code (and its tests) keep the whole wildcard and no method value.
	checkAnswer(t, c, "example11_metrics", es("route", "api/v1", "method", "GET"), answer{
		found: true, rpu: 60, unit: Minute, stats: "example11_metrics.route_api/*.method",
		counter: "example11_metrics_route_api/*_method_GET_",
	})
}

// TestReadmeWindows checks the window alignment ratelimit uses: unix time
// divided by the unit's seconds, and duration_until_reset = unit − now mod
// unit.
func TestReadmeWindows(t *testing.T) {
	c := mustLoad(t, "readme/ex2.yaml", "readme/ex1.yaml")
	now := time.Unix(1_700_000_123, 700_000_000)
	tests := []struct {
		domain  string
		entries []Entry
		key     string
		reset   time.Duration
	}{
		{"mongo_cps", es("database", "users"), "rl_mongo_cps_database_users_1700000123", time.Second},
		{"messaging", es("to_number", "1"), "rl_messaging_to_number_1_1699920000", (86400 - 80123) * time.Second},
	}
	for _, tt := range tests {
		m := c.Lookup(tt.domain, tt.entries)
		if got := string(m.AppendCacheKey(nil, "rl_", now)); got != tt.key {
			t.Errorf("cache key of %v = %q, want %q", tt.entries, got, tt.key)
		}
		if got := m.Limit.UntilReset(now); got != tt.reset {
			t.Errorf("UntilReset of %v = %v, want %v", tt.entries, got, tt.reset)
		}
	}
}
