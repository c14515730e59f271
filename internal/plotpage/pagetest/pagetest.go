// Package pagetest opens a page written with plotpage in a real browser,
// headless Chromium driven over the DevTools protocol (chromedp), for
// tests: it fails the test on a console error, an uncaught exception, a
// request for anything but the file itself or a data: URL, or a chart
// that did not draw, and gives the test the page to read figures from and
// its screenshot. A test skips, saying why, when Chromium is not
// installed (scripts/test.sh installs Debian's chromium when root).
package pagetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Browser is a page opened in headless Chromium.
type Browser struct {
	t   testing.TB
	ctx context.Context
}

// chromium returns the path of a Chromium binary, or "".
func chromium() string {
	if p := os.Getenv("POPLIMIT_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Open opens the HTML file at path in headless Chromium (a window of
// width × height pixels), waits for it to load and checks it: no console
// error or exception, no request but for the file and data: URLs, and at
// least minCharts figures of class "chart", each an SVG with drawn paths
// and a size. The browser stops at the test's cleanup.
func Open(t testing.TB, path string, width, height, minCharts int) *Browser {
	t.Helper()
	bin := chromium()
	if bin == "" {
		t.Skip("chromium is not installed (apt-get install chromium; scripts/test.sh installs it when root): the page is not opened in a browser")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	fileURL := "file://" + abs
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.NoFirstRun,
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })

	var mu sync.Mutex
	var problems []string
	if err := chromedp.Listen(ctx, func(ev any) {
		var p string
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			if u := ev.Request.URL; u != fileURL && !strings.HasPrefix(u, "data:") {
				p = "request to " + u
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == "error" || ev.Type == "assert" {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				p = "console " + string(ev.Type) + ": " + strings.Join(args, " ")
			}
		case *runtime.EventExceptionThrown:
			p = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				p += " " + ev.ExceptionDetails.Exception.Description
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError {
				p = "log error (" + string(ev.Entry.Source) + "): " + ev.Entry.Text + " " + ev.Entry.URL
			}
		}
		if p != "" {
			mu.Lock()
			problems = append(problems, p)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("starting chromium (%s): %v", bin, err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 60*time.Second)
	defer ncancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(fileURL)); err != nil {
		t.Fatalf("chromium: open %s: %v", fileURL, err)
	}
	b := &Browser{t: t, ctx: ctx}
	// Charts: each figure.chart holds an SVG with paths, laid out.
	var charts []struct {
		ID     string  `json:"id"`
		Paths  int     `json:"paths"`
		Width  float64 `json:"width"`
		Height float64 `json:"height"`
	}
	b.Eval(`Array.from(document.querySelectorAll('figure.chart')).map(f => { const s = f.querySelector('svg');
		const r = s ? s.getBoundingClientRect() : {width: 0, height: 0};
		return {id: f.id, paths: s ? s.querySelectorAll('path').length : 0, width: r.width, height: r.height}; })`, &charts)
	if len(charts) < minCharts {
		t.Errorf("%s: %d charts, want at least %d", path, len(charts), minCharts)
	}
	for _, c := range charts {
		if c.Paths < 3 || c.Width < 100 || c.Height < 50 {
			t.Errorf("%s: chart %q not drawn: %d paths, %.0f × %.0f px", path, c.ID, c.Paths, c.Width, c.Height)
		}
	}
	// Give late events (a blocked fetch, a font) a moment to arrive.
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("%s in chromium: %s", path, p)
	}
	return b
}

// Eval evaluates the JavaScript expression on the page and decodes its
// value (as JSON) into out.
func (b *Browser) Eval(expr string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr))
	if err != nil {
		b.t.Fatalf("chromium: evaluate %.60q: %v", expr, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		b.t.Fatalf("chromium: evaluate %.60q: %v in %.200s", expr, err, raw)
	}
}

// Attr returns the attribute name of the first element matching the CSS
// selector, "" when there is none.
func (b *Browser) Attr(selector, name string) string {
	b.t.Helper()
	var v string
	b.Eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? (e.getAttribute(%q) || "") : ""; })()`, selector, name), &v)
	return v
}

// FullScreenshot returns a PNG of the whole page, beyond the window.
func (b *Browser) FullScreenshot() []byte {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		b.t.Fatalf("chromium: screenshot: %v", err)
	}
	return png
}

// Screenshot returns a PNG of the window (the top of the page).
func (b *Browser) Screenshot() []byte {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("chromium: screenshot: %v", err)
	}
	return png
}
