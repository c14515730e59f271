package loadtest_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
)

var mst = time.FixedZone("", -7*3600)

// TestImportCorpus imports testdata/access.log, real-looking Apache and
// nginx lines with malformed ones among them, and checks every count.
func TestImportCorpus(t *testing.T) {
	f, err := os.Open("testdata/access.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	var bad []*loadtest.LineError
	sum, err := loadtest.Import(f, &out, loadtest.ImportConfig{Agents: true}, func(le *loadtest.LineError) { bad = append(bad, le) })
	if err != nil {
		t.Fatal(err)
	}
	wantReasons := map[string]int64{
		loadtest.ReasonLayout: 2, loadtest.ReasonEmpty: 1, loadtest.ReasonClient: 2, loadtest.ReasonDate: 3,
		loadtest.ReasonNoRequest: 1, loadtest.ReasonRequestLine: 2, loadtest.ReasonTarget: 2, loadtest.ReasonStatus: 2,
		loadtest.ReasonSize: 1, loadtest.ReasonQuote: 1, loadtest.ReasonTooLong: 1,
	}
	// Line 20's user agent is cut off: kept without it. Line 40 (/late) is
	// 27 s behind the newest line before it: the log is sorted whole, so it
	// comes first and nothing is late.
	if sum.Lines != 41 || sum.Good != 23 || sum.Bad != 18 || sum.Late != 0 || sum.Truncated != 1 || sum.MaxDisorderMillis != 27000 || sum.Streamed {
		t.Errorf("got %d lines, %d good, %d bad, %d late, %d truncated, disorder %vms, streamed %v; want 41, 23, 18, 0 late, 1 truncated, 27000ms, not streamed",
			sum.Lines, sum.Good, sum.Bad, sum.Late, sum.Truncated, sum.MaxDisorderMillis, sum.Streamed)
	}
	if !maps.Equal(sum.Reasons, wantReasons) {
		t.Errorf("got reasons %v, want %v", sum.Reasons, wantReasons)
	}
	if len(bad) != 18 {
		t.Fatalf("got %d bad-line reports, want 18", len(bad))
	}
	// Bad lines are reported with their numbers, in order.
	wantLines := []int{8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26}
	for i, le := range bad {
		if le.Line != wantLines[i] || le.Detail == "" {
			t.Errorf("bad line %d: got line %d %q, want line %d with a detail", i, le.Line, le.Error(), wantLines[i])
		}
	}
	first := time.Date(2000, 10, 10, 13, 55, 30, 0, mst) // /late's
	if !sum.First.Equal(first) || !sum.Last.Equal(first.Add(30*time.Second)) {
		t.Errorf("got first %v last %v, want %v and 30 s later (the leap second)", sum.First, sum.Last, first)
	}
	// The trace is in time order and every request parses back.
	byPath := map[string]loadtest.TraceRequest{}
	var prev time.Duration
	n := 0
	for r, err := range loadtest.NewReader(&out).All() {
		if err != nil {
			t.Fatal(err)
		}
		if r.At < prev {
			t.Errorf("%s at %v, before %v", r.Path, r.At, prev)
		}
		prev = r.At
		byPath[r.Path] = r
		n++
	}
	if n != 23 {
		t.Errorf("got %d requests in the trace, want 23", n)
	}
	checks := []struct {
		path   string
		ip     string
		at     time.Duration
		host   string
		method string
		ua     string
	}{
		{"/late", "192.0.2.63", 0, "", "GET", ""}, // 13:55:30, read after 13:55:57: sorted first
		{"/v6", "2001:db8::1", 7 * time.Second, "", "GET", "curl/8.5.0"},
		{"/login", "198.51.100.7", 8 * time.Second, "", "POST", "python-requests/2.31"},
		{"/search?q=%22quoted%22", "203.0.113.9", 9 * time.Second, "", "GET", `Mozilla/5.0 "Escaped" Agent`},
		{`/a"b`, "203.0.113.10", 10 * time.Second, "", "GET", ""},
		{"/caf%C3%A9", "198.51.100.20", 11 * time.Second, "", "GET", "Mozilla/5.0"},
		{"/", "192.0.2.7", 18 * time.Second, "", "GET", ""}, // its user agent cut off: dropped
		{"/vhost", "192.0.2.50", 21 * time.Second, "www.example.com", "GET", "Mozilla/5.0"},
		{"/abs?x=1", "192.0.2.51", 22 * time.Second, "proxy.example.com", "GET", ""},
		{"/old", "192.0.2.52", 22 * time.Second, "", "GET", ""},
		{"/a%20b", "192.0.2.53", 23 * time.Second, "", "GET", ""},
		{`/say"hi"`, "192.0.2.54", 23 * time.Second, "", "GET", ""},
		{"/rt", "192.0.2.55", 24 * time.Second, "", "GET", "agent"},
		{"/slow", "192.0.2.61", 24 * time.Second, "", "GET", ""},
		{"/dash", "192.0.2.57", 25 * time.Second, "", "GET", ""},
		{"/br", "2001:db8::2", 25 * time.Second, "", "GET", ""},
		{"/utc", "192.0.2.58", 26 * time.Second, "", "GET", ""},
		{"/ms", "192.0.2.59", 26250 * time.Millisecond, "", "GET", ""},
		{"/np", "192.0.2.60", 27 * time.Second, "", "GET", ""},
		{"/leap", "192.0.2.62", 30 * time.Second, "", "GET", ""},
	}
	for _, c := range checks {
		r, ok := byPath[c.path]
		if !ok {
			t.Errorf("%s: missing from the trace", c.path)
			continue
		}
		if r.IP.String() != c.ip || r.At != c.at || r.Host != c.host || r.Method != c.method || r.Headers["User-Agent"] != c.ua {
			t.Errorf("%s: got ip %s at %v host %q method %s ua %q; want %s %v %q %s %q",
				c.path, r.IP, r.At, r.Host, r.Method, r.Headers["User-Agent"], c.ip, c.at, c.host, c.method, c.ua)
		}
	}
	if ref := byPath["/search?q=%22quoted%22"].Headers["Referer"]; ref != `https://example.com/?a="b"` {
		t.Errorf("escaped referer: got %q", ref)
	}
	if h := byPath["/"].Headers; h["Referer"] != "http://ref/" || len(h) != 1 {
		t.Errorf("a cut-off user agent: got headers %q, want the referer alone", h)
	}
}

func TestParseCLF(t *testing.T) {
	tests := []struct {
		name, line string
		time       time.Time
		reason     string
	}{
		{"classic", `127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326`, time.Date(2000, 10, 10, 13, 55, 36, 0, mst), ""},
		{"single-digit day", `1.2.3.4 - - [1/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 1, 13, 55, 36, 0, mst), ""},
		{"leap day", `1.2.3.4 - - [29/Feb/2024:00:00:00 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC), ""},
		{"no leap day in 1900", `1.2.3.4 - - [29/Feb/1900:00:00:00 +0000] "GET / HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonDate},
		{"leap day in 2000", `1.2.3.4 - - [29/Feb/2000:00:00:00 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC), ""},
		{"leap second", `1.2.3.4 - - [31/Dec/2016:23:59:60 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC), ""},
		{"kiribati", `1.2.3.4 - - [10/Oct/2000:13:55:36 +1400] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 9, 23, 55, 36, 0, time.UTC), ""},
		{"zone with colon", `1.2.3.4 - - [10/Oct/2000:13:55:36 +05:30] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 8, 25, 36, 0, time.UTC), ""},
		{"no zone", `1.2.3.4 - - [10/Oct/2000:13:55:36] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 13, 55, 36, 0, time.UTC), ""},
		{"upper-case month", `1.2.3.4 - - [10/OCT/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 13, 55, 36, 0, time.UTC), ""},
		{"microseconds", `1.2.3.4 - - [10/Oct/2000:13:55:36.000123 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 13, 55, 36, 123000, time.UTC), ""},
		{"hour 24", `1.2.3.4 - - [10/Oct/2000:24:00:00 +0000] "GET / HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonDate},
		{"month 13", `1.2.3.4 - - [10/Foo/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonDate},
		{"two-digit year", `1.2.3.4 - - [10/Oct/00:13:55:36 +0000] "GET / HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonDate},
		{"zone 2400", `1.2.3.4 - - [10/Oct/2000:13:55:36 +2400] "GET / HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonDate},
		{"zoned ipv6 client", `fe80::1%eth0 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 13, 55, 36, 0, time.UTC), ""},
		{"tabs in request", "1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] \"GET\t/t\tHTTP/1.1\" 200 1", time.Date(2000, 10, 10, 13, 55, 36, 0, time.UTC), ""},
		{"backslash at the end", `1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /x\" 200 1`, time.Time{}, loadtest.ReasonQuote},
		{"relative target", `1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET index.html HTTP/1.1" 200 1`, time.Time{}, loadtest.ReasonTarget},
		{"lower-case method", `1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "get / HTTP/1.1" 200 1`, time.Date(2000, 10, 10, 13, 55, 36, 0, time.UTC), ""},
	}
	for _, tt := range tests {
		r, err := loadtest.ParseCLF([]byte(tt.line))
		var le *loadtest.LineError
		switch {
		case tt.reason != "":
			if !errors.As(err, &le) || le.Reason != tt.reason {
				t.Errorf("%s: got %v, want reason %q", tt.name, err, tt.reason)
			}
		case err != nil:
			t.Errorf("%s: got %v, want no error", tt.name, err)
		case !r.Time.Equal(tt.time):
			t.Errorf("%s: got time %v, want %v", tt.name, r.Time, tt.time)
		}
	}
}

func TestImportReorderBound(t *testing.T) {
	log := `1.1.1.1 - - [10/Oct/2000:13:55:36 +0000] "GET /a HTTP/1.1" 200 1
1.1.1.3 - - [10/Oct/2000:13:55:37 +0000] "GET /c HTTP/1.1" 200 1
1.1.1.2 - - [10/Oct/2000:13:55:35 +0000] "GET /b HTTP/1.1" 200 1
`
	tests := []struct {
		max      int
		wantLate int64
		order    string
	}{
		{0, 0, "[/b /a /c]"}, // the default bound holds all three: put back in order
		{1, 1, "[/a /b /c]"}, // one line held: /a is out before /b comes, so /b is late
	}
	for _, tt := range tests {
		im := loadtest.NewImporter(strings.NewReader(log), loadtest.ImportConfig{MaxBuffered: tt.max})
		var paths []string
		var ats []time.Duration
		for r, err := range im.All() {
			if err != nil {
				t.Fatal(err)
			}
			paths = append(paths, r.Path)
			ats = append(ats, r.At)
		}
		if s := im.Summary(); s.Late != tt.wantLate || fmt.Sprint(paths) != tt.order || ats[1] < ats[0] || ats[2] < ats[1] {
			t.Errorf("MaxBuffered %d: got late %d, order %v at %v; want late %d, order %s, offsets not decreasing",
				tt.max, s.Late, paths, ats, tt.wantLate, tt.order)
		}
	}
}

func TestImportSpread(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 4; i++ {
		fmt.Fprintf(&b, "1.1.1.%d - - [10/Oct/2000:13:55:36 +0000] \"GET / HTTP/1.1\" 200 1\n", i)
	}
	b.WriteString(`1.1.1.9 - - [10/Oct/2000:13:55:37 +0000] "GET / HTTP/1.1" 200 1` + "\n")
	var got []time.Duration
	for r, err := range loadtest.NewImporter(strings.NewReader(b.String()), loadtest.ImportConfig{Spread: true}).All() {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.At)
	}
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond, time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got offsets %v, want %v", got, want)
	}
}

