package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// preparePrometheus copies the project's Prometheus setup (deploy/prometheus:
// the scrape config, recording and alerting rules, consoles) into dir and
// points its file_sd targets at this PoP's edges and aggregator, so the PoP
// runs the very configuration the project ships. It returns the config path.
func preparePrometheus(dir, root string, admins []string, aggregator string) (string, error) {
	src := filepath.Join(root, "deploy", "prometheus")
	dst := filepath.Join(dir, "prometheus")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	targets := func(addrs ...string) string {
		return "- targets: [\"" + strings.Join(addrs, "\", \"") + "\"]\n"
	}
	for name, body := range map[string]string{"edges.yml": targets(admins...), "aggregator.yml": targets(aggregator)} {
		if err := os.WriteFile(filepath.Join(dst, "targets", name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(dst, "prometheus.yml"), nil
}

// consoleArgs serves the copied console templates and libraries.
func consoleArgs(cfg string) []string {
	d := filepath.Dir(cfg)
	return []string{"--web.console.templates", filepath.Join(d, "consoles"),
		"--web.console.libraries", filepath.Join(d, "console_libraries")}
}
