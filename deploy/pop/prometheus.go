package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// writePrometheusConfig writes a scrape config for this PoP that loads the
// project's recording and alerting rules, and returns its path.
func writePrometheusConfig(dir, root string, admins []string, aggregator string) (string, error) {
	rules, _ := filepath.Glob(filepath.Join(root, "deploy", "prometheus", "rules", "*.yml"))
	var b strings.Builder
	b.WriteString("global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n")
	if len(rules) > 0 {
		b.WriteString("rule_files:\n")
		for _, r := range rules {
			fmt.Fprintf(&b, "  - %q\n", r)
		}
	}
	b.WriteString("scrape_configs:\n")
	b.WriteString("  - job_name: poplimit-edge\n    static_configs:\n      - targets: [")
	for i, a := range admins {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", a)
	}
	b.WriteString("]\n")
	fmt.Fprintf(&b, "  - job_name: poplimit-aggregator\n    static_configs:\n      - targets: [%q]\n", aggregator)
	path := filepath.Join(dir, "prometheus.yml")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// consoleArgs serves the project's console templates, with Debian's
// console libraries when present.
func consoleArgs(root string) []string {
	args := []string{"--web.console.templates", filepath.Join(root, "deploy", "prometheus", "consoles")}
	for _, lib := range []string{"/usr/share/prometheus/console_libraries", "/etc/prometheus/console_libraries"} {
		if st, err := os.Stat(lib); err == nil && st.IsDir() {
			return append(args, "--web.console.libraries", lib)
		}
	}
	return args
}