func FuzzParseCLF(f *testing.F) {
	data, err := os.ReadFile("testdata/access.log")
	if err != nil {
		f.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) < 4096 {
			f.Add(append([]byte(nil), sc.Bytes()...))
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := loadtest.ParseCLF(line)
		if err != nil {
			var le *loadtest.LineError
			if !errors.As(err, &le) || le.Reason == "" {
				t.Fatalf("error %v is not a *LineError with a reason", err)
			}
			return
		}
		if !r.IP.IsValid() || r.Time.IsZero() || r.Method == "" || !strings.HasPrefix(r.Path, "/") {
			t.Fatalf("%q parsed to an incomplete request %+v", line, r)
		}
		// Whatever parses is a valid trace line, and survives the trip.
		out := loadtest.AppendTraceLine(nil, &r)
		r2, err := loadtest.ParseTraceLine(out)
		if err != nil {
			t.Fatalf("%q parsed to %+v, written as %s, which does not parse: %v", line, r, out, err)
		}
		if !sameRequest(r, r2) {
			t.Fatalf("%q: round trip got %+v, want %+v", line, r2, r)
		}
	})
}

func BenchmarkParseCLF(b *testing.B) {
	line := []byte(`203.0.113.9 - - [10/Oct/2000:13:55:39 -0700] "GET /search?q=x HTTP/1.1" 200 1043 "https://example.com/" "Mozilla/5.0 (X11; Linux x86_64)"`)
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := loadtest.ParseCLF(line); err != nil {
			b.Fatal(err)
		}
	}
}

