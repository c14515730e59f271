package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
)

// Dashboard is what the tests need of a Grafana dashboard JSON.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; rows hold theirs in Panels when collapsed.
type Panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []Target `json:"targets"`
	Panels  []Panel  `json:"panels"`
}

// Target is one query of a panel.
type Target struct {
	Expr  string `json:"expr"`
	RefID string `json:"refId"`
}

// Variable is a dashboard variable. Query is a string or an object with a
// "query" string, depending on Grafana's version.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// QueryText returns the variable's query.
func (v Variable) QueryText() (string, error) {
	if len(v.Query) == 0 {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("deploytest: variable %s: query: %w", v.Name, err)
	}
	return o.Query, nil
}

// ReadDashboard reads a Grafana dashboard JSON file.
func ReadDashboard(path string) (Dashboard, error) {
	var d Dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("deploytest: %s: %w", path, err)
	}
	return d, nil
}

// AllPanels returns the panels, those inside rows included.
func (d Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)

// GrafanaExpr replaces Grafana's variables in a panel expression with
// values PromQL accepts: the interval variables with 1m or 1h, the
// dashboard's own with value.
func GrafanaExpr(expr, value string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		switch name {
		case "__rate_interval", "__interval", "interval":
			return "1m"
		case "__range":
			return "1h"
		}
		return value
	})
}

var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*\w+\s*\)\s*$`)

// LabelValuesSelector returns the series selector of a variable query
// label_values(selector, label), or false for other queries.
func LabelValuesSelector(query string) (string, bool) {
	m := labelValues.FindStringSubmatch(query)
	if m == nil {
		return "", false
	}
	return m[1], true
}
