// Package deploy holds no code. Its directory holds poplimit's deployment
// and observability files, and its tests hold those files to the code:
//
//   - prometheus/: the scrape configuration, the recording and alerting
//     rules with their promtool unit tests, and the console templates the
//     Prometheus server serves under /consoles/;
//   - grafana/: the same dashboards for Grafana;
//   - systemd/: units for the edge, the aggregator, a memcached shard and
//     nutcracker;
//   - k8s/: a kustomize base (tested by its own package, deploy/k8s).
//
// The tests run promtool and the Prometheus server when they are installed
// (Debian: apt-get install prometheus) and skip, naming the package, when
// they are not; systemd-analyze likewise. They check that every metric a
// rule or a dashboard selects is one the code exports or a rule records,
// that every flag a unit passes is one the command defines, and that every
// rule has a unit test that sees it fire and not fire. README.md is the
// operations guide.
package deploy
