package loadtest_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
)

// failedLogins is a rule that holds 5 failed logins per account per 15
// minutes, keyed by the form's username in any letter case.
const failedLogins = `
rules:
  - name: failed-logins
    path_prefix: /login
    methods: [POST]
    key: ["form:username"]
    key_case: insensitive
    count: {status: [401]}
    limit: 5
    window: 15m
    action: block
`

func loginLine(at time.Duration, ip, user string, status int, dur time.Duration) loadtest.TraceRequest {
	return loadtest.TraceRequest{At: at, IP: netip.MustParseAddr(ip), Method: "POST", Path: "/login",
		ContentType: "application/x-www-form-urlencoded", Body: "username=" + user + "&password=x", Status: status, Duration: dur}
}

// TestOfflineCountingRule: offline, a rule that counts by response counts
// the trace's statuses: which accounts would 5 failures per 15 minutes
// have stopped, and when. A user who logs in successfully costs nothing;
// failures spread over more than the window stop no one; a burst of
// parallel failures is held to the limit, since each request's units are
// reserved until its response is known.
func TestOfflineCountingRule(t *testing.T) {
	var reqs []loadtest.TraceRequest
	min := time.Minute
	for i := range 8 { // alice: 8 failures within 10 minutes, from 8 addresses
		reqs = append(reqs, loginLine(time.Duration(i)*min+time.Second, fmt.Sprintf("203.0.113.%d", i+1), "alice", 401, 0))
	}
	for i := range 40 { // bob: 40 successful logins, and 2 typos
		status := 200
		if i%20 == 0 {
			status = 401
		}
		reqs = append(reqs, loginLine(time.Duration(i)*15*time.Second+2*time.Second, "198.51.100.7", "Bob", status, 0))
	}
	for i := range 6 { // carol: 6 failures, 4 minutes apart: never 5 within 15 minutes... but 4 at most
		reqs = append(reqs, loginLine(time.Duration(i)*4*min+3*time.Second, "198.51.100.8", "carol", 401, 0))
	}
	for range 10 { // dave: 10 wrong passwords at once, answered 200 ms later
		reqs = append(reqs, loginLine(30*min, "192.0.2.9", "DAVE", 401, 200*time.Millisecond))
	}
	sortByAt(reqs)
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: parseRules(t, failedLogins)}, sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if !r.Counting {
		t.Errorf("the rule is not reported as counting by response")
	}
	stopped := map[string]loadtest.KeyReport{}
	for _, k := range r.TopKeys {
		stopped[k.Key] = k
	}
	if a, ok := stopped["alice"]; !ok || a.Limited != 3 || a.FirstLimitedMillis != float64((5*min+time.Second)/time.Millisecond) {
		t.Errorf("alice: got %+v, want stopped 3 times from her 6th failure at 5m1s", a)
	}
	if d, ok := stopped["dave"]; !ok || d.Limited != 5 {
		t.Errorf("dave: got %+v, want 5 of 10 parallel failures stopped", d)
	}
	if len(stopped) != 2 {
		t.Errorf("stopped keys: got %v, want alice and dave only (bob's successes and carol's spread failures count no further)", r.TopKeys)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "the keys it would have stopped") {
		t.Errorf("text report lacks the stopped keys' section:\n%s", text.String())
	}
}

// TestOfflineCountingFromAccessLog: an access log keeps each line's
// status through import, and the rule counts the 401s of a query-keyed
// account (access logs hold no bodies); a line without a status keeps
// its units, as a request whose response never came.
func TestOfflineCountingFromAccessLog(t *testing.T) {
	var log strings.Builder
	for i := range 7 {
		fmt.Fprintf(&log, "203.0.113.%d - - [10/Oct/2000:13:%02d:00 +0000] \"POST /login?user=eve HTTP/1.1\" 401 12\n", i+1, i)
	}
	for i := range 7 {
		fmt.Fprintf(&log, "198.51.100.1 - - [10/Oct/2000:13:%02d:30 +0000] \"POST /login?user=frank HTTP/1.1\" 200 12\n", i)
	}
	for i := range 7 {
		fmt.Fprintf(&log, "198.51.100.2 - - [10/Oct/2000:13:%02d:40 +0000] \"POST /login?user=gina HTTP/1.1\" - 12\n", i)
	}
	var trace bytes.Buffer
	if _, err := loadtest.Import(strings.NewReader(log.String()), &trace, loadtest.ImportConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	rs := parseRules(t, strings.ReplaceAll(failedLogins, `key: ["form:username"]`, `key: ["query:user"]`))
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs}, loadtest.NewReader(&trace).All())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, k := range rep.Rules[0].TopKeys {
		got[k.Key] = k.Limited
	}
	if got["eve"] != 2 || got["gina"] != 2 || len(got) != 2 {
		t.Errorf("stopped: got %v, want eve 2 (7 failures) and gina 2 (7 unknown answers), not frank (7 successes)", got)
	}
}

// sortByAt orders a trace's requests by their offset, stably.
func sortByAt(reqs []loadtest.TraceRequest) {
	slices.SortStableFunc(reqs, func(a, b loadtest.TraceRequest) int { return cmp.Compare(a.At, b.At) })
}
