package decision

import (
	"testing"

	"github.com/poplimit/poplimit/rules"
)

func TestHostOnly(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"api.example.com", "api.example.com"},
		{"api.example.com:8080", "api.example.com"},
		{"api.example.com.", "api.example.com"},
		{"api.example.com.:443", "api.example.com"},
		{"API.Example.COM.", "API.Example.COM"},   // rules fold case
		{"api.example.com..", "api.example.com."}, // one dot only
		{".", "."},
		{"", ""},
		{"[2001:db8::1]:80", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"203.0.113.5:80", "203.0.113.5"},
	} {
		if got := string(HostOnly([]byte(tt.in))); got != tt.want {
			t.Errorf("HostOnly(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// A rule's host may be written fully qualified and in any case; it meets
// every spelling of that host a request may carry.
func TestRuleHostSpellings(t *testing.T) {
	rs, err := rules.ParseRules([]byte("rules: [{name: api, host: API.example.com., limit: 1, window: 1s}]"))
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Rules[0]
	for _, h := range []string{"api.example.com", "api.example.com.", "Api.Example.Com.:443"} {
		if !r.Matches(HostOnly([]byte(h)), []byte("GET"), []byte("/")) {
			t.Errorf("rule host %q does not match request host %q", r.Host, h)
		}
	}
	if r.Matches(HostOnly([]byte("api.example.com.evil")), []byte("GET"), []byte("/")) {
		t.Errorf("rule host %q matches api.example.com.evil", r.Host)
	}
}
