package deploy

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	"github.com/poplimit/poplimit/edge"
	"github.com/prometheus/client_golang/prometheus"
)

// userDocs are the documents that list metrics and flags for users.
var userDocs = []string{filepath.Join("..", "README.md"), filepath.Join("..", "docs", "CONFIGURATION.md")}

// modeMetrics returns the names of the metrics an edge registers only in
// some configurations (a Redis store, Envoy's rate limit service, proxy
// mode with health checks), built as cmd/edge builds them with a store and
// an upstream that refuse connections. Nothing is served.
func modeMetrics(t *testing.T) []string {
	t.Helper()
	rec := &recorder{Registry: prometheus.NewRegistry()}
	o := edge.Options{Registry: rec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	o.Redis.Addrs = []string{"127.0.0.1:1"}
	o.RLSListen = "127.0.0.1:0"
	o.Server.Mode = "proxy"
	o.Server.Upstream = "127.0.0.1:1"
	o.Server.UpstreamHealthPath = "/healthz"
	e, err := edge.Build(o)
	if err != nil {
		t.Fatalf("building an edge with Redis, RLS and proxy mode: %v", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Close(ctx)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	return names
}

// TestDocumentsListEveryMetric checks that every poplimit metric the edge
// (in every configuration) and the aggregator export is named in full in
// README.md or docs/CONFIGURATION.md, and that every poplimit metric name
// those documents write is one the code exports.
func TestDocumentsListEveryMetric(t *testing.T) {
	ms := exportedMetrics(t)
	all := metricSet{names: map[string]bool{}, types: ms.types}
	for n := range ms.names {
		all.names[n] = true
	}
	for _, n := range modeMetrics(t) {
		all.names[n] = true
	}
	word := regexp.MustCompile(`poplimit_[a-z0-9_]*[a-z0-9]`)
	documented := map[string]bool{}
	for _, f := range userDocs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range word.FindAllString(string(b), -1) {
			documented[n] = true
			if !all.known(n) {
				t.Errorf("%s names %s, which no component exports", f, n)
			}
		}
	}
	var missing []string
	for n := range all.names {
		if strings.HasPrefix(n, "poplimit_") && !documented[n] {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	for _, n := range missing {
		t.Errorf("%s is exported but neither README.md nor docs/CONFIGURATION.md names it", n)
	}
}

// TestConfigurationListsEveryFlag checks that docs/CONFIGURATION.md has,
// under each command's "## Flags of cmd/…" section, one table row per flag
// the command defines, and no other, each stating the default -h prints
// (as code), or, for a flag whose -h shows none, a default in words.
func TestConfigurationListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile(userDocs[1])
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `-([\\w-]+)` \\| ([^|]*) \\|")
	for _, cmd := range []string{"edge", "aggregator"} {
		flags, err := deploytest.Flags(filepath.Join("..", "cmd", cmd))
		if err != nil {
			t.Fatal(err)
		}
		heading := "## Flags of cmd/" + cmd
		_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
		if !ok {
			t.Errorf("docs/CONFIGURATION.md has no %q section", heading)
			continue
		}
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		seen := map[string]bool{}
		for _, line := range strings.Split(section, "\n") {
			m := row.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name, def := m[1], strings.TrimSpace(m[2])
			f, ok := flags[name]
			switch {
			case !ok:
				t.Errorf("cmd/%s: docs/CONFIGURATION.md lists -%s, which the command does not define", cmd, name)
			case seen[name]:
				t.Errorf("cmd/%s: docs/CONFIGURATION.md lists -%s twice", cmd, name)
			case f.Default != "" && !strings.HasPrefix(def, "`"+f.Default+"`"):
				t.Errorf("cmd/%s -%s: docs/CONFIGURATION.md gives the default %q, -h says %q", cmd, name, def, f.Default)
			case f.Default == "" && (def == "" || strings.HasPrefix(def, "`")):
				t.Errorf("cmd/%s -%s: docs/CONFIGURATION.md gives the default %q, -h shows none: say it in words", cmd, name, def)
			}
			seen[name] = true
		}
		var missing []string
		for name := range flags {
			if !seen[name] {
				missing = append(missing, name)
			}
		}
		slices.Sort(missing)
		for _, name := range missing {
			t.Errorf("cmd/%s -%s: not in docs/CONFIGURATION.md's %q section", cmd, name, heading)
		}
	}
}
