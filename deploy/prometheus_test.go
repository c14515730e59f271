package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	"sigs.k8s.io/yaml"
)

const promDir = "prometheus"

// lookTool returns the path of a tool, or skips the test naming the Debian
// package that provides it.
func lookTool(t *testing.T, name, pkg string) string {
	t.Helper()
	for _, p := range []string{name, "/usr/bin/" + name, "/usr/sbin/" + name, "/usr/local/bin/" + name} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skipf("%s not found: apt-get install %s", name, pkg)
	return ""
}

// run runs a tool in dir and fails the test with its output if it fails.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", filepath.Base(name), strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func glob(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("glob %s: %v files, err %v", pattern, len(files), err)
	}
	return files
}

func ruleFiles(t *testing.T) map[string]deploytest.RuleFile {
	t.Helper()
	files := map[string]deploytest.RuleFile{}
	for _, p := range glob(t, filepath.Join(promDir, "rules", "*.yml")) {
		f, err := deploytest.ReadRuleFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	return files
}

func TestPromtoolCheckConfig(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	run(t, promDir, promtool, "check", "config", "prometheus.yml")
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	var rel []string
	for _, p := range glob(t, filepath.Join(promDir, "rules", "*.yml")) {
		rel = append(rel, strings.TrimPrefix(p, promDir+string(filepath.Separator)))
	}
	run(t, promDir, promtool, append([]string{"check", "rules"}, rel...)...)
}

func TestPromtoolTestRules(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	var rel []string
	for _, p := range glob(t, filepath.Join(promDir, "tests", "*_test.yml")) {
		rel = append(rel, strings.TrimPrefix(p, promDir+string(filepath.Separator)))
	}
	out := run(t, promDir, promtool, append([]string{"test", "rules"}, rel...)...)
	if n := strings.Count(out, "SUCCESS"); n != len(rel) {
		t.Errorf("promtool test rules: %d SUCCESS for %d files:\n%s", n, len(rel), out)
	}
}

// TestScrapeConfig checks what promtool does not: that the configuration
// loads every rule file, scrapes the two jobs the rules select, and that the
// local PoP's targets are on loopback.
func TestScrapeConfig(t *testing.T) {
	var cfg struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			FileSDConfigs []struct {
				Files []string `json:"files"`
			} `json:"file_sd_configs"`
		} `json:"scrape_configs"`
	}
	b, err := os.ReadFile(filepath.Join(promDir, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	var want []string
	for p := range ruleFiles(t) {
		want = append(want, strings.TrimPrefix(filepath.ToSlash(p), promDir+"/"))
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(cfg.RuleFiles))
	if !slices.Equal(got, want) {
		t.Errorf("rule_files: got %q, want every file of rules/: %q", got, want)
	}
	jobs := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		jobs[sc.JobName] = true
		for _, sd := range sc.FileSDConfigs {
			for _, pattern := range sd.Files {
				for _, f := range glob(t, filepath.Join(promDir, pattern)) {
					var groups []struct {
						Targets []string          `json:"targets"`
						Labels  map[string]string `json:"labels"`
					}
					b, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					if err := yaml.UnmarshalStrict(b, &groups); err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					for _, g := range groups {
						for _, target := range g.Targets {
							if !strings.HasPrefix(target, "127.0.0.1:") {
								t.Errorf("%s: target %s: want loopback (127.0.0.1:port) for the local PoP", f, target)
							}
						}
					}
				}
			}
		}
	}
	for _, job := range []string{"poplimit-edge", "poplimit-aggregator"} {
		if !jobs[job] {
			t.Errorf("no scrape config for job %q, which the alerting rules select", job)
		}
	}
}

// recordName is level:metric:operations, the metric part poplimit's.
var recordName = regexp.MustCompile(`^[a-z_]+:poplimit_[a-z0-9_]+:[a-z0-9_]+$`)

