package main

import (
	"io"
	"testing"

	"github.com/poplimit/poplimit/httpedge"
)

// The body and connection limits have their flags, whose defaults are
// the Config's.
func TestLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		body, perClient int
	}{
		{nil, httpedge.DefaultMaxDecisionBody, 1024},
		{[]string{"-max-decision-body-bytes", "4096", "-max-conns-per-client", "-1"}, 4096, -1},
		{[]string{"-max-conns-per-client", "64"}, httpedge.DefaultMaxDecisionBody, 64},
	} {
		o, _, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if o.Server.MaxDecisionBody != tc.body || o.Server.MaxConnsPerClient != tc.perClient {
			t.Errorf("%q: MaxDecisionBody %d MaxConnsPerClient %d, want %d and %d", tc.args, o.Server.MaxDecisionBody, o.Server.MaxConnsPerClient, tc.body, tc.perClient)
		}
	}
}
