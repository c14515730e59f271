package rls_test

import (
	"strings"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/rls"
)

// TestRLSHeaders checks response_headers_to_add in each mode.
func TestRLSHeaders(t *testing.T) {
	files := inline(`domain: h
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: w
    rate_limit: {window: 90s, requests_per_unit: 7}
`)
	t.Run("draft", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{}, edge.Options{})
		resp := h.ask(t, "h", 0, desc("big", "a"), desc("k", "a"))
		// The descriptor with the least remaining: k (4 of 5 left).
		wantHeaders(t, "allowed", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=4;t=50`})
		resp = h.ask(t, "h", 0, desc("k", "a"), withHits(desc("big", "a"), 10))
		wantHeaders(t, "k still the least", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=3;t=50`})
		resp = h.ask(t, "h", 0, withHits(desc("k", "a"), 4), desc("big", "a"))
		wantHeaders(t, "refused", resp, map[string]string{"RateLimit-Policy": `"h.k";q=5;w=60`, "RateLimit": `"h.k";r=0;t=50`, "Retry-After": "50"})
		if resp.OverallCode != over {
			t.Errorf("refused: overall %v, want OVER_LIMIT", resp.OverallCode)
		}
		resp = h.ask(t, "h", 0, desc("w", "a"))
		wantHeaders(t, "a 90 s window", resp, map[string]string{"RateLimit-Policy": `"h.w";q=7;w=90`, "RateLimit": `"h.w";r=6;t=80`})
		// 1,800,000,010 mod 90 = 10: 80 s left. The window is 90 × SECOND.
		if l := resp.Statuses[0].CurrentLimit; l.Unit != second || l.GetUnitMultiplier().GetValue() != 90 {
			t.Errorf("a 90 s window: current_limit unit %v × %d, want SECOND × 90", l.Unit, l.GetUnitMultiplier().GetValue())
		}
		if resp := h.ask(t, "h", 0, desc("none", "a")); len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("no limit: headers %v, want none", resp.ResponseHeadersToAdd)
		}
	})
	t.Run("ratelimit", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{Headers: rls.HeadersRatelimit}, edge.Options{})
		resp := h.ask(t, "h", 0, desc("k", "a"), desc("big", "a"))
		wantHeaders(t, "allowed", resp, map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "4", "RateLimit-Reset": "50"})
		resp = h.ask(t, "h", 0, desc("big", "a"), withHits(desc("k", "a"), 5))
		wantHeaders(t, "refused", resp, map[string]string{"RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "50"})
	})
	t.Run("ratelimit, its header names", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{Headers: rls.HeadersRatelimit, LimitHeader: "X-Limit", RemainingHeader: "X-Left", ResetHeader: "X-Reset"}, edge.Options{})
		resp := h.ask(t, "h", 0, desc("k", "a"))
		wantHeaders(t, "allowed", resp, map[string]string{"X-Limit": "5", "X-Left": "4", "X-Reset": "50"})
	})
	t.Run("none", func(t *testing.T) {
		h := startRLS(t, files, rls.Config{Headers: rls.HeadersNone}, edge.Options{})
		if resp := h.ask(t, "h", 9, desc("k", "a")); len(resp.ResponseHeadersToAdd) != 0 || resp.OverallCode != over {
			t.Errorf("none: headers %v, overall %v; want none, OVER_LIMIT", resp.ResponseHeadersToAdd, resp.OverallCode)
		}
	})
	if _, err := rls.New(edgetest.New(t, placeholderRules, edge.Options{}).Core, rls.Config{Headers: "x-ratelimit", MaxDescriptors: -1, ResetHeader: "X Reset"}, nil, nil); err == nil ||
		!strings.Contains(err.Error(), `Headers "x-ratelimit"`) || !strings.Contains(err.Error(), "MaxDescriptors -1") || !strings.Contains(err.Error(), `ResetHeader "X Reset"`) {
		t.Errorf("NewRLS(bad config) = %v, want both bad fields named with their values", err)
	}
}

func wantHeaders(t *testing.T, what string, resp *rlspb.RateLimitResponse, want map[string]string) {
	t.Helper()
	if len(resp.ResponseHeadersToAdd) != len(want) {
		t.Errorf("%s: headers %v, want %v", what, resp.ResponseHeadersToAdd, want)
	}
	for k, v := range want {
		if got, _ := header(resp, k); got != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}
