package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/plotpage/pagetest"
	"github.com/poplimit/poplimit/internal/testenv"
)

// The demo writes the replay's page and prints its path beside the URLs;
// the page opens in Chromium with the totals of the text report printed
// above it. A short run of the whole PoP on free loopback ports.
// POPLIMIT_PAGE_SCREENSHOT=FILE.png runs the demo at its defaults and
// keeps the browser's screenshot of its page (docs/replay-page.png is one).
func TestDemoPage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the demo builds and starts a whole PoP")
	}
	testenv.LookBinary(t, "memcached", "memcached")
	free := func() string { return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) }
	shards := []string{strconv.Itoa(testenv.FreePort(t)), strconv.Itoa(testenv.FreePort(t))}
	edges := []string{strconv.Itoa(testenv.FreePortPair(t)), strconv.Itoa(testenv.FreePortPair(t))}
	origin, agg, broker, prom := free(), free(), free(), free()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := []string{"-exit", "-install=false", "-dir", dir, "-align", "10s", "-phase", "2500ms"}
	shot := os.Getenv("POPLIMIT_PAGE_SCREENSHOT")
	if shot == "" { // a short demo; the screenshot is of the demo at its defaults
		args = append(args, "-duration", "8s", "-rate", "600")
	}
	err := run(ctx, append(args, "-memcache-ports", strings.Join(shards, ","), "-edge-ports", strings.Join(edges, ","), "-origin", origin,
		"-aggregator", agg, "-broker", broker, "-prometheus", prom), &out, &errb)
	if err != nil {
		t.Fatalf("pop: %v\n%s\n%s", err, out.String(), errb.String())
	}
	m := regexp.MustCompile(`(?m)^pop:   replay page      file://(\S+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no replay page among the URLs:\n%s", out.String())
	}
	page := m[1]
	st, err := os.Stat(page)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d bytes", page, st.Size())
	b := pagetest.Open(t, page, 1000, 1100, 5)

	// The statuses of the text report are the page's totals.
	sm := regexp.MustCompile(`(?m)^  statuses    (.*)$`).FindStringSubmatch(out.String())
	if sm == nil {
		t.Fatalf("no statuses in the report:\n%s", out.String())
	}
	var allowed, limited int64
	for _, kv := range regexp.MustCompile(`(\d+): (\d+)`).FindAllStringSubmatch(sm[1], -1) {
		n, _ := strconv.ParseInt(kv[2], 10, 64)
		switch s, _ := strconv.Atoi(kv[1]); {
		case s >= 200 && s < 300:
			allowed += n
		case s == 429:
			limited += n
		}
	}
	if allowed == 0 || limited == 0 {
		t.Errorf("the demo allowed %d and limited %d: not a demo", allowed, limited)
	}
	if got := b.Attr("main", "data-allowed"); got != strconv.FormatInt(allowed, 10) {
		t.Errorf("page allowed %s, report %d", got, allowed)
	}
	if got := b.Attr("main", "data-limited"); got != strconv.FormatInt(limited, 10) {
		t.Errorf("page limited %s, report %d", got, limited)
	}
	if got := b.Attr("#judged", "data-judged"); got == "" || got == "0" {
		t.Errorf("the page has no judged decisions (%q)", got)
	}
	if shot != "" {
		if err := os.WriteFile(shot, b.Screenshot(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
