package pagetest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/poplimit/poplimit/internal/plotpage"
)

// recording is a testing.TB that keeps the errors Open reports instead of
// failing the test.
type recording struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recording) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recording) Helper() {}

func writeFile(t *testing.T, html string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "page.html")
	if err := os.WriteFile(p, []byte(html), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Open fails a page that fetches anything, writes a console error, or has
// a chart that did not draw; a plotpage page passes, and its figures can
// be read back.
func TestOpenChecks(t *testing.T) {
	if chromium() == "" {
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	// A loopback server the bad page fetches from: nothing leaves the
	// machine.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var hits sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) })}
	hits.Add(1)
	go func() { defer hits.Done(); srv.Serve(ln) }()
	defer func() { srv.Close(); hits.Wait() }()

	var good bytes.Buffer
	pg := &plotpage.Page{Title: "ok", Data: map[string]string{"total": "3"}, Sections: []plotpage.Section{{Heading: "h",
		Charts: []plotpage.Chart{{ID: "c", Series: []plotpage.Series{{Name: "s", X: []float64{0, 1, 2}, Y: []float64{1, 2, 3}}}}}}}}
	if err := pg.WriteHTML(&good); err != nil {
		t.Fatal(err)
	}
	chart := strings.SplitN(strings.SplitN(good.String(), `<figure class="chart"`, 2)[1], "</figure>", 2)[0]
	chart = `<figure class="chart"` + chart + "</figure>"

	for _, tc := range []struct {
		name, html, want string
	}{
		{"a request", "<!DOCTYPE html><title>x</title>" + chart + `<img src="http://` + ln.Addr().String() + `/x.png">`, "request to http://" + ln.Addr().String()},
		{"a console error", "<!DOCTYPE html><title>x</title>" + chart + `<script>console.error("broken")</script>`, "console error"},
		{"an exception", "<!DOCTYPE html><title>x</title>" + chart + `<script>null.x()</script>`, "exception"},
		{"a chart not drawn", `<!DOCTYPE html><title>x</title><figure class="chart" id="empty"><svg></svg></figure>`, `chart "empty" not drawn`},
		{"too few charts", `<!DOCTYPE html><title>x</title><p>nothing</p>`, "0 charts, want at least 1"},
		{"a request the page's policy blocks", strings.Replace(good.String(), "</main>", `<img src="http://`+ln.Addr().String()+`/y.png"></main>`, 1), "y.png"},
		{"a good page", good.String(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recording{TB: t}
			b := Open(r, writeFile(t, tc.html), 800, 600, 1)
			got := strings.Join(r.errs, "\n")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("Open reported %q, want %q", got, tc.want)
			}
			if tc.want == "" {
				if v := b.Attr("main", "data-total"); v != "3" {
					t.Errorf("data-total %q, want 3", v)
				}
				if png := b.Screenshot(); !bytes.HasPrefix(png, []byte("\x89PNG")) {
					t.Errorf("the screenshot is not a PNG (%d bytes)", len(png))
				}
			}
		})
	}
}