func ExampleParseCLF() {
	r, err := loadtest.ParseCLF([]byte(`2001:db8::1 - - [10/Oct/2000:13:55:36 -0700] "GET /caf\xC3\xA9?q=1 HTTP/1.1" 200 512 "-" "curl/8.5.0"`))
	fmt.Println(r.IP, r.Method, r.Path, r.Time.UTC(), r.Headers["User-Agent"], err)
	_, err = loadtest.ParseCLF([]byte(`192.0.2.2 - - [10/Oct/2000:13:55:46 -0700] "-" 408 0 "-" "-"`))
	fmt.Println(err)
	// Output:
	// 2001:db8::1 GET /caf%C3%A9?q=1 2000-10-10 20:55:36 +0000 UTC curl/8.5.0 <nil>
	// line 0: no request line: request "-"
}

func ExampleImport() {
	log := `198.51.100.7 - - [10/Oct/2000:13:55:36 -0700] "POST /login HTTP/1.1" 401 0
garbage
198.51.100.7 - - [10/Oct/2000:13:55:37 -0700] "POST /login HTTP/1.1" 401 0
`
	sum, err := loadtest.Import(strings.NewReader(log), os.Stdout, loadtest.ImportConfig{Host: "shop.example"},
		func(le *loadtest.LineError) { fmt.Println("bad:", le) })
	fmt.Println(sum.Good, sum.Bad, err)
	// Output:
	// bad: line 2: not a Common or Combined Log Format line: no [date] in "garbage"
	// {"offset_ms":0,"ts":"2000-10-10T13:55:36-07:00","ip":"198.51.100.7","method":"POST","host":"shop.example","path":"/login","status":401}
	// {"offset_ms":1000,"ts":"2000-10-10T13:55:37-07:00","ip":"198.51.100.7","method":"POST","host":"shop.example","path":"/login","status":401}
	// 2 1 <nil>
}

