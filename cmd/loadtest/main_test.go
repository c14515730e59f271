package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestGenStuffingAccounts: gen -kind stuffing with accounts, bodies and
// honest users writes login attempts whose bodies name the accounts.
func TestGenStuffingAccounts(t *testing.T) {
	out, _, err := runCmd(t, "", "gen", "-kind", "stuffing", "-ips", "50", "-accounts", "4", "-body", "form",
		"-honest-users", "3", "-honest-rate", "5", "-mistype", "0.3")
	if err != nil {
		t.Fatal(err)
	}
	victims, members := 0, 0
	for r, err := range loadtest.NewReader(strings.NewReader(out)).All() {
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(r.Body, "username=victim"):
			victims++
		case strings.Contains(strings.ToLower(r.Body), "username=member"):
			members++
		default:
			t.Fatalf("body %q names no account", r.Body)
		}
	}
	if victims != 150 || members == 0 {
		t.Errorf("got %d attacks and %d honest logins, want 150 and some", victims, members)
	}
	if _, _, err := runCmd(t, "", "gen", "-kind", "stuffing", "-body", "xml"); err == nil || !strings.Contains(err.Error(), "Body") {
		t.Errorf("-body xml: got %v, want an error naming Body", err)
	}
}

func TestImportCorpus(t *testing.T) {
	out, errOut, err := runCmd(t, "", "import", "-show-bad", "2", "../../loadtest/testdata/access.log")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 23 {
		t.Errorf("got %d trace lines, want 23", n)
	}
	if !strings.Contains(errOut, "41 lines, 23 good, 18 bad, 0 placed late") || strings.Count(errOut, "bad line ") != 2 ||
		!strings.Contains(errOut, "cut off: 1 good line") || !strings.Contains(errOut, "up to 27s out of time order, sorted whole") {
		t.Errorf("summary on stderr:\n%s\nwant 41 lines, 23 good, 18 bad, 0 late, 1 cut off, sorted whole, and the first 2 bad lines shown", errOut)
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
	var rep loadtest.ReplayReport
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

// TestReplayAlignPhaseAndResults: -align and -phase put the start on the
// window grid and the report and stderr say so; -results writes a line per
// request.
func TestReplayAlignPhaseAndResults(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("RateLimit-Policy", `"api";q=100;w=60`)
		ctx.Response.Header.Set("RateLimit", `"api";r=99;t=60`)
	}}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	defer func() { srv.Shutdown(); <-done }()
	trace, _, err := runCmd(t, "", "gen", "-kind", "abuser", "-abuser-rate", "100", "-duration", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "results.tsv")
	out, errOut, err := runCmd(t, trace, "replay", "-targets", ln.Addr().String(), "-align", "500ms", "-phase", "125ms", "-results", results, "-json")
	if err != nil {
		t.Fatal(err)
	}
	var rep loadtest.ReplayReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if rep.Start.UnixNano()%int64(500*time.Millisecond) != int64(125*time.Millisecond) || rep.PhaseMillis != 125 || rep.AlignMillis != 500 {
		t.Errorf("start %v, phase %vms of %vms: want 125ms past a multiple of 500ms", rep.Start, rep.PhaseMillis, rep.AlignMillis)
	}
	if !strings.Contains(errOut, "phase 125ms against a 500ms window grid") {
		t.Errorf("stderr %q: want the phase said before the start", errOut)
	}
	data, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 11 || lines[0]+"\n" != loadtest.ResultsHeader || rep.ResultsLines != 10 {
		t.Fatalf("results file:\n%s\nwant the header and 10 lines", data)
	}
	for _, l := range lines[1:] {
		f := strings.Split(l, "\t")
		if len(f) != 17 || f[9] != "200" || f[10] != "answered" || f[11] != "api" || f[12] != "100" || f[13] != "99" || f[15] != "60" {
			t.Errorf("results line %q: want 200 answered by api, limit 100, remaining 99, window 60", l)
		}
	}
	if _, _, err := runCmd(t, trace, "replay", "-targets", ln.Addr().String(), "-phase", "1s"); err == nil || !strings.Contains(err.Error(), "-phase needs -align") {
		t.Errorf("-phase without -align: got %v", err)
	}
}

// TestImportSortsADisorderedLog: a log with lines up to a minute out of
// order (Apache stamps a request's start and logs its end) is sorted whole.
func TestImportSortsADisorderedLog(t *testing.T) {
	var b strings.Builder
	base := time.Date(2024, 5, 7, 10, 0, 0, 0, time.UTC)
	for i := 0; i < 3000; i++ {
		began := base.Add(time.Duration(i)*40*time.Millisecond - time.Duration(i*7919%60)*time.Second).Truncate(time.Second)
		fmt.Fprintf(&b, "192.0.2.%d - - [%s] \"GET /r/%d HTTP/1.1\" 200 5 \"-\" \"Mozilla/5.0\"\n", i%200, began.Format("02/Jan/2006:15:04:05 -0700"), i)
	}
	b.WriteString(`192.0.2.1 - - [07/May/2024:10:02:00 +0000] "GET /cut HTTP/1.1" 200 5 "-" "Mozilla/5.0 (X11; Lin` + "\n")
	log := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(log, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCmd(t, "", "import", log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "3001 lines, 3001 good, 0 bad, 0 placed late") || !strings.Contains(errOut, "sorted whole") {
		t.Errorf("summary:\n%s\nwant 3001 good, 0 late, sorted whole", errOut)
	}
	if n := strings.Count(out, "\n"); n != 3001 {
		t.Errorf("got %d trace lines, want 3001", n)
	}
	_, errOut, err = runCmd(t, "", "import", "-max-lines", "500", log)
	if err != nil || !strings.Contains(errOut, "sorted within a 59s window") {
		t.Errorf("-max-lines 500: %v, summary:\n%s\nwant a window grown to the 59 s of disorder", err, errOut)
	}
}

func TestOfflinePhase(t *testing.T) {
	trace, _, err := runCmd(t, "", "gen", "-kind", "burst", "-limit", "100", "-window", "1m")
	if err != nil {
		t.Fatal(err)
	}
	// The burst straddles the window edge at 60 s; shifted 30 s into the
	// grid, both halves fall in one window and the second is limited
	// outright, as it is at phase 0 by the sliding estimate.
	for _, phase := range []string{"0s", "30s"} {
		out, _, err := runCmd(t, trace, "offline", "-phase", phase, "-json")
		if err != nil {
			t.Fatal(err)
		}
		var rep loadtest.OfflineReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		d, _ := time.ParseDuration(phase)
		if !rep.Origin.Equal(time.Unix(0, 0).Add(d)) || rep.Requests != 200 || rep.Rules[0].Limited != 100 {
			t.Errorf("-phase %s: origin %v, %d requests, %d limited; want the epoch + %s, 200, 100", phase, rep.Origin, rep.Requests, rep.Rules[0].Limited, phase)
		}
	}
	if _, _, err := runCmd(t, trace, "offline", "-phase", "1s", "-origin", "2024-01-01T00:00:00Z"); err == nil {
		t.Error("-phase with -origin: no error")
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
