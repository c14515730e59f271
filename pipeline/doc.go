// Package pipeline carries rate-limit decisions from the edges to the
// aggregator through Kafka: a compact binary event per decision, a producer
// that never blocks a request, and a consumer-group reader that commits only
// what it has applied. It is transport only: it knows nothing of rules,
// windows, stores or verdicts, and imports none of the packages that do.
//
// # What an event carries, and why
//
// The aggregator judges every decision against the exact sliding-window
// truth, and it must be able to do so from the event alone, without the
// edge's rule table (which may have changed since) or any other event's help.
// So an Event carries, besides when (Time, Unix ns), where (Edge) and who
// (KeyHash, a 64-bit hash of rule and client key: client keys never leave the
// edge), the rule's name and everything the verdict depends on: the Limit in
// force for that key, the window (WindowMillis), the Action (throttle counts
// admitted requests, block counts every attempt), the Cost of the request,
// the Estimate the edge decided on (to measure the estimator's error), the
// Decision and Mode, and three flags: FromBlockCache (answered from memory),
// Shadow (logged, not enforced) and Fallback (decided by the failure policy
// because the store was unreachable), which the judge reports apart.
//
// # Binary layout, version 1
//
// Big-endian fixed fields, then unsigned LEB128 varints (as
// encoding/binary's Uvarint, minimally encoded), then the rule name:
//
//	offset  size  field
//	0       1     version, 1
//	1       1     flags: bit 0 Limited, 1 ModeSync, 2 ActionBlock,
//	              3 FromBlockCache, 4 Shadow, 5 Fallback; 6-7 reserved, zero
//	2       8     Time, int64 Unix nanoseconds
//	10      8     KeyHash, uint64
//	18      4     Estimate, IEEE 754 float32 bits
//	22      1-3   Edge, uvarint <= 65535
//	        1-5   Cost, uvarint <= 2^32-1
//	        1-5   Limit, uvarint <= 2^32-1
//	        1-5   WindowMillis, uvarint <= 2^32-1
//	        1     rule name length, 0-255
//	        n     rule name bytes
//
// A typical event is 30 to 50 bytes; none exceeds MaxEventLen (296). The
// encoding is canonical, so decoding and re-encoding reproduces the input.
// The version byte comes first so that a reader can refuse what it does not
// understand (ErrVersion) instead of misreading it; a new field means a new
// version, and readers are upgraded before writers.
//
// # Partitioning and order
//
// Each Kafka message's key is the event's KeyHash in 8 big-endian bytes, and
// the writer uses kafka-go's Hash balancer (FNV-1a of the key, modulo the
// partition count, as Sarama and the Java client's legacy partitioner do), so
// all events of one key land in one partition. One edge emits a key's events
// from one queue through one writer that sends each partition's batches in
// order, so a key's events from one edge reach the consumer in the order the
// edge emitted them. Events of one key from different edges interleave in
// arrival order; the aggregator orders them by Time. Adding partitions moves
// keys, so order holds only while the partition count is unchanged. The
// message timestamp is the event's Time (the write time if Time is 0).
//
// # Producer: never block a request
//
// Producer.Emit copies the event onto a bounded channel or, when it is full,
// drops it and counts it; it allocates nothing and never touches the
// network. One goroutine drains the channel, encodes, and hands batches to a
// kafka-go Writer configured explicitly from ProducerConfig (kafka-go turns
// zero values into defaults: BatchTimeout 0 becomes one second). In Async
// mode at most MaxWritesInFlight writes await an outcome, so kafka-go's own
// unbounded queues stay short. When a write fails every attempt, the
// goroutine pauses: it keeps that write's events in a bounded retry buffer
// (RetryBuffer), takes nothing more from the channel, and probes the broker
// with an ApiVersions request (backing off from WriteBackoffMin to
// WriteBackoffMax) until it answers; then it sends the kept events first.
// So an outage is carried by the channel, and only what a full channel
// refuses is lost (dropped, counted); nothing grows without bound. Every
// event Emit was offered ends in exactly one counter: sampled out, dropped
// (queue full, closed, invalid), delivered or failed (write, closed), once
// Close returns; a retried event is counted once, when it ends.
//
// # Sampling by key
//
// With SampleRate r < 1, an event is sent iff a fixed mix of its KeyHash falls
// in the lowest fraction r of the 64-bit range (SampleKey). The decision
// depends on the key alone, so every edge keeps the same keys, and a kept
// key's events are all there: the aggregator's exact sliding window needs a
// key's complete history, which sampling events independently would destroy.
// Aggregate rates are scaled by 1/r; per-key verdicts need no correction.
//
// # Consumer: at-least-once, commit after apply
//
// Consumer.Run fetches messages as a member of a consumer group, decodes them
// (a message that does not decode is counted and skipped, never a panic),
// hands batches to apply and commits their offsets only after apply returned
// nil. A consumer that stops, or dies, and one that replaces it in the group
// therefore never lose what was committed and never see it again; a batch
// applied but not yet committed when a consumer died is applied again
// (at-least-once). The aggregator tolerates that replay, or deduplicates by
// (Edge, KeyHash, Time) if it must be exact. An Event's Rule aliases the
// fetched message and is valid only until apply returns.
//
// # What it deliberately does not do
//
// It does not guarantee delivery: an edge drops events rather than slow a
// request, and a drop is a counted decision, not an error. It offers no
// exactly-once semantics (no idempotent producer, no transactions; a batch
// whose acknowledgement was lost may be written twice, which the
// aggregator's judge drops as copies); Kafka offers none that would survive
// an edge's restart anyway. It does not order
// events across edges or partitions, keep a judge's state, create topics, or
// retry an apply that failed (Run returns and the caller decides).
//
// # Concurrency
//
// Producer.Emit and Producer.Close may be called from any goroutine. A
// Consumer's Run runs on its caller's goroutine and Close, from another, stops
// it after the batch in hand. Every goroutine the package starts (the
// producer's writer goroutine, kafka-go's) is stopped by Close. There is no
// lock order: no code path holds two locks.
package pipeline
