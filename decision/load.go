package decision

import (
	"fmt"
	"os"

	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// DefaultRules is the built-in rule of an edge started without a rules
// file: 100 requests per minute per client IP.
const DefaultRules = `
rules:
  - name: default-per-client
    limit: 100
    window: 1m
`

// LoadFiles parses the configured rules and overrides files.
//
// The rules path may also name envoyproxy/ratelimit configuration: a file
// with a top-level domain, or a directory of such files (every *.yaml and
// *.yml, as ratelimit reads its runtime directory), for Envoy's rate limit
// service; overrides do not apply to those.
func LoadFiles(rulesFile, overridesFile string) (*rules.Rules, error) {
	data := []byte(DefaultRules)
	if rulesFile != "" {
		st, err := os.Stat(rulesFile)
		if err != nil {
			return nil, fmt.Errorf("decision: rules: %w", err)
		}
		if !st.IsDir() {
			if data, err = os.ReadFile(rulesFile); err != nil {
				return nil, fmt.Errorf("decision: rules: %w", err)
			}
		}
		if st.IsDir() || envoyconf.IsEnvoy(data) {
			if overridesFile != "" {
				return nil, fmt.Errorf("decision: %s: envoyproxy/ratelimit files take no overrides file (%s)", rulesFile, overridesFile)
			}
			rs, err := envoyconf.LoadPath(rulesFile)
			if err != nil {
				return nil, fmt.Errorf("decision: %s: %w", rulesFile, err)
			}
			return rs, nil
		}
	}
	rs, err := rules.ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("decision: %s: %w", nameOr(rulesFile, "built-in rules"), err)
	}
	if overridesFile != "" {
		data, err := os.ReadFile(overridesFile)
		if err != nil {
			return nil, fmt.Errorf("decision: overrides: %w", err)
		}
		if rs.Overrides, err = rules.ParseOverrides(data); err != nil {
			return nil, fmt.Errorf("decision: %s: %w", overridesFile, err)
		}
	}
	return rs, nil
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
