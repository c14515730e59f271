package loadtest_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
)

func sameRequest(a, b loadtest.TraceRequest) bool {
	return a.At == b.At && a.Time.Equal(b.Time) && a.IP == b.IP && a.Method == b.Method && a.Host == b.Host &&
		a.Path == b.Path && maps.Equal(a.Headers, b.Headers) && max(a.Count, 1) == max(b.Count, 1) &&
		a.Body == b.Body && a.ContentType == b.ContentType && a.Status == b.Status
}

func TestTraceRoundTrip(t *testing.T) {
	ts := time.Date(2024, 5, 7, 10, 0, 1, 500250000, time.FixedZone("", 2*3600))
	tests := []loadtest.TraceRequest{
		{At: 0, IP: netip.MustParseAddr("203.0.113.7")},
		{At: 1500250 * time.Microsecond, Time: ts, IP: netip.MustParseAddr("2001:db8::1"), Method: "POST", Host: "api.example.com",
			Path: "/v1/login?x=1&y=%22", Headers: map[string]string{"X-API-Key": "k\"1\\", "Cookie": "sid=é; a=b", "X-Ctl": "\t"}, Count: 3},
		{At: 123456789 * time.Nanosecond, IP: netip.MustParseAddr("10.0.0.1"), Path: "/"},
		{At: 10 * 365 * 24 * time.Hour, IP: netip.MustParseAddr("::")},
		{At: 10 * 365 * 24 * time.Hour, IP: netip.MustParseAddr("192.0.2.9"), Method: "POST", Path: "/login",
			Body: "username=Alice%40example.com&password=\"x\"\n\u00e9", ContentType: "application/x-www-form-urlencoded; charset=utf-8", Status: 401},
	}
	var buf bytes.Buffer
	w := loadtest.NewWriter(&buf)
	for i := range tests {
		if err := w.Write(&tests[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	rd := loadtest.NewReader(&buf)
	for i, want := range tests {
		got, err := rd.Next()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if i >= 2 {
			want.Time = tests[1].Time.Add(-tests[1].At).Add(want.At) // placed by the origin
		}
		if !sameRequest(got, want) {
			t.Errorf("request %d: got %+v, want %+v", i, got, want)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Errorf("after the last line: %v, want io.EOF", err)
	}
}

func TestParseTraceLineErrors(t *testing.T) {
	tests := []struct{ line, reason string }{
		{`not json`, loadtest.ReasonJSON},
		{`{"offset_ms":1,"ip":"1.2.3.4"} trailing`, loadtest.ReasonJSON},
		{`{"offset_ms":"x","ip":"1.2.3.4"}`, loadtest.ReasonJSON},
		{`{"offset_ms":-1,"ip":"1.2.3.4"}`, loadtest.ReasonTime},
		{`{"offset_ms":1e20,"ip":"1.2.3.4"}`, loadtest.ReasonTime},
		{`{"ip":"1.2.3.4"}`, loadtest.ReasonTime},
		{`{"ts":"yesterday","ip":"1.2.3.4"}`, loadtest.ReasonTime},
		{`{"offset_ms":1}`, loadtest.ReasonClient},
		{`{"offset_ms":1,"ip":"fe80::1%eth0"}`, loadtest.ReasonClient},
		{`{"offset_ms":1,"ip":"example.com"}`, loadtest.ReasonClient},
		{`{"offset_ms":1,"ip":"1.2.3.4","path":"no-slash"}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","path":"/a b"}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","method":"GE T"}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","host":"a/b"}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","headers":{"X":"a\nb"}}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","headers":{"Host":"x"}}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","headers":{"Bad Name":"x"}}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","count":0}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","count":2000000}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","status":99}`, loadtest.ReasonStatus},
		{`{"offset_ms":1,"ip":"1.2.3.4","status":600}`, loadtest.ReasonStatus},
		{`{"offset_ms":1,"ip":"1.2.3.4","content_type":"text/plain\r\nX: y"}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","content_type":"text/plain","headers":{"content-type":"text/html"}}`, loadtest.ReasonField},
		{`{"offset_ms":1,"ip":"1.2.3.4","body":"` + strings.Repeat("a", 64<<10+1) + `"}`, loadtest.ReasonField},
	}
	for _, tt := range tests {
		_, err := loadtest.ParseTraceLine([]byte(tt.line))
		var le *loadtest.LineError
		if !errors.As(err, &le) {
			t.Errorf("%s: got error %v, want a *LineError with reason %q", tt.line, err, tt.reason)
			continue
		}
		if le.Reason != tt.reason {
			t.Errorf("%s: got reason %q (%v), want %q", tt.line, le.Reason, err, tt.reason)
		}
	}
}

func TestReaderPlacesTimestamps(t *testing.T) {
	in := strings.Join([]string{
		`{"ts":"2024-01-01T00:00:10Z","ip":"1.1.1.1"}`,
		``,
		`{"ts":"2024-01-01T00:00:10.5Z","ip":"1.1.1.2"}`,
		`{"offset_ms":2000,"ip":"1.1.1.3"}`,
		`{"ts":"2024-01-01T00:00:09Z","ip":"1.1.1.4"}`,
		`{"offset_ms":3000,"ts":"2030-01-01T00:00:00Z","ip":"1.1.1.5"}`,
		`{"ip":"1.1.1.6","offset_ms":4000.000001}`,
	}, "\r\n")
	origin := time.Date(2024, 1, 1, 0, 0, 10, 0, time.UTC)
	tests := []struct {
		at   time.Duration
		time time.Time
		line int
		bad  string
	}{
		{0, origin, 1, ""},
		{500 * time.Millisecond, origin.Add(500 * time.Millisecond), 3, ""},
		{2 * time.Second, origin.Add(2 * time.Second), 4, ""},
		{0, time.Time{}, 5, loadtest.ReasonTime}, // before the origin
		{3 * time.Second, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), 6, ""},
		{4*time.Second + time.Nanosecond, origin.Add(4*time.Second + time.Nanosecond), 7, ""},
	}
	rd := loadtest.NewReader(strings.NewReader(in))
	for i, tt := range tests {
		got, err := rd.Next()
		var le *loadtest.LineError
		switch {
		case tt.bad != "":
			if !errors.As(err, &le) || le.Reason != tt.bad || le.Line != tt.line {
				t.Errorf("line %d: got %v, want a %q error on line %d", tt.line, err, tt.bad, tt.line)
			}
		case err != nil:
			t.Errorf("%d: %v", i, err)
		case got.At != tt.at || !got.Time.Equal(tt.time):
			t.Errorf("line %d: got At %v Time %v, want %v %v", tt.line, got.At, got.Time, tt.at, tt.time)
		}
	}
}

func TestReaderSkipsLongLinesAndGoesOn(t *testing.T) {
	in := `{"offset_ms":1,"ip":"1.1.1.1"}` + "\n" + `{"offset_ms":2,"ip":"1.1.1.1","path":"/` + strings.Repeat("a", loadtest.MaxLineBytes) + `"}` + "\n" +
		`{"offset_ms":3,"ip":"1.1.1.1"}`
	var good []time.Duration
	var bad []string
	for r, err := range loadtest.NewReader(strings.NewReader(in)).All() {
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		good = append(good, r.At)
	}
	if len(good) != 2 || good[1] != 3*time.Millisecond || len(bad) != 1 || !strings.HasPrefix(bad[0], "line 2: "+loadtest.ReasonTooLong) {
		t.Errorf("got good %v bad %q, want 1ms and 3ms, and line 2 too long", good, bad)
	}
}

func TestReadFileMissing(t *testing.T) {
	n := 0
	for _, err := range loadtest.ReadFile("testdata/no-such-trace.jsonl") {
		n++
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("got %v, want a not-exist error", err)
		}
	}
	if n != 1 {
		t.Errorf("got %d elements, want the error alone", n)
	}
}

func FuzzParseTraceLine(f *testing.F) {
	f.Add([]byte(`{"offset_ms":1500.25,"ts":"2024-05-07T10:00:01.50025Z","ip":"203.0.113.7","method":"POST","host":"api.example.com","path":"/v1/login?x=1","headers":{"X-API-Key":"k1"},"count":3}`))
	f.Add([]byte(`{"ts":"2024-05-07T10:00:01+02:00","ip":"::ffff:1.2.3.4"}`))
	f.Add([]byte(`{"offset_ms":1e3,"ip":"2001:db8::1","headers":{"A":"\u00e9\ud800"}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := loadtest.ParseTraceLine(line)
		if err != nil {
			var le *loadtest.LineError
			if !errors.As(err, &le) || le.Reason == "" {
				t.Fatalf("error %v is not a *LineError with a reason", err)
			}
			return
		}
		out := loadtest.AppendTraceLine(nil, &r)
		r2, err := loadtest.ParseTraceLine(out)
		if err != nil {
			t.Fatalf("%s parsed, was written as %s, which does not parse: %v", line, out, err)
		}
		if !sameRequest(r, r2) {
			t.Fatalf("round trip of %s: got %+v, want %+v", line, r2, r)
		}
	})
}

func BenchmarkParseTraceLine(b *testing.B) {
	line := []byte(`{"offset_ms":1500.25,"ip":"203.0.113.7","method":"GET","path":"/v1/items?id=12","headers":{"X-API-Key":"k1"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := loadtest.ParseTraceLine(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendTraceLine(b *testing.B) {
	r := loadtest.TraceRequest{At: 1500250 * time.Microsecond, IP: netip.MustParseAddr("203.0.113.7"), Method: "GET", Path: "/v1/items?id=12"}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = loadtest.AppendTraceLine(buf[:0], &r)
	}
}

func TestAppendTraceLineDoesNotAllocate(t *testing.T) {
	r := loadtest.TraceRequest{At: 1500250 * time.Microsecond, IP: netip.MustParseAddr("2001:db8::7"), Method: "GET", Path: "/v1/items?id=12", Count: 2}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = loadtest.AppendTraceLine(buf[:0], &r) }); n != 0 {
		t.Errorf("AppendTraceLine allocates %v times, want 0", n)
	}
}

func ExampleNewReader() {
	trace := `{"offset_ms":0,"ip":"203.0.113.7","path":"/login","method":"POST"}
{"offset_ms":250.5,"ip":"2001:db8::1","headers":{"X-API-Key":"k1"},"count":2}
not a trace line
`
	for r, err := range loadtest.NewReader(strings.NewReader(trace)).All() {
		if err != nil {
			fmt.Println("skipped:", err)
			continue
		}
		fmt.Println(r.At, r.IP, r.Method, r.Path, r.Headers, r.Count)
	}
	// Output:
	// 0s 203.0.113.7 POST /login map[] 0
	// 250.5ms 2001:db8::1   map[X-API-Key:k1] 2
	// skipped: line 3: not a JSON trace object: invalid character 'o' in literal null (expecting 'u')
}

func ExampleNewWriter() {
	w := loadtest.NewWriter(os.Stdout)
	w.Write(&loadtest.TraceRequest{At: 1500 * time.Microsecond, IP: netip.MustParseAddr("203.0.113.7"), Path: "/", Headers: map[string]string{"X-B": "2", "X-A": "1"}})
	w.Flush()
	// Output:
	// {"offset_ms":1.5,"ip":"203.0.113.7","path":"/","headers":{"X-A":"1","X-B":"2"}}
}

func ExampleParseTraceLine() {
	r, err := loadtest.ParseTraceLine([]byte(`{"ts":"2024-05-07T10:00:00Z","ip":"::ffff:198.51.100.7","path":"/a"}`))
	fmt.Println(r.Time, r.IP, r.Path, err)
	// Output: 2024-05-07 10:00:00 +0000 UTC 198.51.100.7 /a <nil>
}

func ExampleReadFile() {
	n := 0
	for r, err := range loadtest.ReadFile("testdata/sample.jsonl") {
		if err != nil {
			fmt.Println(err)
			return
		}
		n += max(r.Count, 1)
	}
	fmt.Println(n, "requests")
	// Output: 4 requests
}

func ExampleAppendTraceLine() {
	r := loadtest.TraceRequest{At: 2 * time.Second, IP: netip.MustParseAddr("::ffff:192.0.2.1").Unmap(), Method: "GET", Path: "/x", Count: 5}
	fmt.Print(string(loadtest.AppendTraceLine(nil, &r)))
	// Output: {"offset_ms":2000,"ip":"192.0.2.1","method":"GET","path":"/x","count":5}
}
