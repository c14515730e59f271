package decision

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/poplimit/poplimit/rules"
)

// fieldMap is a FieldSetter over a map, for tests.
type fieldMap map[string]string

func (m fieldMap) SetCanonical(name, value []byte) { m[string(name)] = string(value) }

// TestAppendProblem checks the about:blank problem body every front end
// sends: valid JSON whatever the detail holds, the title the status's.
func TestAppendProblem(t *testing.T) {
	for _, tt := range []struct {
		status int
		detail string
	}{
		{400, "the request lacks the key that its rate limit needs"},
		{404, `no rule "x\y"`},
		{503, "line\nbreak\ttab \x01"},
		{599, "a status without a title"},
	} {
		b := AppendProblem([]byte("prefix"), tt.status, tt.detail)[len("prefix"):]
		var p struct {
			Type, Title, Detail string
			Status              int
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("%d %q: %s is not JSON: %v", tt.status, tt.detail, b, err)
		}
		if p.Type != "about:blank" || p.Status != tt.status || p.Title != StatusTitle(tt.status) || p.Detail != tt.detail {
			t.Errorf("%d %q: %+v", tt.status, tt.detail, p)
		}
	}
}

// TestRefuse checks the answer rendered for each outcome: status, fields
// and body, Retry-After within the jitter.
func TestRefuse(t *testing.T) {
	rs, err := rules.ParseRules([]byte("rules: [{name: api, limit: 5, window: 1m}]"))
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Rules[0]
	now := time.Unix(1_800_000_010, 0)
	release := now.Add(50 * time.Second).UnixNano()
	for _, tt := range []struct {
		name       string
		v          Verdict
		status     int
		fields     []string
		bodyPrefix string
	}{
		{"allowed", Verdict{Outcome: Allowed}, 200, nil, ""},
		{"limited", Verdict{Outcome: Limited, Quota: Quota{Rule: r, Limit: 5, ResetAt: release, ReleaseAt: release}}, 429,
			[]string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"},
			`{"type":"https://poplimit.dev/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"rate limit api exceeded: at most 5 per 60 s","policy":"api","limit":5,"retry_after":`},
		{"shed", Verdict{Outcome: Shed, Quota: Quota{ReleaseAt: release}}, 503, []string{"Retry-After"},
			`{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"` + shedDetail},
		{"denied", Verdict{Outcome: Denied, Reason: "no key"}, 400, nil, `{"type":"about:blank","title":"Bad Request","status":400,"detail":"no key"}`},
		{"no such rule", Verdict{Outcome: Undecidable, Reason: "no such rule"}, 404, nil, `{"type":"about:blank","title":"Not Found"`},
		{"undecidable rule", Verdict{Outcome: Undecidable, Quota: Quota{Rule: r}, Reason: "a concurrency rule"}, 422, nil, `{"type":"about:blank","title":"Unprocessable Content"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.v
			v.now, v.jitter = now, 3*time.Second
			h := fieldMap{}
			status, body := v.Refuse(h)
			if status != tt.status || status != v.Status() {
				t.Errorf("status %d (Status %d), want %d", status, v.Status(), tt.status)
			}
			if len(h) != len(tt.fields) {
				t.Errorf("fields %v, want %v", h, tt.fields)
			}
			for _, f := range tt.fields {
				if _, ok := h[f]; !ok {
					t.Errorf("no %s in %v", f, h)
				}
			}
			if ra, ok := h["Retry-After"]; ok && (ra < "50" || ra > "53" || len(ra) != 2) {
				t.Errorf("Retry-After %s, want 50 to 53", ra)
			}
			if string(body[:min(len(body), len(tt.bodyPrefix))]) != tt.bodyPrefix || (tt.bodyPrefix == "") != (body == nil) {
				t.Errorf("body %s, want it to start %s", body, tt.bodyPrefix)
			}
			if body != nil && !json.Valid(body) {
				t.Errorf("body %s is not JSON", body)
			}
		})
	}
}