var _ = netip.Addr{}

func ExampleNewImporter() {
	log := `198.51.100.7 - - [10/Oct/2000:13:55:37 -0700] "GET /b HTTP/1.1" 200 5
198.51.100.7 - - [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 5
198.51.100.7 - - [10/Oct/2000:13:55:38 -0700] "\x16\x03\x01" 400 0
`
	im := loadtest.NewImporter(strings.NewReader(log), loadtest.ImportConfig{})
	for r, err := range im.All() {
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(r.At, r.Path)
	}
	im.Summary().WriteText(os.Stdout)
	// Output:
	// line 3: malformed request line: method "\x16\x03\x01" is not a token
	// 0s /a
	// 1s /b
	// import: 3 lines, 2 good, 1 bad, 0 placed late, 2000-10-10T13:55:36-07:00 to 2000-10-10T13:55:37-07:00
	//        1  malformed request line
	//   order: lines up to 1s out of time order, sorted whole
}

// disorderedLog writes n Combined Log Format lines as Apache logs them: in
// the order requests end, every 30 ms, each stamped with when it began, up
// to maxAge earlier (whole seconds, as CLF has them).
func disorderedLog(n int, maxAge time.Duration, seed int64) string {
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	base := time.Date(2024, 5, 7, 10, 0, 0, 0, time.UTC)
	var b strings.Builder
	for i := 0; i < n; i++ {
		end := base.Add(time.Duration(i) * 30 * time.Millisecond)
		began := end.Add(-time.Duration(rng.Int64N(int64(maxAge)))).Truncate(time.Second)
		fmt.Fprintf(&b, "192.0.2.%d - - [%s] \"GET /r/%d HTTP/1.1\" 200 %d \"-\" \"Mozilla/5.0 (X11; Linux x86_64)\"\n",
			i%250, began.Format("02/Jan/2006:15:04:05 -0700"), i, 100+i%900)
	}
	return b.String()
}

