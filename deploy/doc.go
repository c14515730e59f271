// Package deploy holds only tests: they hold poplimit's deployment and
// observability files, in this directory and below it, to the code. The
// programs and packages of the directory are its subdirectories:
//
//   - pop/: the command behind `go run ./deploy/pop`, a whole PoP on
//     loopback with a replay through it and the accuracy report;
//   - prometheus/: the scrape configuration, the recording and alerting
//     rules with their promtool unit tests, and console templates;
//   - grafana/: the same dashboards for Grafana;
//   - systemd/: units for the edge, the aggregator, a memcached shard and
//     nutcracker, with example environment files;
//   - k8s/ and Dockerfile: a kustomize base and the image it runs, tested
//     by package deploy/k8s;
//   - envoy/ and proxies/: Envoy, Caddy, nginx and HAProxy configurations,
//     tested against the real proxies by their own packages;
//   - internal/deploytest: the checkers these tests share (commands'
//     flags, PromQL, rule files, consoles, dashboards, units).
//
// The tests check that every metric a rule, console or dashboard selects
// is one the code exports or a rule records, that every flag a unit or
// manifest passes is one the command defines, that every recorded series
// is evaluated by a unit test and every alert seen firing and not firing,
// and that the documents list every metric and flag. They run promtool, the
// Prometheus server and systemd-analyze when installed (Debian: apt-get
// install prometheus) and skip, naming what to install, when not.
// README.md is the operations guide.
package deploy