// TestRuleMetricNames checks every metric a rule selects against the
// metrics the code exports and the rules record, and the rules' names.
func TestRuleMetricNames(t *testing.T) {
	ms := exportedMetrics(t)
	files := ruleFiles(t)
	recorded := recordedNames(files)
	groups := map[string]string{}
	alerts := map[string]string{}
	for path, f := range files {
		for _, g := range f.Groups {
			if prev, dup := groups[g.Name]; dup {
				t.Errorf("%s: group %s: also in %s", path, g.Name, prev)
			}
			groups[g.Name] = path
			for _, r := range g.Rules {
				name := r.Record + r.Alert
				switch {
				case r.Record != "" && r.Alert != "":
					t.Errorf("%s: %s: both record and alert", path, name)
				case r.Record != "" && !recordName.MatchString(r.Record):
					t.Errorf("%s: record %s: want level:poplimit_metric:operations", path, r.Record)
				case r.Alert != "":
					if prev, dup := alerts[r.Alert]; dup {
						t.Errorf("%s: alert %s: also in %s", path, r.Alert, prev)
					}
					alerts[r.Alert] = path
					if !strings.HasPrefix(r.Alert, "Poplimit") {
						t.Errorf("%s: alert %s: want the Poplimit prefix", path, r.Alert)
					}
					if r.Labels["severity"] != "warning" && r.Labels["severity"] != "critical" {
						t.Errorf("%s: alert %s: severity %q, want warning or critical", path, r.Alert, r.Labels["severity"])
					}
					if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
						t.Errorf("%s: alert %s: want a summary and a description", path, r.Alert)
					}
				}
				checkExprNames(t, fmt.Sprintf("%s: %s", path, name), r.Expr, ms, recorded)
			}
		}
	}
}

func recordedNames(files map[string]deploytest.RuleFile) map[string]bool {
	recorded := map[string]bool{}
	for _, f := range files {
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				}
			}
		}
	}
	return recorded
}

// checkExprNames fails the test for each metric expr selects that is
// neither exported nor recorded.
func checkExprNames(t *testing.T, where, expr string, ms metricSet, recorded map[string]bool) {
	t.Helper()
	names, err := deploytest.MetricNames(expr)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	if len(names) == 0 {
		t.Errorf("%s: selects no metric: %s", where, expr)
	}
	for _, n := range names {
		if !ms.known(n) && !recorded[n] {
			t.Errorf("%s: %s is neither a metric the code exports nor a recorded rule", where, n)
		}
	}
}

// TestRuleTestsCoverEveryRule checks that each rule file has a promtool test
// file, that every recorded series is evaluated there, and that every alert
// is seen there both firing and not firing.
func TestRuleTestsCoverEveryRule(t *testing.T) {
	tested := map[string]deploytest.RuleTestFile{} // by rule file, relative to promDir
	for _, p := range glob(t, filepath.Join(promDir, "tests", "*_test.yml")) {
		tf, err := deploytest.ReadRuleTestFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, rf := range tf.RuleFiles {
			rel := filepath.ToSlash(filepath.Clean(filepath.Join("tests", rf)))
			tested[rel] = tf
		}
	}
	for path, f := range ruleFiles(t) {
		rel := strings.TrimPrefix(filepath.ToSlash(path), promDir+"/")
		tf, ok := tested[rel]
		if !ok {
			t.Errorf("%s: no tests/*_test.yml lists it in rule_files", path)
			continue
		}
		var exprs []string
		fires, quiet := map[string]bool{}, map[string]bool{}
		for _, tc := range tf.Tests {
			for _, e := range tc.PromQLExprTests {
				exprs = append(exprs, e.Expr)
			}
			for _, a := range tc.AlertRuleTests {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				switch {
				case r.Record != "":
					if !slices.ContainsFunc(exprs, func(e string) bool { return mentions(e, r.Record) }) {
						t.Errorf("%s: record %s: no promql_expr_test evaluates it", path, r.Record)
					}
				case !fires[r.Alert]:
					t.Errorf("%s: alert %s: no alert_rule_test expects it to fire", path, r.Alert)
				case !quiet[r.Alert]:
					t.Errorf("%s: alert %s: no alert_rule_test expects it not to fire", path, r.Alert)
				}
			}
		}
	}
}

// mentions reports whether expr selects the metric name.
func mentions(expr, name string) bool {
	names, err := deploytest.MetricNames(expr)
	return err == nil && slices.Contains(names, name)
}
