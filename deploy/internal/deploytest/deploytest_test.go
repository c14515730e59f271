package deploytest

import (
	"path/filepath"
	"slices"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (rule, decision) (rate(poplimit_edge_requests_total{decision="limited"}[1m]))`, []string{"poplimit_edge_requests_total"}},
		{`sum(rate(a_total[5m])) without (instance) / on (job) group_left (x) b`, []string{"a_total", "b"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m]))) > 1e-3`, []string{"x_bucket"}},
		{`rule:x:rate1m{rule='a}b'} offset 5m and on () vector(0) or time() - y`, []string{"rule:x:rate1m", "y"}},
		{`label_replace(m, 'dst', 'v', '', '') unless bool n`, []string{"m", "n"}},
		{`count(ALERTS{alertstate="firing"}) or vector(0)`, []string{"ALERTS"}},
		{`topk(5, sort_desc(x)) # a comment with y`, []string{"x"}},
		{`a[5m:1m] + Inf + NaN + 0x1f + 1.5e+3`, []string{"a"}},
	} {
		got, err := MetricNames(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("MetricNames(%q) = %q, %v; want %q", tt.expr, got, err, tt.want)
		}
	}
	for _, bad := range []string{`x{a="b"`, `rate(x[5m)`, `x{a="b}`} {
		if _, err := MetricNames(bad); err == nil {
			t.Errorf("MetricNames(%q): want an error", bad)
		}
	}
}

func FuzzMetricNames(f *testing.F) {
	f.Add(`sum by (a) (rate(x{b="c"}[5m])) / on() y`)
	f.Add(`'unterminated`)
	f.Fuzz(func(t *testing.T, expr string) {
		names, err := MetricNames(expr)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "" || !isIdentStart(n[0]) {
				t.Errorf("MetricNames(%q): name %q", expr, n)
			}
		}
	})
}

func TestParseUnit(t *testing.T) {
	u, err := ParseUnit("# c\n[Unit]\nDescription=d\n\n[Service]\nExecStart=/bin/x \\\n    -a ${A} \\\n    # interleaved\n    $B\nEnvironment=X=1\nEnvironment=Y=2\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := u.Value("Service", "ExecStart"); got != "/bin/x -a ${A} $B" {
		t.Errorf("ExecStart = %q", got)
	}
	if got := u.Values("Service", "Environment"); !slices.Equal(got, []string{"X=1", "Y=2"}) {
		t.Errorf("Environment = %q", got)
	}
	for _, bad := range []string{"Key=value\n", "[Service\n", "[Service]\nnot a setting\n", "[Service]\nA=b \\\n"} {
		if _, err := ParseUnit(bad); err == nil {
			t.Errorf("ParseUnit(%q): want an error", bad)
		}
	}
}

func FuzzParseUnit(f *testing.F) {
	f.Add("[Service]\nExecStart=/bin/x \\\n -a\n")
	f.Fuzz(func(t *testing.T, text string) {
		u, err := ParseUnit(text)
		if err != nil {
			return
		}
		for _, settings := range u {
			for _, s := range settings {
				if s.Key == "" && s.Value == "" && s.Line == 0 {
					t.Errorf("ParseUnit(%q): empty setting", text)
				}
			}
		}
	})
}

func TestCommandWords(t *testing.T) {
	got, err := CommandWords(`-/usr/bin/x -a "b c" 'd' ${E}`)
	if want := []string{"/usr/bin/x", "-a", "b c", "d", "${E}"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("CommandWords = %q, %v; want %q", got, err, want)
	}
	if _, err := CommandWords(`/bin/x "open`); err == nil {
		t.Error("unterminated quote: want an error")
	}
}

func TestFlags(t *testing.T) {
	fs, err := Flags(filepath.Join("..", "..", "..", "cmd", "edge"))
	if err != nil {
		t.Fatal(err)
	}
	if fs["listen"].Default != "127.0.0.1:7070" || fs["store-timeout"].Default != "100ms" {
		t.Errorf("listen %+v, store-timeout %+v", fs["listen"], fs["store-timeout"])
	}
	if _, ok := fs["mode"]; !ok {
		t.Error("-mode (defined with fs.Var) missing")
	}
}

func TestGrafanaExpr(t *testing.T) {
	got := GrafanaExpr(`rate(x{rule=~"$rule",i="${instance:regex}"}[$__rate_interval])`, "api")
	if want := `rate(x{rule=~"api",i="api"}[1m])`; got != want {
		t.Errorf("GrafanaExpr = %q, want %q", got, want)
	}
	if sel, ok := LabelValuesSelector(`label_values(rule:x:rate1m{job="a"}, rule)`); !ok || sel != `rule:x:rate1m{job="a"}` {
		t.Errorf("LabelValuesSelector = %q, %v", sel, ok)
	}
}
