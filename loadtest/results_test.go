package loadtest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
	"github.com/valyala/fasthttp"
)

// resultLine is one parsed line of a results file.
type resultLine struct {
	index                           int64
	edge                            string
	scheduled, sent, answered       int64 // Unix ns; -1 for "-"
	client                          netip.Addr
	method, host, target            string
	status                          int
	outcome, rule                   string
	limit, remaining, reset, window int64 // -1 for "-"
	retryAfter                      int64
	fields                          []string
}

// readResults parses a results file: the header, then one line per request.
func readResults(t *testing.T, data []byte) []resultLine {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(data))
	if !sc.Scan() || sc.Text()+"\n" != loadtest.ResultsHeader {
		t.Fatalf("first line %q, want the header %q", sc.Text(), loadtest.ResultsHeader)
	}
	columns := len(strings.Split(strings.TrimSuffix(loadtest.ResultsHeader, "\n"), "\t"))
	num := func(s string) int64 {
		if s == "-" {
			return -1
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%q: not a number or -", s)
		}
		return n
	}
	var out []resultLine
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != columns {
			t.Fatalf("line %q: %d fields, want %d", sc.Text(), len(f), columns)
		}
		client, err := netip.ParseAddr(f[5])
		if err != nil {
			t.Fatalf("line %q: client: %v", sc.Text(), err)
		}
		out = append(out, resultLine{
			index: num(f[0]), edge: f[1], scheduled: num(f[2]), sent: num(f[3]), answered: num(f[4]),
			client: client, method: f[6], host: f[7], target: f[8], status: int(num(f[9])), outcome: f[10], rule: f[11],
			limit: num(f[12]), remaining: num(f[13]), reset: num(f[14]), window: num(f[15]), retryAfter: num(f[16]), fields: f,
		})
	}
	slices.SortFunc(out, func(a, b resultLine) int { return int(a.index - b.index) })
	return out
}

// TestReplayResultsFile replays a small trace through a real edge (5
// requests a minute per client) with -results and checks that the file has
// one line per request, each with what was sent and what the edge's quota
// headers said.
func TestReplayResultsFile(t *testing.T) {
	addr := startEdge(t, "rules: [{name: per-client, limit: 5, window: 1m}]")
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("198.51.100.9")
	var reqs []loadtest.TraceRequest
	at := time.Duration(0)
	next := func() time.Duration { at += 15 * time.Millisecond; return at }
	for i := 0; i < 8; i++ {
		reqs = append(reqs, loadtest.TraceRequest{At: next(), IP: a, Path: "/p/" + strconv.Itoa(i)})
		if i < 3 {
			reqs = append(reqs, loadtest.TraceRequest{At: next(), IP: b, Method: "PUT", Path: "/b?i=" + strconv.Itoa(i)})
		}
	}
	reqs = append(reqs, loadtest.TraceRequest{At: next(), IP: c, Method: "POST", Host: "api.example", Path: "/api/x?q=1", Count: 2})
	path := filepath.Join(t.TempDir(), "results.tsv")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, PathPrefix: "/check", Results: f}, sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := readResults(t, data)
	const n = 8 + 3 + 2
	if len(lines) != n || rep.ResultsLines != n || rep.ResultsError != "" || rep.Scheduled != n {
		t.Fatalf("got %d lines (report: %d, %q) for %d requests due, want %d", len(lines), rep.ResultsLines, rep.ResultsError, rep.Scheduled, n)
	}
	allowed := map[netip.Addr][]int64{} // client → remaining of its 200s
	limited := map[netip.Addr]int{}
	for i, l := range lines {
		if l.index != int64(i) {
			t.Fatalf("indexes %v: want 0 to %d, once each", l.index, n-1)
		}
		if l.edge != addr || l.outcome != loadtest.OutcomeAnswered || l.rule != "per-client" || l.limit != 5 || l.window != 60 {
			t.Errorf("line %v: want edge %s, answered, rule per-client, limit 5, window 60", l.fields, addr)
		}
		if l.scheduled <= 0 || l.sent < l.scheduled || l.answered < l.sent || l.sent-l.scheduled > int64(time.Second) {
			t.Errorf("line %v: want scheduled ≤ sent ≤ answered, sent within 1 s of schedule", l.fields)
		}
		if l.reset < 0 || l.reset > 120 { // a refusal's release can be up to two windows away
			t.Errorf("line %v: reset %d s, want 0 to 120", l.fields, l.reset)
		}
		req := reqs[min(i, len(reqs)-1)] // the last line's Count of 2 is two indexes
		wantMethod, wantHost := req.Method, req.Host
		if wantMethod == "" {
			wantMethod = "GET"
		}
		if wantHost == "" {
			wantHost = addr
		}
		if l.client != req.IP || l.method != wantMethod || l.host != wantHost || l.target != "/check"+req.Path {
			t.Errorf("line %v: want client %s, %s %s%s, host %s", l.fields, req.IP, wantMethod, "/check", req.Path, wantHost)
		}
		switch l.status {
		case 200:
			allowed[l.client] = append(allowed[l.client], l.remaining)
			if l.retryAfter != -1 {
				t.Errorf("line %v: Retry-After on a 200", l.fields)
			}
		case 429:
			limited[l.client]++
			if l.remaining != 0 || l.retryAfter < 1 {
				t.Errorf("line %v: a 429 with remaining %d, Retry-After %d; want 0 and at least 1", l.fields, l.remaining, l.retryAfter)
			}
		default:
			t.Errorf("line %v: status %d", l.fields, l.status)
		}
	}
	slices.Sort(allowed[a])
	if fmt.Sprint(allowed[a]) != "[0 1 2 3 4]" || limited[a] != 3 || len(allowed[b]) != 3 || len(allowed[c]) != 2 || limited[b]+limited[c] != 0 {
		t.Errorf("got allowed (remaining) %v and limited %v; want %s: remaining 4 down to 0 then 3 limited, the others all allowed", allowed, limited, a)
	}
}

