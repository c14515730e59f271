package edge_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
)

const decisionToken = "settle-token-0123456789"

// decisionEdge starts a decision-mode edge with the failed-login rule, a
// decide token and the settle timeout given.
func decisionEdge(t *testing.T, settleTimeout time.Duration) *edge.Edge {
	var o edge.Options
	o.Server = httpedge.Config{Mode: httpedge.Decision, DecideToken: decisionToken}
	o.SettleTimeout = settleTimeout
	return edgetest.Start(t, failedLoginRules("sliding_window", "sync"), o)
}

// check asks the edge about POST /login for user, as nginx's
// auth_request does, and returns the status and the reservation id.
func check(t *testing.T, e *edge.Edge, user string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+e.Addr()+"/check/login", nil)
	req.Header.Set("X-User", user)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(httpedge.ReservationHeader)
}

// settleCall settles id with status, as an origin does, and returns the
// edge's answer.
func settleCall(t *testing.T, e *edge.Edge, id, status, token string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+e.Addr()+"/_poplimit/settle?id="+id+"&status="+status, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// In decision mode the edge answers before the origin: an admitted
// request of a counting rule gets a reservation id, settled by a call
// after the response. Successes settled 200 give their units back,
// failures keep them; an id settles once, a made-up id names nothing, the
// call needs the decide token; the JSON decide endpoint returns the id too.
func TestDecisionModeSettle(t *testing.T) {
	e := decisionEdge(t, time.Minute)
	for i := range 20 {
		s, id := check(t, e, "bob")
		if s != 200 || len(id) != 32 {
			t.Fatalf("check %d: %d, reservation %q; want 200 and a 32-digit id", i, s, id)
		}
		if got := settleCall(t, e, id, "200", decisionToken); got != 204 {
			t.Fatalf("settle %d: %d, want 204", i, got)
		}
		if got := settleCall(t, e, id, "401", decisionToken); got != 404 {
			t.Fatalf("settle %d again: %d, want 404 (an id settles once)", i, got)
		}
	}
	var ids []string
	for i := range 5 {
		s, id := check(t, e, "bob")
		if s != 200 || id == "" {
			t.Fatalf("failure %d: check %d, reservation %q", i, s, id)
		}
		ids = append(ids, id)
	}
	if s, id := check(t, e, "bob"); s != 429 || id != "" {
		t.Errorf("sixth while five are reserved: %d, reservation %q; want 429 and none", s, id)
	}
	if got := settleCall(t, e, strings.Repeat("0", 32), "200", decisionToken); got != 404 {
		t.Errorf("made-up id: %d, want 404", got)
	}
	if got := settleCall(t, e, ids[0], "200", ""); got != 401 {
		t.Errorf("settle without the token: %d, want 401", got)
	}
	if got := settleCall(t, e, ids[0], "abc", decisionToken); got != 400 {
		t.Errorf("settle without a status: %d, want 400", got)
	}
	for _, id := range ids[:4] {
		if got := settleCall(t, e, id, "401", decisionToken); got != 204 {
			t.Errorf("settle 401: %d, want 204", got)
		}
	}
	// One of the five succeeded: its unit comes back, and one more
	// attempt is admitted.
	if got := settleCall(t, e, ids[4], "200", decisionToken); got != 204 {
		t.Errorf("settle 200: %d, want 204", got)
	}
	s, id := check(t, e, "bob")
	if s != 200 {
		t.Fatalf("after a success gave its unit back: %d, want 200", s)
	}
	settleCall(t, e, id, "403", decisionToken)
	if s, _ := check(t, e, "bob"); s != 429 {
		t.Errorf("after 5 failures: %d, want 429", s)
	}

	// The JSON decide endpoint returns the reservation too.
	req, _ := http.NewRequest("POST", "http://"+e.Addr()+"/_poplimit/decide", strings.NewReader(`{"rule":"failed-logins","key":"carol"}`))
	req.Header.Set("Authorization", "Bearer "+decisionToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var dr httpedge.DecideResponse
	json.NewDecoder(resp.Body).Decode(&dr)
	resp.Body.Close()
	if !dr.Allowed || len(dr.Reservation) != 32 || resp.Header.Get(httpedge.ReservationHeader) != dr.Reservation {
		t.Fatalf("decide: %+v, header %q", dr, resp.Header.Get(httpedge.ReservationHeader))
	}
	if got := settleCall(t, e, dr.Reservation, "200", decisionToken); got != 204 {
		t.Errorf("settling the decide endpoint's reservation: %d, want 204", got)
	}
}

// A reservation nobody settles keeps its units after the settle timeout,
// as a request whose response never came: hanging up does not escape
// counting.
func TestDecisionModeUnsettledKeeps(t *testing.T) {
	e := decisionEdge(t, 200*time.Millisecond)
	for i := range 5 {
		if s, id := check(t, e, "mallory"); s != 200 || id == "" {
			t.Fatalf("attempt %d: %d %q", i, s, id)
		}
	}
	time.Sleep(time.Second)
	if got := metricSum(t, &testEdge{reg: e.Registry}, "poplimit_edge_settled_total", "how", "timeout"); got != 5 {
		t.Errorf("settled at the timeout: %v, want 5", got)
	}
	if s, _ := check(t, e, "mallory"); s != 429 {
		t.Errorf("after five unsettled attempts: %d, want 429", s)
	}
}
