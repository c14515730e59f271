package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ConsolePage is a console template rendered as the Prometheus server
// renders it (web/web.go and template/template.go of Prometheus 2.x:
// html/template, the libraries' *.lib parsed after the page, the same data
// and function names), with a stand-in for the query engine.
type ConsolePage struct {
	HTML string
	// Queries are the expressions the template evaluated with "query",
	// in order.
	Queries []string
	// Graphs are the PromConsole.Graph calls in the page: the browser
	// sends their expressions to /api/v1/query_range.
	Graphs []Graph
}

// Graph is one PromConsole.Graph of a console.
type Graph struct {
	Title string // the poplimit_section heading before it
	Expr  string
}

// FakeLabels are the labels of the one sample every query returns while
// rendering, so that "range query ..." bodies render too, with these values.
var FakeLabels = map[string]string{
	"__name__": "fake", "job": "poplimit-edge", "instance": "127.0.0.1:7071",
	"rule": "api", "decision": "limited", "source": "limiter", "edge": "1",
	"mode": "async", "class": "enforced", "verdict": "wrongly_allowed", "op": "incr",
	"result": "ok", "quantile": "0.99", "policy": "open", "reason": "queue_full",
	"priority": "low", "kind": "false_negative", "partition": "0",
}

type sample struct {
	Labels map[string]string
	Value  float64
}

type queryResult []*sample

// RenderConsole renders the console page (a file name in consolesDir) with
// the URL parameters params and the libraries libDir/*.lib.
func RenderConsole(consolesDir, libDir, page string, params map[string]string) (ConsolePage, error) {
	text, err := os.ReadFile(filepath.Join(consolesDir, page))
	if err != nil {
		return ConsolePage{}, err
	}
	libs, err := filepath.Glob(filepath.Join(libDir, "*.lib"))
	if err != nil {
		return ConsolePage{}, err
	}
	raw := url.Values{}
	for k, v := range params {
		raw.Set(k, v)
	}
	data := struct {
		RawParams      url.Values
		Params         map[string]string
		Path           string
		ExternalLabels map[string]string
	}{raw, params, page, map[string]string{}}
	// The variables Prometheus defines before every console.
	defs := `{{$rawParams := .RawParams }}{{$params := .Params}}{{$path := .Path}}{{$externalLabels := .ExternalLabels}}`

	var p ConsolePage
	tmpl := template.New("__console_" + page)
	tmpl.Funcs(consoleFuncs(&p))
	tmpl.Funcs(template.FuncMap{
		"tmpl": func(name string, data any) (template.HTML, error) {
			var b bytes.Buffer
			err := tmpl.ExecuteTemplate(&b, name, data)
			return template.HTML(b.String()), err
		},
	})
	if _, err := tmpl.Parse(defs + string(text)); err != nil {
		return ConsolePage{}, err
	}
	if len(libs) > 0 {
		if _, err := tmpl.ParseFiles(libs...); err != nil {
			return ConsolePage{}, err
		}
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, data); err != nil {
		return ConsolePage{}, err
	}
	p.HTML = out.String()
	p.Graphs, err = graphs(p.HTML)
	return p, err
}

var (
	graphCall = regexp.MustCompile(`new PromConsole\.Graph\(`)
	graphExpr = regexp.MustCompile(`(?s)\A\{.*?\bexpr:\s*("(?:[^"\\]|\\.)*")\s*,`)
	heading   = regexp.MustCompile(`(?s)<h4 class="poplimit_section">(.*?)</h4>`)
)

// graphs finds every PromConsole.Graph call in a rendered page, with the
// heading before it. Each must give expr as one string literal.
func graphs(page string) ([]Graph, error) {
	var gs []Graph
	for _, loc := range graphCall.FindAllStringIndex(page, -1) {
		m := graphExpr.FindStringSubmatch(page[loc[1]:])
		if m == nil {
			return nil, fmt.Errorf("deploytest: a PromConsole.Graph at byte %d has no expr string", loc[0])
		}
		lit := strings.ReplaceAll(m[1], `\/`, `/`)
		expr, err := strconv.Unquote(lit)
		if err != nil {
			return nil, fmt.Errorf("deploytest: graph expr %s: %w", m[1], err)
		}
		g := Graph{Expr: expr}
		if hs := heading.FindAllStringSubmatch(page[:loc[0]], -1); len(hs) > 0 {
			g.Title = htmlUnescape(hs[len(hs)-1][1])
		}
		gs = append(gs, g)
	}
	return gs, nil
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'").Replace(s)
}

// consoleFuncs are Prometheus's template functions, with query answered by
// one sample labelled FakeLabels and recorded in p.Queries.
func consoleFuncs(p *ConsolePage) template.FuncMap {
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
	return template.FuncMap{
		"query": func(q string) (queryResult, error) {
			if strings.TrimSpace(q) == "" {
				return nil, errors.New("query: empty expression")
			}
			p.Queries = append(p.Queries, q)
			return queryResult{{Labels: FakeLabels, Value: 1}}, nil
		},
		"first": func(v queryResult) (*sample, error) {
			if len(v) == 0 {
				return nil, errors.New("first() called on vector with no elements")
			}
			return v[0], nil
		},
		"label":    func(label string, s *sample) string { return s.Labels[label] },
		"value":    func(s *sample) float64 { return s.Value },
		"strvalue": func(s *sample) string { return s.Labels["__value__"] },
		"args": func(args ...any) map[string]any {
			m := map[string]any{}
			for i, a := range args {
				m[fmt.Sprintf("arg%d", i)] = a
			}
			return m
		},
		"reReplaceAll": func(pattern, repl, text string) string {
			return regexp.MustCompile(pattern).ReplaceAllString(text, repl)
		},
		"safeHtml": func(text string) template.HTML { return template.HTML(text) },
		"match":    regexp.MatchString,
		"title":    strings.ToTitle,
		"toUpper":  strings.ToUpper,
		"toLower":  strings.ToLower,
		"graphLink": func(expr string) string {
			return "/graph?g0.expr=" + url.QueryEscape(expr) + "&g0.tab=0"
		},
		"tableLink": func(expr string) string {
			return "/graph?g0.expr=" + url.QueryEscape(expr) + "&g0.tab=1"
		},
		"sortByLabel": func(label string, v queryResult) queryResult {
			v = slices.Clone(v)
			slices.SortStableFunc(v, func(a, b *sample) int { return strings.Compare(a.Labels[label], b.Labels[label]) })
			return v
		},
		"humanize":           num,
		"humanize1024":       num,
		"humanizeDuration":   func(v float64) string { return num(v) + "s" },
		"humanizePercentage": func(v float64) string { return num(v*100) + "%" },
		"humanizeTimestamp":  num,
		"pathPrefix":         func() string { return "" },
		"externalURL":        func() string { return "http://127.0.0.1:9090" },
	}
}
