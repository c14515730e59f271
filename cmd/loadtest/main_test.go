package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/loadtest"
	"github.com/valyala/fasthttp"
)

func runCmd(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}

func TestGenIsReproducibleAndParses(t *testing.T) {
	for _, kind := range []string{"zipf", "abuser", "burst", "flood", "stuffing", "mix"} {
		a, _, err := runCmd(t, "", "gen", "-kind", kind, "-duration", "2s", "-seed", "5", "-ips", "20", "-window", "1s", "-limit", "5")
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		b, _, _ := runCmd(t, "", "gen", "-kind", kind, "-duration", "2s", "-seed", "5", "-ips", "20", "-window", "1s", "-limit", "5")
		if a != b || a == "" {
			t.Errorf("%s: two runs with one seed differ (or are empty)", kind)
		}
		for _, err := range loadtest.NewReader(strings.NewReader(a)).All() {
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		}
	}
}

func TestImportCorpus(t *testing.T) {
	out, errOut, err := runCmd(t, "", "import", "-show-bad", "2", "../../loadtest/testdata/access.log")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 22 {
		t.Errorf("got %d trace lines, want 22", n)
	}
	if !strings.Contains(errOut, "41 lines, 22 good, 19 bad") || strings.Count(errOut, "bad line ") != 2 {
		t.Errorf("summary on stderr:\n%s\nwant 41 lines, 22 good, 19 bad, and the first 2 bad lines shown", errOut)
	}
}

func TestOfflineFromGen(t *testing.T) {
	trace, _, err := runCmd(t, "", "gen", "-kind", "burst", "-limit", "100", "-window", "1m")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, trace, "offline", "-json")
	if err != nil {
		t.Fatal(err)
	}
	var rep loadtest.OfflineReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rep.Requests != 200 || len(rep.Rules) != 1 || rep.Rules[0].Rule != "default-per-client" || rep.Rules[0].Limited != 100 {
		t.Errorf("got %+v, want 200 requests, 100 limited by default-per-client", rep)
	}
	text, _, err := runCmd(t, trace, "offline")
	if err != nil || !strings.Contains(text, "198.51.100.1") {
		t.Errorf("text report %q (%v): want the burst's client as a top key", text, err)
	}
}

func TestReplayAgainstAServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {}}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	defer func() { srv.Shutdown(); <-done }()
	trace, _, err := runCmd(t, "", "gen", "-kind", "abuser", "-abuser-rate", "100", "-duration", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, trace, "replay", "-targets", ln.Addr().String(), "-json", "-speed", "2")
	if err != nil {
		t.Fatal(err)
	}
	var rep loadtest.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rep.Sent != 20 || rep.Statuses["200"] != 20 {
		t.Errorf("got sent %d statuses %v, want 20 answered 200", rep.Sent, rep.Statuses)
	}
	text, _, err := runCmd(t, trace, "replay", "-targets", ln.Addr().String(), "-requests", "5")
	if err != nil || !strings.Contains(text, "stopped: request bound") || !strings.Contains(text, "p99.9") {
		t.Errorf("text report %q (%v)", text, err)
	}
}

func TestBadInvocations(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"gen", "-kind", "nope"}, `-kind "nope"`},
		{[]string{"gen", "-kind", "zipf", "-zipf-s", "0.5"}, "S 0.5"},
		{[]string{"replay", "-targets", ""}, "Targets"},
		{[]string{"replay", "-spread", "random"}, `-spread "random"`},
		{[]string{"offline", "-rules", "/nonexistent.yaml"}, "no such file"},
		{[]string{"import", "a", "b"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		_, _, err := runCmd(t, "", tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want an error with %q", tt.args, err, tt.want)
		}
	}
}
