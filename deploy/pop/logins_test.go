package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/rules"
	"github.com/valyala/fasthttp"
)

// TestDemoRulesCountFailedLogins: the demo's rules parse, for one PoP and
// for several, and hold failed logins per account, by the form's
// username in any letter case, and per address, counting the origin's 401.
func TestDemoRulesCountFailedLogins(t *testing.T) {
	for _, scope := range []string{"pop", "global"} {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(demoRules, scope)), 0o644); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(path)
		rs, err := rules.ParseRules(data)
		if err != nil {
			t.Fatalf("scope %s: the demo rules do not parse: %v", scope, err)
		}
		got := countingRules(path)
		if !got["failed-logins-account"] || !got["failed-logins-ip"] || len(got) != 2 {
			t.Errorf("scope %s: counting rules %v, want failed-logins-account and failed-logins-ip", scope, got)
		}
		for _, r := range rs.Rules {
			if r.Name == "failed-logins-account" && (r.Limit != demoAccountLimit || !r.Count.Counts(401) || r.Count.Counts(200)) {
				t.Errorf("failed-logins-account: limit %d, counts 401 %v, 200 %v; want %d, true, false",
					r.Limit, r.Count.Counts(401), r.Count.Counts(200), demoAccountLimit)
			}
		}
	}
}

// TestOriginLogins: the demo origin answers a login with the account's
// password 200, and every other 401, from a form or a JSON body.
func TestOriginLogins(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: originHandler}
	go srv.Serve(ln)
	defer srv.Shutdown()
	base := "http://" + ln.Addr().String()
	right := loadtest.StuffingPassword("member00001@example.com")
	tests := []struct {
		method, path, ct, body string
		want                   int
	}{
		{"POST", "/login", "application/x-www-form-urlencoded", "username=member00001%40example.com&password=" + right, 200},
		{"POST", "/login", "application/x-www-form-urlencoded; charset=utf-8", "username=Member00001%40Example.com&password=" + right, 200},
		{"POST", "/login", "application/x-www-form-urlencoded", "username=member00001%40example.com&password=guess", 401},
		{"POST", "/login", "application/x-www-form-urlencoded", "username=a&username=b&password=" + right, 401},
		{"POST", "/login", "application/json", `{"user":{"email":"member00001@example.com"},"password":"` + right + `"}`, 200},
		{"POST", "/login", "application/json", `{"user":{"email":"member00001@example.com"},"password":"x"}`, 401},
		{"POST", "/login", "text/plain", "member00001@example.com " + right, 401},
		{"GET", "/login", "", "", 200},
		{"GET", "/", "", "", 200},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
		if tt.ct != "" {
			req.Header.Set("Content-Type", tt.ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s %q: got %d, want %d", tt.method, tt.path, tt.body, resp.StatusCode, tt.want)
		}
	}
}

// TestLoginSummary: the login summary follows each login from the trace
// to its result: attackers' attempts per account, honest users refused
// or not, and the judge's figures for the counting rules.
func TestLoginSummary(t *testing.T) {
	tr, err := loadtest.Stuffing(loadtest.StuffingConfig{Seed: 1, IPs: 30, Attempts: 3, Accounts: 4, Body: "form",
		HonestUsers: 5, HonestRate: 5, Mistype: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	lt := newLoginTally()
	var i int64
	perAccount := map[string]int{}
	for r := range lt.trace(tr) {
		user, pw := loginCredentials([]byte(r.ContentType), []byte(r.Body))
		status := 401
		switch {
		case pw == loadtest.StuffingPassword(user):
			status = 200
		case strings.HasPrefix(user, "victim"):
			// the edges let 5 failures per account through
			if perAccount[user]++; perAccount[user] > 5 {
				status = 429
			}
		}
		lt.result(loadtest.Result{Index: i, Status: status})
		i++
	}
	jr := judge.Report{ByRule: []judge.Breakdown{
		{Name: "failed-logins-account", Enforced: judge.DecisionTally{Decisions: 120, WronglyLimited: 1, WrongRatio: 1.0 / 120}},
		{Name: "per-client", Enforced: judge.DecisionTally{Decisions: 1000}},
	}}
	raw, _ := json.Marshal(jr)
	var out bytes.Buffer
	if err := writeLogins(&out, lt, &loadtest.ReplayReport{Aggregator: raw}, map[string]bool{"failed-logins-account": true}, 5); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		"attackers: 90 attempts on 4 accounts: 20 reached the origin, 70 stopped by the edges",
		"per account at most 5 wrong passwords reached the origin",
		"none refused",
		"judge, failed-logins-account (counts by response): 120 decisions, 0.8333% wrong (0 wrongly allowed, 1 wrongly limited)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("login summary lacks %q", want)
		}
	}
	if strings.Contains(s, "per-client") {
		t.Errorf("login summary lists per-client, which does not count by response")
	}
}
