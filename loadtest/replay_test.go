package loadtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
	"github.com/valyala/fasthttp"
)

// startServer serves h on a loopback port until the test ends.
func startServer(t testing.TB, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, CloseOnShutdown: true}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Shutdown(); <-done })
	return ln.Addr().String()
}

func ok200(ctx *fasthttp.RequestCtx) {}

// steady returns n requests from ip spaced by every, as a Trace.
func steady(n int, every time.Duration, ips ...string) loadtest.Trace {
	return func(yield func(loadtest.TraceRequest, error) bool) {
		for i := 0; i < n; i++ {
			ip := "192.0.2.1"
			if len(ips) > 0 {
				ip = ips[i%len(ips)]
			}
			if !yield(loadtest.TraceRequest{At: time.Duration(i) * every, IP: netip.MustParseAddr(ip), Path: "/p"}, nil) {
				return
			}
		}
	}
}

// TestPacing replays a bounded run against a local server and checks that
// requests leave at the scheduled rate, at speed 1 and at speed 2.
func TestPacing(t *testing.T) {
	addr := startServer(t, ok200)
	tests := []struct {
		name  string
		every time.Duration
		speed float64
		n     int
		want  float64 // scheduled requests per second
	}{
		{"1000/s at speed 1", time.Millisecond, 1, 3000, 1000},
		{"500/s at speed 4", 2 * time.Millisecond, 4, 4000, 2000},
	}
	for _, tt := range tests {
		rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Speed: tt.speed, MaxOutstanding: 1000}, steady(tt.n, tt.every))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: scheduled %.1f/s, sent %.1f/s, completed %.1f/s; send lag p50 %.3fms p99 %.3fms max %.3fms; latency p99 %.3fms",
			tt.name, rep.ScheduledRate, rep.SentRate, rep.CompletedRate, rep.SendLag.P50Millis, rep.SendLag.P99Millis, rep.SendLag.MaxMillis, rep.Latency.P99Millis)
		if rep.Scheduled != int64(tt.n) || rep.Sent != int64(tt.n) || rep.Completed != int64(tt.n) || rep.NotSent != 0 || rep.Statuses["200"] != int64(tt.n) {
			t.Errorf("%s: got scheduled %d sent %d completed %d not sent %d statuses %v, want all %d sent and answered 200",
				tt.name, rep.Scheduled, rep.Sent, rep.Completed, rep.NotSent, rep.Statuses, tt.n)
		}
		if math.Abs(rep.ScheduledRate-tt.want)/tt.want > 0.001 {
			t.Errorf("%s: got scheduled rate %.2f/s, want %.0f/s", tt.name, rep.ScheduledRate, tt.want)
		}
		if d := math.Abs(rep.SentRate-rep.ScheduledRate) / rep.ScheduledRate; d > 0.03 {
			t.Errorf("%s: sent %.1f/s against %.1f/s scheduled: off by %.1f%%, want within 3%%", tt.name, rep.SentRate, rep.ScheduledRate, 100*d)
		}
		if rep.Stopped != loadtest.StopEnd {
			t.Errorf("%s: stopped %q, want %q", tt.name, rep.Stopped, loadtest.StopEnd)
		}
	}
}

