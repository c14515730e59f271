package loadtest_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/rules"
)

// TestOfflineDefaultsAreTheEdges checks that an OfflineConfig left zero
// simulates the edge at its defaults: the check prefix stripped is the
// edge's, so a check under it meets the rule its path names, as on a live
// edge in decision mode.
func TestOfflineDefaultsAreTheEdges(t *testing.T) {
	rs, err := rules.ParseRules([]byte("rules: [{name: api, path_prefix: /api, limit: 1, window: 1m}]"))
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("192.0.2.1")
	prefix := httpedge.Config{}.WithDefaults().CheckPrefix
	reqs := []loadtest.TraceRequest{{At: 0, IP: ip, Path: prefix + "/api/x"}, {At: 1000, IP: ip, Path: prefix + "/api/y"}}
	var statuses []int
	_, err = loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs,
		OnDecision: func(d loadtest.OfflineDecision) { statuses = append(statuses, d.Status) }}, sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 2 || statuses[0] != 200 || statuses[1] != 429 {
		t.Errorf("checks under the edge's default prefix %q: statuses %v, want [200 429] (the rule api met)", prefix, statuses)
	}
}
