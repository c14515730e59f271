package httpedge_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/httpedge"
)

const decideToken = "s3cret-token-of-sixteen"

// postDecide posts body to the JSON decision endpoint with the token.
func postDecide(t *testing.T, addr, token, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/_poplimit/decide", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestDecideJSON(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{DecideToken: decideToken}})
	post := func(body string) (int, httpedge.DecideResponse) {
		resp := postDecide(t, e.addr, decideToken, body)
		defer resp.Body.Close()
		var d httpedge.DecideResponse
		json.NewDecoder(resp.Body).Decode(&d)
		return resp.StatusCode, d
	}
	if s, d := post(`{"rule":"api","key":"k","cost":2}`); s != 200 || !d.Allowed || d.Remaining != 1 {
		t.Errorf("cost 2 of 3: %d %+v", s, d)
	}
	if s, d := post(`{"rule":"api","key":"k","cost":2}`); s != 429 || d.Allowed || d.RetryMillis <= 0 {
		t.Errorf("cost 2 more: %d %+v", s, d)
	}
	if s, _ := post(`{"rule":"nope","key":"k"}`); s != 404 {
		t.Errorf("unknown rule: %d", s)
	}
	if s, _ := post(`{not json`); s != 400 {
		t.Errorf("bad json: %d", s)
	}
}

// The JSON endpoint spends any key's quota, so it needs its token: a
// caller without it (or with another) gets 401 and spends nothing; with no
// token configured the endpoint is off and the path is a check like any.
func TestDecideJSONNeedsItsToken(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1, window: 1m}]", cfg: httpedge.Config{DecideToken: decideToken}})
	for _, tok := range []string{"", "wrong-token-of-sixteen!", decideToken + "x"} {
		resp := postDecide(t, e.addr, tok, `{"rule":"api","key":"victim"}`)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("token %q: %d %v, want 401 with WWW-Authenticate", tok, resp.StatusCode, resp.Header)
		}
	}
	resp := postDecide(t, e.addr, decideToken, `{"rule":"api","key":"victim"}`)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the victim's first decision after the refused callers: %d, want 200 (nothing spent)", resp.StatusCode)
	}

	off := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1, window: 1m}]"})
	for i, want := range []int{200, 429} { // a check of the path, keyed by the caller's address
		resp := postDecide(t, off.addr, decideToken, `{"rule":"api","key":"victim"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || strings.Contains(string(body), `"allowed"`) {
			t.Errorf("endpoint off, request %d: %d %s, want %d as a check", i+1, resp.StatusCode, body, want)
		}
	}
}

// The JSON endpoint decides rate rules only: a concurrency or shed rule
// depends on live requests, and saying "allowed" for it would be a guess.
func TestDecideJSONRefusesLiveKinds(t *testing.T) {
	e := startEdge(t, edgeOpts{cfg: httpedge.Config{DecideToken: decideToken}, rules: `
rules:
  - {name: uploads, kind: concurrency, limit: 1}
  - {name: reports, kind: shed, path_prefix: /reports, priority: low}
  - {name: api, limit: 3, window: 1m}
`})
	for _, rule := range []string{"uploads", "reports"} {
		resp := postDecide(t, e.addr, decideToken, `{"rule":"`+rule+`","key":"k"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "cannot be decided for a key") {
			t.Errorf("%s: %d %s %s, want 422 problem+json saying it cannot be decided", rule, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
}