// TestLatencyCountsFromSchedule stalls the server on the first request
// while one connection is allowed: the requests due behind it wait, and a
// closed-loop tool would hide that (coordinated omission). Here they are
// sent on schedule (into the pool) and their latency counts the wait.
func TestLatencyCountsFromSchedule(t *testing.T) {
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/stall" {
			time.Sleep(500 * time.Millisecond)
		}
	})
	trace := func(yield func(loadtest.TraceRequest, error) bool) {
		for i := 0; i < 50; i++ {
			p := "/p"
			if i == 0 {
				p = "/stall"
			}
			if !yield(loadtest.TraceRequest{At: time.Duration(i) * 10 * time.Millisecond, IP: netip.MustParseAddr("192.0.2.1"), Path: p}, nil) {
				return
			}
		}
	}
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, ConnsPerTarget: 1}, trace)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("latency p50 %.1fms p90 %.1fms max %.1fms; send lag p99 %.2fms", rep.Latency.P50Millis, rep.Latency.P90Millis, rep.Latency.MaxMillis, rep.SendLag.P99Millis)
	// Request i (due at 10i ms) is answered after the stall: ≈ 500 − 10i ms.
	if rep.Completed != 50 || rep.Latency.P50Millis < 200 || rep.Latency.MaxMillis < 480 {
		t.Errorf("got %d completed, latency p50 %.1fms max %.1fms; want 50, p50 ≥ 200ms, max ≥ 480ms (the queue behind the stall)",
			rep.Completed, rep.Latency.P50Millis, rep.Latency.MaxMillis)
	}
	if rep.SendLag.P90Millis > 50 {
		t.Errorf("send lag p90 %.1fms: requests did not leave on schedule", rep.SendLag.P90Millis)
	}
}

func TestMaxOutstandingCountsNotSent(t *testing.T) {
	release := make(chan struct{})
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) { <-release })
	var results sync.Map
	cfg := loadtest.ReplayConfig{Targets: []string{addr}, MaxOutstanding: 5, OnResult: func(r loadtest.Result) { results.Store(r.Index, r) }}
	go func() { time.Sleep(300 * time.Millisecond); close(release) }()
	rep, err := loadtest.Replay(context.Background(), cfg, steady(100, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent != 5 || rep.NotSent != 95 || rep.Scheduled != 100 || rep.Completed != 5 {
		t.Errorf("got sent %d not sent %d scheduled %d completed %d, want 5, 95, 100, 5", rep.Sent, rep.NotSent, rep.Scheduled, rep.Completed)
	}
	notSent := 0
	results.Range(func(_, v any) bool {
		if v.(loadtest.Result).NotSent {
			notSent++
		}
		return true
	})
	if notSent != 95 {
		t.Errorf("OnResult saw %d not sent, want 95", notSent)
	}
}

func TestTargetsSpread(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]map[string]int{} // target → client → requests
	handler := func(name string) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			defer mu.Unlock()
			if seen[name] == nil {
				seen[name] = map[string]int{}
			}
			seen[name][string(ctx.Request.Header.Peek("X-Forwarded-For"))]++
		}
	}
	a, b := startServer(t, handler("a")), startServer(t, handler("b"))
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "2001:db8::8"}
	for _, tt := range []struct {
		spread loadtest.Spread
		check  func() string
	}{
		{loadtest.ByClient, func() string {
			for _, ip := range ips {
				if seen["a"][ip] > 0 && seen["b"][ip] > 0 {
					return ip + " went to both targets"
				}
			}
			if len(seen["a"]) == 0 || len(seen["b"]) == 0 {
				return fmt.Sprintf("one target got nothing: %v", seen)
			}
			return ""
		}},
		{loadtest.RoundRobin, func() string {
			for _, ip := range ips {
				if seen["a"][ip]+seen["b"][ip] != 10 {
					return ip + " did not send 10"
				}
			}
			if sum(seen["a"]) != 40 || sum(seen["b"]) != 40 {
				return fmt.Sprintf("round robin split %d/%d, want 40/40", sum(seen["a"]), sum(seen["b"]))
			}
			return ""
		}},
	} {
		clear(seen)
		rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{a, b}, Spread: tt.spread}, steady(80, 100*time.Microsecond, ips...))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if msg := tt.check(); msg != "" || rep.Completed != 80 {
			t.Errorf("%v: %s (completed %d of 80)", tt.spread, msg, rep.Completed)
		}
		mu.Unlock()
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func TestBoundsAndCancel(t *testing.T) {
	addr := startServer(t, ok200)
	background := func() (context.Context, func()) { return context.Background(), func() {} }
	tests := []struct {
		name    string
		ctx     func() (context.Context, func())
		cfg     loadtest.ReplayConfig
		stopped string
		maxSent int64
	}{
		{"request bound", background, loadtest.ReplayConfig{MaxRequests: 7}, loadtest.StopRequests, 7},
		{"duration bound", background, loadtest.ReplayConfig{Duration: 100 * time.Millisecond}, loadtest.StopDuration, 10},
		{"canceled", func() (context.Context, func()) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(155*time.Millisecond, cancel)
			return ctx, cancel
		}, loadtest.ReplayConfig{}, loadtest.StopCanceled, 16},
	}
	for _, tt := range tests {
		tt.cfg.Targets = []string{addr}
		ctx, cancel := tt.ctx()
		start := time.Now()
		rep, err := loadtest.Replay(ctx, tt.cfg, steady(1000, 10*time.Millisecond))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Stopped != tt.stopped || rep.Sent > tt.maxSent || rep.Sent < tt.maxSent-3 || time.Since(start) > 2*time.Second {
			t.Errorf("%s: got stopped %q after %d sent in %v, want %q after about %d", tt.name, rep.Stopped, rep.Sent, time.Since(start), tt.stopped, tt.maxSent)
		}
	}
}

