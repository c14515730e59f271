package edge_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
)

// writeDescriptors writes n envoyproxy/ratelimit descriptors into files
// files of dir, one domain each ("d00", "d01", …), descriptor key k and
// values v0, v1, …: one rule each.
func writeDescriptors(t testing.TB, dir string, files, n int) {
	t.Helper()
	per := (n + files - 1) / files
	for f := 0; f < files; f++ {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%02d\ndescriptors:\n", f)
		for i := f * per; i < min(n, (f+1)*per); i++ {
			fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: hour, requests_per_unit: 10}\n", i)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%02d.yaml", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReloadAwayFromManyDescriptors: an edge serving 58,000
// envoyproxy/ratelimit descriptors (8,000 under the race detector), some of which saw traffic, reloads to
// a small set; the reload finishes within a generous bound (the series of
// the removed rules are dropped in one pass, not one scan of every series
// per rule) and the admin listener answers /metrics and /healthz all the
// while.
func TestReloadAwayFromManyDescriptors(t *testing.T) {
	n, files := 58_000, 8
	if edgetest.Race {
		n = 8_000 // the race detector makes building 58,000 rules take a minute
	}
	dir := t.TempDir()
	writeDescriptors(t, dir, files, n)
	o := edge.Options{RLSListen: "127.0.0.1:0", RulesFile: dir, ReloadPoll: time.Hour}
	start := time.Now()
	e := edgetest.Start(t, "", o)
	if got := len(e.Rules().Rules); got < n {
		t.Fatalf("%d rules in force, want at least %d", got, n)
	}
	t.Logf("built with %d rules in %v", len(e.Rules().Rules), time.Since(start))
	conn, err := grpc.NewClient(e.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	// Traffic on a spread of descriptors of every file.
	for i := 0; i < n; i += 29 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: fmt.Sprintf("d%02d", i/((n+files-1)/files)),
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprintf("v%d", i)}}}}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	for f := 0; f < files; f++ {
		os.Remove(filepath.Join(dir, fmt.Sprintf("d%02d.yaml", f)))
	}
	writeDescriptors(t, dir, 1, 10)

	done := make(chan error, 1)
	var took time.Duration
	go func() {
		start := time.Now()
		err := e.Reload()
		took = time.Since(start)
		done <- err
	}()
	// /healthz costs nothing: it answers at once; /metrics gathers every
	// series of 58,000 rules (6 each), seconds of CPU on a loaded machine.
	admin := map[string]*http.Client{"/healthz": {Timeout: 10 * time.Second}, "/metrics": {Timeout: 60 * time.Second}}
	scrapes := 0
	var once sync.Once
	bound := time.After(90 * time.Second)
	for {
		select {
		case err := <-done:
			t.Logf("reload away from %d rules: %v; %d scrapes answered during it", n, took, scrapes)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(e.Rules().Rules); got > 20 {
				t.Errorf("%d rules in force after the reload, want the small set", got)
			}
			return
		case <-bound:
			t.Fatalf("the reload away from %d rules did not finish within 90 s", n)
		default:
		}
		for _, p := range []string{"/healthz", "/metrics"} {
			resp, err := admin[p].Get("http://" + e.AdminAddr() + p)
			if err != nil {
				once.Do(func() { t.Errorf("admin %s during the reload: %v", p, err) })
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("admin %s during the reload: %d", p, resp.StatusCode)
			}
		}
		scrapes++
	}
}

// TestReloadDropsRemovedRulesSeries: a reload forgets the request series
// of the rules it removed, every one of them, and keeps the others' with
// their counts.
func TestReloadDropsRemovedRulesSeries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write := func(names ...string) {
		var b strings.Builder
		b.WriteString("match: all\nrules:\n")
		for _, n := range names {
			fmt.Fprintf(&b, "  - {name: %s, limit: 1, window: 1h, path_prefix: /%s}\n", n, n)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a", "b", "c")
	e := startEdge(t, edgeOpts{rulesFile: path, reloadPoll: time.Hour})
	for _, n := range []string{"a", "b", "c"} {
		get(t, e.addr, "/"+n)
		get(t, e.addr, "/"+n) // limited
	}
	write("a", "c", "d")
	if err := e.Reload(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + e.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	series := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "poplimit_edge_requests_total{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `rule="`)
		rule, _, _ := strings.Cut(rest, `"`)
		series[rule]++
	}
	if series["b"] != 0 {
		t.Errorf("%d series of the removed rule b remain", series["b"])
	}
	for _, n := range []string{"a", "c", "d"} {
		if series[n] != 6 {
			t.Errorf("rule %s has %d series, want its 6", n, series[n])
		}
	}
	for _, n := range []string{"a", "c"} {
		for _, d := range []string{"allowed", "limited"} {
			if got := metricSum(t, e, "poplimit_edge_requests_total", "rule", n, "decision", d, "source", "limiter"); got != 1 {
				t.Errorf("rule %s kept through the reload: %s = %v, want 1", n, d, got)
			}
		}
	}
	if got := metricSum(t, e, "poplimit_edge_requests_total", "rule", "d"); got != 0 {
		t.Errorf("the new rule d counts %v requests, want 0", got)
	}
}
