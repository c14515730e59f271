// Package pipeline carries rate-limit decisions from the edges to the
// aggregator through Kafka: a compact binary event.Event per decision, many
// events to a Kafka message (a frame), a Producer that never blocks a
// request, and a Consumer that commits only what it has applied and drops
// frames it has already read. It is transport only: it knows nothing of
// rules, windows, stores or verdicts, and imports none of the packages
// that do.
//
// The Event, its enumerations and its encoding live in package event, which
// imports no transport; this package frames events for Kafka.
// DecodeFrame and the Producer's frames are canonical (decoding and
// re-encoding reproduces the input) and refuse what they do not understand
// with one of package event's errors, never a panic.
// FORMAT.md, beside this file, gives the frame layout, the partitioning
// (all events of a key in one partition, in the order one edge emitted
// them), the frame numbering, and the MAC of signed frames.
//
// With an events key (ProducerConfig.Key, ConsumerConfig.Key, shared by
// the edges and the aggregator), every frame ends with an HMAC-SHA256 of
// itself and its partition (FrameKey), one per frame, and the consumer
// hands apply only the events of frames whose MAC holds: a writer of the
// topic without the key, which every edge's principal must be allowed to
// be, forges no event. What it refuses is counted by reason.
//
// Producer.Emit copies an event into a bounded lock-free queue, or drops
// and counts it when the queue is full; it allocates nothing and never
// touches the network. One goroutine frames the queue and writes the
// frames; an event waits about BatchTimeout at most before it is written.
// When a write fails every attempt, the producer pauses: it keeps the
// failed frames (at most RetryBuffer events), takes nothing more from the
// queue, probes the broker until it answers, then sends the kept frames
// first. Every event offered ends in exactly one counter once Close
// returns: sampled out, dropped, delivered or failed. With SampleRate < 1
// the events of whole keys are sent or not (SampleKey).
//
// Consumer.Run reads as a member of a consumer group, hands decoded events
// to apply in batches, and commits their offsets only after apply returned
// nil: at least once. Within one Run a frame whose edge, partition and
// sequence number match one of the latest DedupFrames frames is dropped
// and counted, and the events of checked frames are marked Framed. An
// Event's Rule aliases the fetched message, valid until apply returns.
//
// It does not guarantee delivery (an edge drops events rather than slow a
// request), deduplicate across restarts, order events across edges or
// partitions (the judge orders them by time), create topics, or retry an
// apply that failed (Run returns and the caller decides).
//
// Producer.Emit and Close may be called from any goroutine. A Consumer's
// Run runs on its caller's goroutine; Close, from another, stops it after
// the batch in hand. Close stops every goroutine the package starts. No
// code path holds two locks.
package pipeline