func TestRulesStatusesAndErrors(t *testing.T) {
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/limited":
			ctx.SetStatusCode(429)
			ctx.Response.Header.Set("RateLimit", `"login";r=0;t=30`)
		case "/limited-body":
			ctx.SetStatusCode(429)
			ctx.SetBodyString(`{"title":"Too Many Requests","status":429,"policy":"api","limit":3}`)
		case "/allowed":
			ctx.Response.Header.Set("RateLimit", `"api";r=2;t=60, "other";r=9;t=1`)
		case "/teapot":
			ctx.SetStatusCode(418)
		}
	})
	trace := func(yield func(loadtest.TraceRequest, error) bool) {
		for i, p := range []string{"/limited", "/limited-body", "/allowed", "/allowed", "/none", "/teapot"} {
			r := loadtest.TraceRequest{At: time.Duration(i) * time.Millisecond, IP: netip.MustParseAddr("192.0.2.1"), Path: p, Count: 1}
			if p == "/limited" {
				r.Count = 3
			}
			if !yield(r, nil) {
				return
			}
		}
		yield(loadtest.TraceRequest{}, &loadtest.LineError{Line: 9, Reason: loadtest.ReasonJSON})
	}
	dead := func() string { // a port nobody listens on
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		return ln.Addr().String()
	}()
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}}, trace)
	if err != nil {
		t.Fatal(err)
	}
	want := []loadtest.RuleCount{{Rule: "", Allowed: 1}, {Rule: "api", Allowed: 2, Limited: 1}, {Rule: "login", Limited: 3}}
	if fmt.Sprint(rep.Rules) != fmt.Sprint(want) {
		t.Errorf("got rules %+v, want %+v", rep.Rules, want)
	}
	if rep.Statuses["429"] != 4 || rep.Statuses["200"] != 3 || rep.Statuses["418"] != 1 || rep.BadLines != 1 || rep.Scheduled != 8 {
		t.Errorf("got statuses %v, bad lines %d, scheduled %d; want 429: 4, 200: 3, 418: 1, 1 bad line, 8 due", rep.Statuses, rep.BadLines, rep.Scheduled)
	}
	rep, err = loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{dead}, Timeout: time.Second}, steady(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors["connection refused"] != 3 || rep.Completed != 0 {
		t.Errorf("a dead target: got errors %v, completed %d; want 3 refused", rep.Errors, rep.Completed)
	}
}

