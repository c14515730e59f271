// Package deploytest reads poplimit's deployment files the way the tools
// that run them do, so that tests can hold them against the code: the flag
// definitions of a command's main.go, the metric names a PromQL expression
// selects, the expressions of the Prometheus consoles (rendered as the
// Prometheus server renders them) and of the Grafana dashboard, rule files,
// and systemd units.
//
// It is for tests only. It parses, it does not judge: the tests in
// deploy/... decide what must agree with what.
package deploytest
