// Package faults is poplimit's fault, load and bad-input suite: integration
// tests that run a real PoP on loopback (memcached shards, edges, the
// Kafka-protocol broker, the aggregator), break it the way production
// breaks, and measure what clients experienced. It has no code outside its
// tests; RESULTS.md, beside this file, holds the figures they log.
//
// Every test starts real servers on ports it picks, bounds its own time
// and traffic, stops everything it started, and logs what it measured:
//
//   - TestShardKilled, TestShardHung: a memcached shard killed (and
//     restarted) or silent mid-replay. Fail-open rules keep admitting
//     within the store timeout, fail-closed rules refuse only the failed
//     shard's keys, the shard is ejected and comes back, every fallback is
//     counted.
//   - TestBrokerOutage, TestAggregatorRestart: the broker away under load,
//     the aggregator stopped and started mid-stream: throughput holds,
//     producers recover by themselves, every event is judged exactly once.
//   - TestEdgeRestart: an edge stopped with SIGTERM flushes what it
//     counted, and its successor starts from the shared counters.
//   - TestPartition, TestAddShard: edges that each reach part of the
//     shards, and a shard added under load: what clients saw, and
//     convergence without any action. TestPartition draws it: a page
//     (package internal/plotpage, opened in headless Chromium) of each
//     class of client's admitted requests per second through each side
//     of the split against its allowance (POPLIMIT_PARTITION_PAGE names
//     the file; faults/partition.png is a full run's).
//   - TestClockSkew: one edge's clock ahead by 10, 100 and 1000 ms.
//   - TestSoak, TestKeyFlood, TestEdgeSurvivesItsOpenFileLimit: a steady
//     load (no growth of goroutines, file descriptors or heap), a flood of
//     never-seen keys (memory stays under its bound, legitimate clients
//     are still limited correctly), an edge out of file descriptors.
//   - hostile_test.go and fuzz_test.go: client addresses in every
//     spelling, hostile keys and headers, a bad rules file pushed to a
//     running edge, and fuzz targets for key extraction and memcached
//     replies, whose seed corpora run in the normal suite.
//
// The normal suite (scripts/test.sh) runs short versions; POPLIMIT_FULL=1
// (scripts/faults-full.sh) runs the full ones: a 30 s partition, a
// 10-minute soak, 10 million keys, longer skew runs.
//
// Accuracy: in-process edges hand every decision event to a recorder that
// stamps it with the true time (a skewed edge keeps its own), and the
// suite's sliding-window rules are judged twice, by package judge and by a
// small exact evaluator here, which must agree; the evaluator also splits
// the figures by client, by phase of the fault and by shard. "Admitted
// beyond its limit" is the judge's wrongly allowed; "refused within its
// limit" its wrongly limited.
package faults