func TestTraceErrorStopsReplay(t *testing.T) {
	addr := startServer(t, ok200)
	boom := fmt.Errorf("loadtest: read trace: disk on fire")
	trace := func(yield func(loadtest.TraceRequest, error) bool) {
		if yield(loadtest.TraceRequest{IP: netip.MustParseAddr("192.0.2.1")}, nil) {
			yield(loadtest.TraceRequest{}, boom)
		}
	}
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}}, trace)
	if err != boom || rep == nil || rep.Sent != 1 || rep.Stopped != loadtest.StopTraceError {
		t.Errorf("got %v and %+v, want the trace's error and a report of the one request sent", err, rep)
	}
}

func TestAggregatorReportEmbedded(t *testing.T) {
	addr := startServer(t, ok200)
	agg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/report" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"judged": 10, "enforced": {"decisions": 10, "wrongly_allowed": 1, "wrong_ratio": 0.1}, "mean_relative_error": 0.06}`)
	}))
	defer agg.Close()
	for _, tt := range []struct{ path, wantJSON, wantErr string }{
		{"/report", `"aggregator":{"judged":10,"enforced":{"decisions":10,"wrongly_allowed":1,"wrong_ratio":0.1},"mean_relative_error":0.06}`, ""},
		{"/missing", "", "404"},
	} {
		rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, AggregatorURL: agg.URL + tt.path}, steady(2, time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(rep)
		if tt.wantJSON != "" && !bytes.Contains(js, []byte(tt.wantJSON)) {
			t.Errorf("%s: report JSON %s, want it to hold %s", tt.path, js, tt.wantJSON)
		}
		if !strings.Contains(rep.AggregatorError, tt.wantErr) || (tt.wantErr == "") != (rep.AggregatorError == "") {
			t.Errorf("%s: aggregator error %q, want %q", tt.path, rep.AggregatorError, tt.wantErr)
		}
		var text bytes.Buffer
		rep.WriteText(&text)
		want := "wrongly allowed 1, wrongly limited 0, wrong 10.0000%"
		if tt.wantErr != "" {
			want = "aggregator   unavailable"
		}
		if !strings.Contains(text.String(), want) {
			t.Errorf("%s: text report lacks %q:\n%s", tt.path, want, text.String())
		}
	}
}

func TestProgressLine(t *testing.T) {
	addr := startServer(t, ok200)
	var buf syncBuffer
	_, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Progress: &buf, ProgressInterval: 20 * time.Millisecond}, steady(20, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); !strings.Contains(s, "\r\033[K") || !strings.Contains(s, "sent ") || !strings.HasSuffix(s, "\r\033[K") {
		t.Errorf("progress output %q: want rewritten lines ending with a cleared line", s)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestReplayConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  loadtest.ReplayConfig
		want string
	}{
		{loadtest.ReplayConfig{}, "Targets []"},
		{loadtest.ReplayConfig{Targets: []string{"nohostport"}}, `Targets "nohostport"`},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, Speed: -1}, "Speed -1"},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, MaxOutstanding: -1}, "MaxOutstanding -1"},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, PathPrefix: "check"}, `PathPrefix "check"`},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, AggregatorURL: "ftp://x/report"}, "AggregatorURL"},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, ClientIPHeader: "X Bad"}, "ClientIPHeader"},
		{loadtest.ReplayConfig{Targets: []string{"a:1"}, Align: -time.Second}, "Align -1s"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
	// Every problem is reported at once.
	err := loadtest.ReplayConfig{Speed: -1, Timeout: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Targets") || !strings.Contains(err.Error(), "Speed") || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("got %v, want Targets, Speed and Timeout named", err)
	}
}

