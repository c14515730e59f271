package deploy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	"sigs.k8s.io/yaml"
)

var (
	consolesDir  = filepath.Join(promDir, "consoles")
	librariesDir = filepath.Join(promDir, "console_libraries")
	grafanaFile  = filepath.Join("grafana", "poplimit.json")
)

// consoleParams are the URL parameters each console is rendered with: none,
// and a rule.
var consoleParams = []map[string]string{{}, {"rule": "api"}}

func consolePages(t *testing.T) []string {
	t.Helper()
	var pages []string
	for _, p := range glob(t, filepath.Join(consolesDir, "*.html")) {
		pages = append(pages, filepath.Base(p))
	}
	return pages
}

// dashboardExpr is a PromQL expression of a console or of the Grafana
// dashboard, and where it is.
type dashboardExpr struct {
	where, expr string
}

// consoleExprs renders every console with every consoleParams and returns
// the expressions evaluated by the templates and those of the graphs.
func consoleExprs(t *testing.T) []dashboardExpr { return consoleExprsFor(t, consoleParams) }

func consoleExprsFor(t *testing.T, paramSets []map[string]string) []dashboardExpr {
	t.Helper()
	var exprs []dashboardExpr
	for _, page := range consolePages(t) {
		for _, params := range paramSets {
			p, err := deploytest.RenderConsole(consolesDir, librariesDir, page, params)
			if err != nil {
				t.Fatalf("%s?%v: %v", page, params, err)
			}
			for _, q := range p.Queries {
				exprs = append(exprs, dashboardExpr{fmt.Sprintf("%s?%v: query", page, params), q})
			}
			for _, g := range p.Graphs {
				exprs = append(exprs, dashboardExpr{fmt.Sprintf("%s?%v: graph %q", page, params, g.Title), g.Expr})
			}
		}
	}
	return exprs
}

func grafanaExprs(t *testing.T) []dashboardExpr { return grafanaExprsFor(t, "api") }

func grafanaExprsFor(t *testing.T, rule string) []dashboardExpr {
	t.Helper()
	d, err := deploytest.ReadDashboard(grafanaFile)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []dashboardExpr
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			exprs = append(exprs, dashboardExpr{fmt.Sprintf("grafana panel %d %q %s", p.ID, p.Title, tg.RefID), deploytest.GrafanaExpr(tg.Expr, rule)})
		}
	}
	for _, v := range d.Templating.List {
		q, err := v.QueryText()
		if err != nil {
			t.Fatal(err)
		}
		if v.Type != "query" {
			continue
		}
		sel, ok := deploytest.LabelValuesSelector(q)
		if !ok {
			t.Errorf("grafana variable %s: query %q: want label_values(selector, label)", v.Name, q)
			continue
		}
		exprs = append(exprs, dashboardExpr{"grafana variable " + v.Name, sel})
	}
	return exprs
}

// TestDashboardExpressions checks every expression of the consoles and of
// the Grafana dashboard: that it selects only metrics the code exports or
// the rules record, and that it parses, by handing promtool a rule file
// that records each one.
func TestDashboardExpressions(t *testing.T) {
	ms := exportedMetrics(t)
	recorded := recordedNames(ruleFiles(t))
	exprs := append(consoleExprs(t), grafanaExprs(t)...)
	if len(exprs) < 50 {
		t.Fatalf("%d expressions in the dashboards; the extraction lost some", len(exprs))
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var wheres []string
	seen := map[string]bool{}
	for _, e := range exprs {
		checkExprNames(t, e.where, e.expr, ms, recorded)
		if !seen[e.expr] {
			seen[e.expr] = true
			rules = append(rules, rule{fmt.Sprintf("dashboard_expr_%d", len(rules)), e.expr})
			wheres = append(wheres, e.where)
		}
	}

	promtool := lookTool(t, "promtool", "prometheus")
	file := map[string]any{"groups": []map[string]any{{"name": "dashboards", "rules": rules}}}
	b, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboards.yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "check", "rules", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		// Name the expressions promtool refused.
		t.Errorf("promtool check rules on the dashboards' %d expressions: %v\n%s", len(rules), err, out)
		for i, r := range rules {
			if strings.Contains(string(out), fmt.Sprintf("%q", r.Record)) {
				t.Logf("%s is %s: %s", r.Record, wheres[i], r.Expr)
			}
		}
	}
}

