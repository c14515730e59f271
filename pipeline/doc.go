// Package pipeline carries rate-limit decisions from the edges to the
// aggregator through Kafka: a compact binary event per decision, many
// events to a Kafka message (a frame), a producer that never blocks a
// request, and a consumer-group reader that commits only what it has
// applied and drops frames it has already read. It is transport only: it
// knows nothing of rules, windows, stores or verdicts, and imports none of
// the packages that do.
//
// # What an event carries, and why
//
// The aggregator judges every decision against the exact truth of the
// rule's algorithm, and it must be able to do so from the event alone,
// without the edge's rule table (which may have changed since) or any other
// event's help. So an Event carries, besides when (Time, Unix ns), where
// (Edge) and who (KeyHash, a 64-bit hash of rule and client key: client
// keys never leave the edge), the rule's name and everything the verdict
// depends on: the Algorithm (sliding_window, fixed_window, token_bucket,
// leaky_bucket, sliding_log, in the order of window.Algorithm), the Limit in
// force for that key and the window (WindowMillis), which are also a
// bucket's rate, the bucket's capacity (Burst), the Action (throttle counts
// admitted requests, block counts every attempt), the Cost of the request,
// the Estimate the edge decided on (to measure the estimator's error), the
// Decision and Mode, and four flags: FromBlockCache (answered from memory),
// Shadow (logged, not enforced), Fallback (decided by the failure policy
// because the store was unreachable), which the judge reports apart, and
// Delayed, with DelayMicros, for a request a leaky-bucket queue held instead
// of refusing.
//
// # Binary layout, version 2
//
// Big-endian fixed fields, then unsigned LEB128 varints (as
// encoding/binary's Uvarint, minimally encoded), then the rule name:
//
//	offset  size  field
//	0       1     version, 2
//	1       1     flags: bit 0 Limited, 1 ModeSync, 2 ActionBlock,
//	              3 FromBlockCache, 4 Shadow, 5 Fallback, 6 Delayed;
//	              7 reserved, zero
//	2       1     Algorithm, 0-4
//	3       8     Time, int64 Unix nanoseconds
//	11      8     KeyHash, uint64
//	19      4     Estimate, IEEE 754 float32 bits
//	23      1-3   Edge, uvarint <= 65535
//	        1-5   Cost, uvarint <= 2^32-1
//	        1-5   Limit, uvarint <= 2^32-1
//	        1-5   WindowMillis, uvarint <= 2^32-1
//	        1-5   Burst, uvarint <= 2^32-1
//	        1-5   DelayMicros, uvarint <= 2^32-1, present iff Delayed
//	        1     rule name length, 0-255
//	        n     rule name bytes
//
// A typical event is 35 to 55 bytes; none exceeds MaxEventLen (307). The
// encoding is canonical, so decoding and re-encoding reproduces the input
// (a DelayMicros without Delayed is refused, since it would not survive).
// The version byte comes first so that a reader can refuse what it does not
// understand (ErrVersion) instead of misreading it; a new field means a new
// version, and readers are upgraded before writers. Version 1, the same
// layout without the algorithm byte, Burst and DelayMicros (and with flag
// bit 6 reserved), is still read: it was written for sliding-window rules
// only, so it decodes as AlgorithmSlidingWindow with Burst = Limit.
// AppendEvent writes version 2 only.
//
// # Frames
//
// A producer sends each partition's events in frames, one Kafka message
// each, of up to FrameEvents events (default 1024) and FrameBytes bytes
// (default 64 KiB), instead of one message per event: the per-message work
// of kafka-go and of the broker (record headers, batching, requests) is
// shared by a frame's events. A frame is a header and the events, each
// with its length:
//
//	offset  size  field
//	0       1     0x81: a frame (bit 7), format version 1
//	1       2     edge, uint16: every event of the frame comes from it
//	3       8     sequence number, uint64
//	11      2     event count, 1-65535
//	13            count × (length, uvarint 1-307; a version 2 event)
//
// Event versions stay below 0x80, so a reader tells a frame from a single
// event by the first byte (IsFrame), and the consumer reads both: messages
// of producers from before frames are single events. Frames decode whole or
// not at all, and the encoding is canonical (AppendFrame, DecodeFrame).
//
// Each (edge, partition) is a stream of frames numbered in sequence. A
// producer numbers its frames per partition from a random 64-bit value
// drawn when it starts (math/rand/v2, whose state the runtime draws at
// random), the same for all its partitions, and adds one per frame (a
// producer that emits for several edges keeps a frame open per edge and
// numbers them all from its partition's counter, so each of their streams
// increases, with gaps, and no two share a number). A random start, not a time-based one, because it needs no clock: a
// restarted edge whose clock stepped back, or two producers started in the
// same instant under one edge id (a misconfiguration), would repeat the
// numbers of a time-based start, while two random starts collide only if
// their ranges overlap, with probability about (frames of both runs) /
// 2^64. A frame keeps its number when it is sent again, so a copy of it is
// recognised.
//
// # Partitioning and order
//
// Events are placed by key exactly as one message per event was: the
// partition of a key is the one kafka-go's Hash balancer gives its 8-byte
// big-endian KeyHash (FNV-1a, as a signed 32-bit integer, modulo the
// partition count, made positive, as Sarama and the Java client's legacy
// partitioner do), so all events of one key land in one partition, and
// frames hold the events of one partition only. The producer learns the
// partition count from the metadata kafka-go caches (MetadataTTL) and
// writes each frame to its partition with a balancer of its own. One edge
// emits a key's events from one queue into one open frame of its
// partition, sealed and written in order, and kafka-go writes each partition's
// batches one after the other, so a key's events from one edge reach the
// consumer in the order the edge emitted them, except that frames sent
// again after a broker outage come after the frames written meanwhile.
// Events of one key from different edges interleave in arrival order; the
// aggregator orders them by Time. Adding partitions moves keys, so order
// holds only while the partition count is unchanged. A frame's message
// timestamp is its first event's Time (the write time if that is 0).
//
// # Producer: never block a request
//
// Producer.Emit copies the event into a bounded queue (a lock-free ring,
// one compare-and-swap a push) or, when it is full, drops it and counts it;
// it allocates nothing and never touches the network. One goroutine frames
// the queue and hands the frames to a
// kafka-go Writer configured explicitly from ProducerConfig (kafka-go turns
// zero values into defaults: BatchTimeout 0 becomes one second). It does
// not wake per event: the first event after an idle spell starts an
// interval of BatchTimeout, at whose end the goroutine frames what is
// queued and writes every frame; frames that fill are written as soon as
// the goroutine sees them, which it does early when BatchSize events are
// queued. So an event waits at most about BatchTimeout before it is
// written, and neither the goroutine's wake-ups nor kafka-go's produce
// requests (about one a partition an interval, while frames do not fill)
// grow with the rate: at low rates they are most of the producer's CPU,
// and a longer BatchTimeout is what lowers it (BenchmarkProducerCPU). In Async mode at most MaxWritesInFlight writes await an
// outcome, so kafka-go's own unbounded queues stay short; a frame's buffer
// is used again once its outcome is known. When a write fails every
// attempt, the goroutine pauses: it keeps that write's frames, whole and
// with their numbers, in a bounded retry buffer (RetryBuffer events), takes
// nothing more from the queue, and probes the broker with an ApiVersions
// request (backing off from WriteBackoffMin to WriteBackoffMax) until it
// answers; then it sends the kept frames first. So an outage is carried by
// the queue, and only what a full queue refuses is lost (dropped,
// counted); nothing grows without bound. Every event Emit was offered ends
// in exactly one counter: sampled out, dropped (queue full, closed,
// invalid), delivered or failed (write, closed), once Close returns; a
// retried event is counted once, when it ends.
//
// # Sampling by key
//
// With SampleRate r < 1, an event is sent iff a fixed mix of its KeyHash falls
// in the lowest fraction r of the 64-bit range (SampleKey). The decision
// depends on the key alone, so every edge keeps the same keys, and a kept
// key's events are all there: the aggregator's exact truth needs a key's
// complete history, which sampling events independently would destroy.
// Aggregate rates are scaled by 1/r; per-key verdicts need no correction.
//
// # Consumer: at-least-once, commit after apply, frames once
//
// Consumer.Run fetches messages as a member of a consumer group, decodes
// them (a message that decodes as neither a frame nor an event is counted
// and skipped, never a panic), hands their events to apply in batches and
// commits their offsets only after apply returned nil. A consumer that
// stops, or dies, and one that replaces it in the group therefore never
// lose what was committed and never see it again; a batch applied but not
// yet committed when a consumer died is applied again (at-least-once). An
// Event's Rule aliases the fetched message and is valid only until apply
// returns.
//
// Within one Run, a frame read a second time is dropped before apply and
// counted (duplicate_frames_total, duplicate_events_total): one whose edge,
// partition and sequence number equal those of one of the latest
// DedupFrames frames. That catches a frame kafka-go wrote twice (its
// acknowledgement was lost and it retried), one the producer's retry
// buffer sent again after a write it counted as failed had in fact
// reached the broker, and messages fetched again after a rebalance or a
// commit that was cut off. The identity is exact, not a fingerprint, so no
// two real frames are ever taken for one another.
//
// Run marks the events of a frame it checked (Event.Framed), and the
// judge's fingerprint dedup (cmd/aggregator's judge, by a hash of every
// field of an event) skips them: a producer never puts an event in two
// frames (it keeps and resends frames, not events), so every copy of a
// framed event is a copy of its frame, and the frame dedup, remembering at
// least 131,072 frames by default, reaches at least as far back as the
// judge's 131,072 to 262,144 events. The fingerprint still catches what
// the frame dedup cannot see: copies of single-event messages, which carry
// no frame identity (producers from before frames, during an upgrade). It
// cost a third of the judge's CPU per event (BenchmarkAdd). Neither
// survives a restart of the aggregator: both remember in memory, so what
// a crashed aggregator applied but had not committed is judged again.
//
// # What it deliberately does not do
//
// It does not guarantee delivery: an edge drops events rather than slow a
// request, and a drop is a counted decision, not an error. It offers no
// exactly-once semantics across restarts (no idempotent producer, no
// transactions; duplicates within a consumer's memory are dropped as
// above); Kafka offers none that would survive an edge's restart anyway. It
// does not order events across edges or partitions, keep a judge's state,
// create topics, or retry an apply that failed (Run returns and the caller
// decides).
//
// # Concurrency
//
// Producer.Emit and Producer.Close may be called from any goroutine. A
// Consumer's Run runs on its caller's goroutine and Close, from another, stops
// it after the batch in hand. Every goroutine the package starts (the
// producer's writer goroutine, kafka-go's) is stopped by Close. There is no
// lock order: no code path holds two locks.
package pipeline