// TestImportSortsAMinuteOfDisorder: a log whose lines are up to a minute
// out of time order once placed 73 % of them late with a 10 s reorder
// window. One that fits in MaxBuffered is sorted whole: none is late.
func TestImportSortsAMinuteOfDisorder(t *testing.T) {
	const n = 10_000 // 5 minutes
	log := disorderedLog(n, 60*time.Second, 1)
	var out bytes.Buffer
	sum, err := loadtest.Import(strings.NewReader(log), &out, loadtest.ImportConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Good != n || sum.Late != 0 || sum.Streamed || sum.MaxDisorderMillis < 55_000 || sum.MaxDisorderMillis > 61_000 {
		t.Errorf("got %d good, %d late, streamed %v, disorder %vms; want %d good, 0 late, sorted whole, disorder about 60 s",
			sum.Good, sum.Late, sum.Streamed, sum.MaxDisorderMillis, n)
	}
	checkSorted(t, &out, n)

	// Longer than MaxBuffered: past the sorted part the window grows to the
	// disorder seen (a minute), not the 10 s of Reorder.
	out.Reset()
	sum, err = loadtest.Import(strings.NewReader(log), &out, loadtest.ImportConfig{MaxBuffered: 3000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("streamed past 3000 lines: %d of %d late, window %vms", sum.Late, sum.Good, sum.WindowMillis)
	if sum.Good != n || !sum.Streamed || sum.WindowMillis < 55_000 || float64(sum.Late) > 0.002*n {
		t.Errorf("got %d good, %d late, streamed %v, window %vms; want %d good, at most 0.2%% late, streamed in a window of about a minute",
			sum.Good, sum.Late, sum.Streamed, sum.WindowMillis, n)
	}
	checkSorted(t, &out, n)
}

// checkSorted reads a trace and checks it has n requests in time order.
func checkSorted(t *testing.T, trace *bytes.Buffer, n int) {
	t.Helper()
	var prev time.Duration
	got := 0
	for r, err := range loadtest.NewReader(trace).All() {
		if err != nil {
			t.Fatal(err)
		}
		if r.At < prev {
			t.Fatalf("request %d at %v, before %v", got, r.At, prev)
		}
		prev = r.At
		got++
	}
	if got != n {
		t.Errorf("got %d requests, want %d", got, n)
	}
}

// TestImportCutOffLines: a line cut off inside its last quoted field (the
// user agent, or the referer when it is last) is kept without it; one cut
// off before, where the trace's fields or the status and size are, is bad
// and counted by reason.
func TestImportCutOffLines(t *testing.T) {
	const head = `203.0.113.9 - - [10/Oct/2000:13:55:36 +0000] `
	tests := []struct {
		name, line string
		reason     string // "" for a good line
		ua, ref    string
	}{
		{"user agent cut", head + `"GET /a HTTP/1.1" 200 5 "http://ref/" "Mozilla/5.0 (X11; Li`, "", "", "http://ref/"},
		{"user agent cut after its quote", head + `"GET /a HTTP/1.1" 200 5 "-" "`, "", "", ""},
		{"user agent cut after an escape", head + `"GET /a HTTP/1.1" 200 5 "-" "Mozilla \"x\`, "", "", ""},
		{"referer cut", head + `"GET /a HTTP/1.1" 200 5 "http://ref/pa`, "", "", ""},
		{"intact", head + `"GET /a HTTP/1.1" 200 5 "http://ref/" "curl/8"`, "", "curl/8", "http://ref/"},
		{"request line cut", head + `"GET /a HT`, loadtest.ReasonQuote, "", ""},
		{"status cut", head + `"GET /a HTTP/1.1" 2`, loadtest.ReasonStatus, "", ""},
		{"size missing", head + `"GET /a HTTP/1.1" 200`, loadtest.ReasonSize, "", ""},
		{"date cut", `203.0.113.9 - - [10/Oct/2000:13:5`, loadtest.ReasonDate, "", ""},
	}
	var log strings.Builder
	wantReasons := map[string]int64{}
	var good, cut int64
	for _, tt := range tests {
		log.WriteString(tt.line + "\n")
		r, err := loadtest.ParseCLF([]byte(tt.line))
		var le *loadtest.LineError
		switch {
		case tt.reason != "":
			wantReasons[tt.reason]++
			if !errors.As(err, &le) || le.Reason != tt.reason {
				t.Errorf("%s: got %v, want reason %q", tt.name, err, tt.reason)
			}
		case err != nil:
			t.Errorf("%s: got %v, want the line kept", tt.name, err)
		default:
			good++
			if tt.name != "intact" {
				cut++
			}
			if r.Path != "/a" || r.IP.String() != "203.0.113.9" || r.Headers["User-Agent"] != tt.ua || r.Headers["Referer"] != tt.ref {
				t.Errorf("%s: got %s %s headers %q, want /a from 203.0.113.9 with user agent %q, referer %q", tt.name, r.IP, r.Path, r.Headers, tt.ua, tt.ref)
			}
		}
	}
	im := loadtest.NewImporter(strings.NewReader(log.String()), loadtest.ImportConfig{Agents: true})
	for range im.All() {
	}
	s := im.Summary()
	if s.Good != good || s.Truncated != cut || s.Bad != int64(len(tests))-good || !maps.Equal(s.Reasons, wantReasons) {
		t.Errorf("summary %+v: want %d good (%d cut off), reasons %v", s, good, cut, wantReasons)
	}
}

// TestImportKeepsStatus: an imported line keeps what the origin answered,
// through the trace it is written to: a rule that counts by response is
// settled with it offline. "-" and codes past 599 are unknown (0).
func TestImportKeepsStatus(t *testing.T) {
	log := `1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "POST /login HTTP/1.1" 401 12
1.2.3.4 - - [10/Oct/2000:13:55:37 +0000] "POST /login HTTP/1.1" 200 12
1.2.3.4 - - [10/Oct/2000:13:55:38 +0000] "POST /login HTTP/1.1" - 12
1.2.3.4 - - [10/Oct/2000:13:55:39 +0000] "POST /login HTTP/1.1" 999 12
`
	var out bytes.Buffer
	if _, err := loadtest.Import(strings.NewReader(log), &out, loadtest.ImportConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	var got []int
	for r, err := range loadtest.NewReader(&out).All() {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Status)
	}
	if want := []int{401, 200, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("statuses through import: got %v, want %v", got, want)
	}
}