// TestConsolesRender renders every console as the Prometheus server does,
// with every consoleParams, and checks what each shows.
func TestConsolesRender(t *testing.T) {
	want := map[string]bool{"poplimit-overview.html": true, "poplimit-rule.html": true, "poplimit-accuracy.html": true}
	for _, page := range consolePages(t) {
		delete(want, page)
		for _, params := range consoleParams {
			p, err := deploytest.RenderConsole(consolesDir, librariesDir, page, params)
			if err != nil {
				t.Errorf("%s?%v: %v", page, params, err)
				continue
			}
			if page != "index.html" && len(p.Graphs) == 0 {
				t.Errorf("%s?%v: no graph", page, params)
			}
			for _, g := range p.Graphs {
				if g.Title == "" {
					t.Errorf("%s?%v: graph %s has no poplimit_section heading", page, params, g.Expr)
				}
			}
		}
	}
	for page := range want {
		t.Errorf("console %s is missing", page)
	}

	// A rule name that is not one is not pasted into PromQL.
	hostile := `x'}) or vector(1) or sum({__name__=~'.+`
	p, err := deploytest.RenderConsole(consolesDir, librariesDir, "poplimit-rule.html", map[string]string{"rule": hostile})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range append(p.Queries, graphExprs(p.Graphs)...) {
		if strings.Contains(q, "vector(1)") {
			t.Errorf("poplimit-rule.html with rule=%q evaluates %q", hostile, q)
		}
	}
}

func graphExprs(gs []deploytest.Graph) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Expr)
	}
	return out
}

// TestConsolesInPrometheus starts the Prometheus server on loopback with
// the project's configuration and consoles, as deploy/prometheus/
// prometheus.yml says to, and checks that it loads every rule group and
// serves every console: a template or a template query it cannot run is a
// 500.
func TestConsolesInPrometheus(t *testing.T) {
	bin := lookTool(t, "prometheus", "prometheus")
	addr := freeAddr(t)
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(promDir, "prometheus.yml"),
		"--web.listen-address="+addr,
		"--storage.tsdb.path="+t.TempDir(),
		"--web.console.templates="+consolesDir,
		"--web.console.libraries="+librariesDir,
		"--log.level=warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	base := "http://" + addr
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready on %s after 15s:\n%s", addr, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s\n%s", path, resp.Status, body)
		}
		return string(body)
	}

	// Every rule group is loaded.
	rules := get("/api/v1/rules")
	for _, f := range ruleFiles(t) {
		for _, g := range f.Groups {
			if !strings.Contains(rules, `"name":"`+g.Name+`"`) {
				t.Errorf("prometheus did not load rule group %s", g.Name)
			}
		}
	}
	// Every console renders, with and without a rule.
	for _, page := range consolePages(t) {
		for _, params := range append(consoleParams, map[string]string{"rule": "a'b"}) {
			q := url.Values{}
			for k, v := range params {
				q.Set(k, v)
			}
			body := get("/consoles/" + page + "?" + q.Encode())
			if page != "index.html" && !strings.Contains(body, "new PromConsole.Graph") {
				t.Errorf("/consoles/%s?%s: no graph in the page", page, q.Encode())
			}
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestGrafanaDashboard checks the dashboard's structure and that it has the
// consoles' graphs.
func TestGrafanaDashboard(t *testing.T) {
	d, err := deploytest.ReadDashboard(grafanaFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Error("no datasource variable: the dashboard would be tied to one data source")
	}
	ids := map[int]bool{}
	titles := map[string]bool{}
	for _, p := range d.AllPanels() {
		if ids[p.ID] {
			t.Errorf("panel id %d is not unique", p.ID)
		}
		ids[p.ID] = true
		titles[p.Title] = true
		if p.GridPos.W < 1 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %d %q: gridPos x=%d w=%d outside the 24 columns", p.ID, p.Title, p.GridPos.X, p.GridPos.W)
		}
		if p.Type == "row" {
			continue
		}
		if uid, _ := p.Datasource["uid"].(string); uid != "${datasource}" {
			t.Errorf("panel %d %q: datasource uid %q, want ${datasource}", p.ID, p.Title, uid)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %d %q: no query", p.ID, p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %d %q: refId %q empty or repeated", p.ID, p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			for _, m := range grafanaVarNames(tg.Expr) {
				if !vars[m] && !strings.HasPrefix(m, "__") {
					t.Errorf("panel %d %q: $%s is not a dashboard variable", p.ID, p.Title, m)
				}
			}
		}
	}
	// The same panels as the consoles: every console graph has a Grafana
	// panel of the same title.
	var missing []string
	for _, page := range consolePages(t) {
		for _, params := range consoleParams {
			p, err := deploytest.RenderConsole(consolesDir, librariesDir, page, params)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range p.Graphs {
				if !titles[g.Title] && !slices.Contains(missing, g.Title) {
					missing = append(missing, g.Title)
				}
			}
		}
	}
	for _, title := range missing {
		t.Errorf("console graph %q has no Grafana panel of that title", title)
	}
}

func grafanaVarNames(expr string) []string {
	var names []string
	for i := 0; i < len(expr); i++ {
		if expr[i] != '$' {
			continue
		}
		j := i + 1
		if j < len(expr) && expr[j] == '{' {
			j++
		}
		k := j
		for k < len(expr) && (expr[k] == '_' || 'a' <= expr[k] && expr[k] <= 'z' || 'A' <= expr[k] && expr[k] <= 'Z' || '0' <= expr[k] && expr[k] <= '9') {
			k++
		}
		names = append(names, expr[j:k])
	}
	return names
}
