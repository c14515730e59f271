package deploytest

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// RuleFile is a Prometheus rule file (the rule_files format), decoded
// strictly: a misspelt field is an error.
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is a named group of rules.
type RuleGroup struct {
	Name     string     `json:"name"`
	Interval string     `json:"interval,omitempty"`
	Rules    []PromRule `json:"rules"`
}

// PromRule is a recording rule (Record) or an alerting rule (Alert).
type PromRule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ReadRuleFile reads and strictly decodes a rule file.
func ReadRuleFile(path string) (RuleFile, error) {
	var f RuleFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, fmt.Errorf("deploytest: %s: %w", path, err)
	}
	return f, nil
}

// RuleTestFile is a promtool test rules file, decoded strictly.
type RuleTestFile struct {
	RuleFiles          []string   `json:"rule_files"`
	EvaluationInterval string     `json:"evaluation_interval,omitempty"`
	GroupEvalOrder     []string   `json:"group_eval_order,omitempty"`
	Tests              []RuleTest `json:"tests"`
}

// RuleTest is one test group of a promtool test file.
type RuleTest struct {
	Name           string        `json:"name,omitempty"`
	Interval       string        `json:"interval,omitempty"`
	ExternalLabels any           `json:"external_labels,omitempty"`
	ExternalURL    string        `json:"external_url,omitempty"`
	InputSeries    []InputSeries `json:"input_series"`
	AlertRuleTests []struct {
		EvalTime  string `json:"eval_time"`
		Alertname string `json:"alertname"`
		ExpAlerts []struct {
			ExpLabels      map[string]string `json:"exp_labels,omitempty"`
			ExpAnnotations map[string]string `json:"exp_annotations,omitempty"`
		} `json:"exp_alerts"`
	} `json:"alert_rule_test,omitempty"`
	PromQLExprTests []struct {
		Expr       string `json:"expr"`
		EvalTime   string `json:"eval_time"`
		ExpSamples []struct {
			Labels string  `json:"labels"`
			Value  float64 `json:"value"`
		} `json:"exp_samples"`
	} `json:"promql_expr_test,omitempty"`
}

// InputSeries is one input series of a promtool test.
type InputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

// ReadRuleTestFile reads and strictly decodes a promtool test file.
func ReadRuleTestFile(path string) (RuleTestFile, error) {
	var f RuleTestFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, fmt.Errorf("deploytest: %s: %w", path, err)
	}
	return f, nil
}