// TestResultsOutcomesAndLegacyHeaders: lines for requests not sent and
// for transport errors, and the quota read from X-RateLimit-* alone.
func TestResultsOutcomesAndLegacyHeaders(t *testing.T) {
	release := make(chan struct{})
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/legacy":
			ctx.Response.Header.Set("X-RateLimit-Limit", "10")
			ctx.Response.Header.Set("X-RateLimit-Remaining", "3")
			ctx.Response.Header.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Unix()+30, 10))
		case "/draft":
			ctx.SetStatusCode(429)
			ctx.Response.Header.Set("RateLimit-Policy", `"login";q=5;w=60`)
			ctx.Response.Header.Set("RateLimit", `"login";r=0;t=42`)
			ctx.Response.Header.Set("Retry-After", "43")
		case "/stall":
			<-release
		}
	})
	dead := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		return ln.Addr().String()
	}()
	ip := netip.MustParseAddr("192.0.2.1")
	var buf bytes.Buffer
	trace := sliceTrace([]loadtest.TraceRequest{
		{At: 0, IP: ip, Path: "/legacy"},
		{At: time.Millisecond, IP: ip, Path: "/draft"},
		{At: 100 * time.Millisecond, IP: ip, Path: "/stall"},
		{At: 101 * time.Millisecond, IP: ip, Path: "/stall"},
		{At: 120 * time.Millisecond, IP: ip, Path: "/not-sent"},
	})
	go func() { time.Sleep(300 * time.Millisecond); close(release) }()
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, MaxOutstanding: 2, Results: &buf}, trace)
	if err != nil {
		t.Fatal(err)
	}
	lines := readResults(t, buf.Bytes())
	if len(lines) != 5 || rep.ResultsLines != 5 {
		t.Fatalf("got %d lines, want 5:\n%s", len(lines), buf.String())
	}
	if l := lines[0]; l.status != 200 || l.rule != "-" || l.limit != 10 || l.remaining != 3 || l.reset < 28 || l.reset > 31 || l.window != -1 {
		t.Errorf("legacy headers: got %v, want limit 10, remaining 3, reset about 30, no rule or window", l.fields)
	}
	if l := lines[1]; l.status != 429 || l.rule != "login" || l.limit != 5 || l.remaining != 0 || l.reset != 42 || l.window != 60 || l.retryAfter != 43 {
		t.Errorf("draft headers: got %v, want login, limit 5, remaining 0, reset 42, window 60, Retry-After 43", l.fields)
	}
	// Two outstanding: /legacy and /draft are answered well before the two
	// stalls take both tokens, so the last is not sent.
	if l := lines[4]; l.outcome != loadtest.OutcomeNotSent || l.sent != -1 || l.answered != -1 || l.status != 0 || l.target != "/not-sent" || l.limit != -1 {
		t.Errorf("not sent: got %v, want not-sent with no send or answer time and no quota\n%s", l.fields, buf.Bytes())
	}

	buf.Reset()
	if _, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{dead}, Timeout: time.Second, Results: &buf}, steady(2, time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for _, l := range readResults(t, buf.Bytes()) {
		if l.outcome != "connection-refused" || l.status != 0 || l.sent < 0 || l.answered < 0 || l.rule != "-" {
			t.Errorf("a dead target: got %v, want connection-refused with times and no status", l.fields)
		}
	}
}

