// Package faults is poplimit's fault, load and bad-input suite: integration
// tests that run a real PoP on loopback (memcached shards, edges, the
// Kafka-protocol broker, the aggregator), break it the way production
// breaks, and measure what clients experienced. It has no code of its own
// outside its tests; this file only explains them.
//
// # What is proved
//
// Every test starts real servers on ports it picks, bounds its own time and
// traffic, stops everything it started, and logs the figures it measured
// (they are collected in RESULTS.md beside this file):
//
//   - TestShardKilled, TestShardHung: a memcached shard is killed (and
//     restarted) or hangs (a relay that goes silent) in the middle of a
//     replay through two edges. Fail-open rules keep admitting and no
//     request waits past the store timeout plus a margin; fail-closed rules
//     refuse, and only for keys of the failed shard; the shard is ejected
//     and comes back; keys of the other shards are decided as before; every
//     fallback is counted. Reported: latency percentiles and requests
//     admitted beyond their limit, before, during and after the outage.
//   - TestBrokerOutage: the Kafka broker goes away under load and comes
//     back (a restart on the same port, with its log on disk): the edges'
//     throughput stays within noise, drops are counted, the producers
//     recover by themselves and the aggregator catches up.
//   - TestAggregatorRestart: the aggregator binary is stopped (SIGTERM) and
//     started again mid-stream: the two judge every event in the topic
//     exactly once between them, proved with counts.
//   - TestEdgeRestart: an edge binary stopped with SIGTERM flushes its
//     pending increments (memcached's counters equal the admissions clients
//     saw), and a new edge starts from the shared counters, not from zero.
//   - TestPartition: two edges that each reach only part of the shards
//     (through relays the test controls), for 30 s in the full version;
//     what every client experienced before, during and after, and
//     convergence after the heal without any action.
//   - TestClockSkew: one of two edges runs 10, 100 and 1000 ms ahead; the
//     judge (package judge) measures the accuracy at each.
//   - TestAddShard: a fourth shard is added under load by restarting the
//     edges one after the other with the new list: the keys ketama moves,
//     their counters restarting from zero, and the over-admission it costs.
//   - TestSoak: two edge binaries with the whole pipeline (memcached,
//     broker, aggregator binary) at a steady high rate for 1 minute (10 in
//     the full version): no growth of goroutines, file descriptors or heap
//     beyond stated bounds, no errors, accuracy steady.
//   - TestKeyFlood: 1 million never-seen keys (10 million in the full
//     version) through an edge binary with -max-keys and
//     -block-cache-entries set: its RSS stays under the bound, both tables
//     evict (counted), and legitimate keys are still limited correctly.
//   - Bad input (hostile_test.go, fuzz_test.go): client addresses in every
//     spelling (IPv6 forms, IPv4-mapped, malformed X-Forwarded-For chains)
//     are one key each and cannot hurt other clients; too many headers;
//     hostile keys cost bounded memory; a bad rules file pushed to a
//     running edge binary is rejected with the error in its log and
//     metrics; fuzz targets for key extraction from hostile requests and
//     for memcached replies, whose seed corpora run in the normal suite.
//
// # Short and full versions
//
// The normal suite (scripts/test.sh, go test -race ./...) runs the short
// versions, about five minutes in all on a two-core machine. The full
// versions (30 s partition, 10-minute soak, 10 million keys, longer skew
// runs) run with POPLIMIT_FULL=1; scripts/faults-full.sh runs them.
//
// # How accuracy is measured
//
// In-process edges hand every decision event to a recorder that stamps it
// with the true wall-clock time (an edge with a skewed clock stamps its own
// events with its own time), and the recorder's events are judged against
// the exact sliding window in two ways that must agree: by the
// aggregator's judge (package judge), for the totals, and by a small exact
// evaluator here, which also splits the figures by client, by phase of the
// fault and by shard. "Admitted beyond its limit" is the judge's wrongly
// allowed: admitting the request made the client's exact count of
// admitted requests in the trailing window exceed the limit. "Refused
// within its limit" is wrongly limited: the client had sent no more than
// the limit in the trailing window, this request included.
package faults
