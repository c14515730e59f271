package rules

import (
	"errors"
	"strings"
	"testing"
)

// A rule's count says which responses spend its units: status codes and
// classes, and the origin's cost header; without count every admitted
// request counts, as before.
func TestParseCount(t *testing.T) {
	rs := mustRules(t, `rules:
- {name: login, limit: 5, window: 15m, key: ["header:X-User"], count: {status: [401, 403, 5xx]}}
- {name: cost, limit: 100, window: 1m, cost: 2, count: {cost_header: X-Rate-Cost}}
- {name: both, limit: 10, window: 1m, mode: sync, action: block, timeout: 1h, count: {status: ["4xx"], cost_header: X-Units}}
- {name: plain, limit: 10, window: 1m}
- {name: bucket, limit: 10, window: 1m, algorithm: token_bucket, count: {status: [401]}}
- {name: meter, limit: 10, window: 1m, algorithm: leaky_bucket, action: block, count: {status: [401]}}
- {name: log, limit: 10, window: 1m, algorithm: sliding_log, count: {status: [401]}}
`)
	login, cost, both, plain := rs.Rules[0], rs.Rules[1], rs.Rules[2], rs.Rules[3]
	if !login.Count.On() || !cost.Count.On() || !both.Count.On() || plain.Count.On() {
		t.Fatalf("On: %v %v %v %v, want true true true false", login.Count.On(), cost.Count.On(), both.Count.On(), plain.Count.On())
	}
	for _, tt := range []struct {
		r      *Rule
		status int
		want   bool
	}{
		{login, 401, true}, {login, 403, true}, {login, 500, true}, {login, 599, true}, {login, 200, false},
		{login, 404, false}, {login, 0, false}, {login, 999, false},
		{cost, 200, true}, {cost, 500, true},
		{both, 400, true}, {both, 499, true}, {both, 302, false}, {both, 500, false},
		{plain, 200, true},
	} {
		if got := tt.r.Count.Counts(tt.status); got != tt.want {
			t.Errorf("%s: Counts(%d) = %v, want %v", tt.r.Name, tt.status, got, tt.want)
		}
	}
	if cost.Count.CostHeader != "X-Rate-Cost" || both.Count.CostHeader != "X-Units" || login.Count.CostHeader != "" {
		t.Errorf("cost headers %q %q %q", cost.Count.CostHeader, both.Count.CostHeader, login.Count.CostHeader)
	}
	// The origin's units: a whole number, 0 allowed, capped at the limit;
	// absent or malformed: the rule's cost.
	for _, tt := range []struct {
		v    string
		want uint64
	}{{"3", 3}, {"0", 0}, {"100", 100}, {"101", 100}, {"99999999999999999999999", 100}, {"", 2}, {"-1", 2}, {"1.5", 2}, {" 7 ", 7}, {"x", 2}} {
		var v []byte
		if tt.v != "" {
			v = []byte(tt.v)
		}
		if got := cost.Count.Units(v, tt.v != "", cost.Cost, cost.Limit); got != tt.want {
			t.Errorf("Units(%q) = %d, want %d", tt.v, got, tt.want)
		}
	}
}

// Every bad count names its field and the reason, and an algorithm, kind
// or scope that cannot give units back is refused with why.
func TestParseCountErrors(t *testing.T) {
	const head = "rules: [{name: a, window: 1m, limit: 10, "
	tests := []struct{ in, want string }{
		{head + "count: {}}]", "rules[0].count: needs status, cost_header or both"},
		{head + "count: {status: []}}]", "rules[0].count.status: needs at least one status code or class"},
		{head + "count: {status: [99]}}]", `rules[0].count.status[0]: must be a status code from 100 to 599 or a class 1xx to 5xx (got "99")`},
		{head + "count: {status: [600]}}]", `rules[0].count.status[0]: must be a status code from 100 to 599 or a class 1xx to 5xx (got "600")`},
		{head + "count: {status: [401, 6xx]}}]", `rules[0].count.status[1]: must be a status code from 100 to 599 or a class 1xx to 5xx (got "6xx")`},
		{head + "count: {status: [4XX]}}]", `rules[0].count.status[0]: must be a status code from 100 to 599 or a class 1xx to 5xx (got "4XX")`},
		{head + "count: {cost_header: \"X Bad\"}}]", `rules[0].count.cost_header: is not a valid header name (got "X Bad")`},
		{head + "count: {status: [401], colour: red}}]", "field colour not found"},
		{head + "algorithm: leaky_bucket, action: delay, count: {status: [401]}}]", "rules[0].count: a queue (action: delay) cannot give units back"},
		{head + "scope: global, count: {status: [401]}}]", "rules[0].count: applies only to rules of scope: pop"},
		{"rules: [{name: a, kind: concurrency, limit: 10, count: {status: [401]}}]", "rules[0].count: applies only to rate rules: a concurrency rule's slot is given back when the response ends, whatever it says"},
	}
	for _, tt := range tests {
		_, err := ParseRules([]byte(tt.in))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRules(%q) = %v, want ErrInvalid", tt.in, err)
			continue
		}
		if got := err.Error(); !strings.Contains(got, tt.want) {
			t.Errorf("ParseRules(%q):\n got %q\nwant it to hold %q", tt.in, got, tt.want)
		}
	}
}