// failingWriter fails every write after the first (the header).
type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.n++; w.n > 1 {
		return 0, fmt.Errorf("disk full")
	}
	return len(p), nil
}

func TestResultsWriteErrorIsReported(t *testing.T) {
	addr := startServer(t, ok200)
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Results: &failingWriter{}}, steady(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.ResultsError, "disk full") || rep.Sent != 3 {
		t.Errorf("got results error %q, %d sent; want the writer's error and the replay done", rep.ResultsError, rep.Sent)
	}
}

func TestAlignedStart(t *testing.T) {
	at := func(sec float64) time.Time { return time.Unix(0, int64(sec*1e9)) }
	tests := []struct {
		now          float64
		align, phase time.Duration
		want         float64
	}{
		{1000.3, 0, 0, 1000.3},
		{1000.3, 10 * time.Second, 0, 1010},
		{1000.3, 10 * time.Second, 2500 * time.Millisecond, 1002.5},
		{1003, 10 * time.Second, 2500 * time.Millisecond, 1012.5},
		{1002.5, 10 * time.Second, 2500 * time.Millisecond, 1012.5}, // exactly on it: the next
		{1000, 10 * time.Second, 0, 1010},
	}
	for _, tt := range tests {
		if got := loadtest.AlignedStart(at(tt.now), tt.align, tt.phase); !got.Equal(at(tt.want)) {
			t.Errorf("AlignedStart(%v, %v, %v) = %v, want %v", tt.now, tt.align, tt.phase, float64(got.UnixNano())/1e9, tt.want)
		}
	}
}

// TestReplayPhase starts a replay at a phase of a window grid and checks
// the start and what the report says of it.
func TestReplayPhase(t *testing.T) {
	addr := startServer(t, ok200)
	const align, phase = 300 * time.Millisecond, 75 * time.Millisecond
	var onStart time.Time
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Align: align, Phase: phase,
		OnStart: func(s time.Time) { onStart = s }}, steady(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(rep.Start.UnixNano() % int64(align)); got != phase || !onStart.Equal(rep.Start) {
		t.Errorf("start %v (OnStart %v) is %v past a multiple of %v, want %v", rep.Start, onStart, got, align, phase)
	}
	if rep.AlignMillis != 300 || rep.PhaseMillis != 75 {
		t.Errorf("report align %vms phase %vms, want 300 and 75", rep.AlignMillis, rep.PhaseMillis)
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	if !strings.Contains(text.String(), "phase 75ms against a 300ms window grid") {
		t.Errorf("text report does not say the phase:\n%s", text.String())
	}
	for _, cfg := range []loadtest.ReplayConfig{
		{Targets: []string{addr}, Phase: time.Second},
		{Targets: []string{addr}, Align: time.Second, Phase: time.Second},
		{Targets: []string{addr}, Align: time.Second, Phase: -time.Millisecond},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Phase") {
			t.Errorf("align %v phase %v: got %v, want an error naming Phase", cfg.Align, cfg.Phase, err)
		}
	}
}