func TestReplaySendsTheTraceRequest(t *testing.T) {
	got := make(chan string, 1)
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) {
		got <- fmt.Sprintf("%s %s host=%s xff=%s key=%s", ctx.Method(), ctx.RequestURI(), ctx.Host(),
			ctx.Request.Header.Peek("X-Forwarded-For"), ctx.Request.Header.Peek("X-API-Key"))
	})
	tr := func(yield func(loadtest.TraceRequest, error) bool) {
		yield(loadtest.TraceRequest{IP: netip.MustParseAddr("2001:db8::5"), Method: "POST", Host: "api.example", Path: "//a/../b?q=1", Headers: map[string]string{"X-API-Key": "k1"}}, nil)
	}
	if _, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, PathPrefix: "/check"}, tr); err != nil {
		t.Fatal(err)
	}
	if s, want := <-got, "POST /check//a/../b?q=1 host=api.example xff=2001:db8::5 key=k1"; s != want {
		t.Errorf("server saw %q, want %q", s, want)
	}
}

// TestReplaySendsTheBody: a trace line's body and content type reach the
// server as they are, for a rule keyed on a body field to read.
func TestReplaySendsTheBody(t *testing.T) {
	got := make(chan string, 1)
	addr := startServer(t, func(ctx *fasthttp.RequestCtx) {
		got <- fmt.Sprintf("%s %s ct=%s len=%d body=%s", ctx.Method(), ctx.RequestURI(), ctx.Request.Header.ContentType(),
			ctx.Request.Header.ContentLength(), ctx.PostBody())
		ctx.SetStatusCode(fasthttp.StatusUnauthorized)
	})
	body := "username=Alice%40example.com&password=hunter3"
	tr := func(yield func(loadtest.TraceRequest, error) bool) {
		yield(loadtest.TraceRequest{IP: netip.MustParseAddr("192.0.2.5"), Method: "POST", Path: "/login",
			ContentType: "application/x-www-form-urlencoded", Body: body}, nil)
	}
	var results bytes.Buffer
	if _, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Results: &results}, tr); err != nil {
		t.Fatal(err)
	}
	if s, want := <-got, fmt.Sprintf("POST /login ct=application/x-www-form-urlencoded len=%d body=%s", len(body), body); s != want {
		t.Errorf("server saw %q, want %q", s, want)
	}
	lines := strings.Split(results.String(), "\n")
	if f := strings.Split(lines[min(1, len(lines)-1)], "\t"); len(f) < 10 || f[9] != "401" {
		t.Errorf("results line %q: want the origin's 401 in its status column", results.String())
	}
}

// BenchmarkReplaySaturated measures the replayer's own cost per request
// when every request is due at once against a local server: what it can
// push, and how much of it the outstanding bound turns away; "results"
// writes the results file as well (replay -results), to show what it costs.
func BenchmarkReplaySaturated(b *testing.B) {
	addr := startServer(b, ok200)
	for _, withResults := range []bool{false, true} {
		name := "plain"
		if withResults {
			name = "results"
		}
		b.Run(name, func(b *testing.B) {
			cfg := loadtest.ReplayConfig{Targets: []string{addr}, MaxOutstanding: 512}
			if withResults {
				f, err := os.Create(filepath.Join(b.TempDir(), "results.tsv"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				cfg.Results = f
			}
			tr := func(yield func(loadtest.TraceRequest, error) bool) {
				for i := 0; i < b.N; i++ {
					if !yield(loadtest.TraceRequest{IP: netip.MustParseAddr("192.0.2.1"), Path: "/"}, nil) {
						return
					}
				}
			}
			b.ReportAllocs()
			rep, err := loadtest.Replay(context.Background(), cfg, tr)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(rep.NotSent)/float64(max(rep.Scheduled, 1)), "not-sent/op")
		})
	}
}

func ExampleReplay() {
	// A stand-in for an edge: it allows everything under rule "api".
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("RateLimit", `"api";r=99;t=60`)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()

	trace, _ := loadtest.Abuser(loadtest.AbuserConfig{Rate: 100, Duration: 100 * time.Millisecond})
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{
		Targets: []string{ln.Addr().String()},
		Speed:   2, // 200 requests per second
	}, trace)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rep.Stopped, rep.Sent, rep.Statuses, rep.Rules)
	// Output: end of trace 10 map[200:10] [{api 10 0}]
}
