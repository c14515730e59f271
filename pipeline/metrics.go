package pipeline

import "github.com/prometheus/client_golang/prometheus"

// Metric names: namespace "poplimit", subsystem "pipeline".
const (
	namespace = "poplimit"
	subsystem = "pipeline"
)

func counterOpts(name, help string) prometheus.CounterOpts {
	return prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

type producerMetrics struct {
	emitted, sampledOut, delivered             prometheus.Counter
	droppedFull, droppedClosed, droppedInvalid prometheus.Counter
	failedWrite, failedClosed                  prometheus.Counter
	retried, pauses, framesDelivered           prometheus.Counter
	retryLen, paused                           prometheus.Gauge
	latency, frameEvents                       prometheus.Histogram
	collectors                                 []prometheus.Collector
}

func newProducerMetrics(p *Producer) producerMetrics {
	emitted := prometheus.NewCounter(counterOpts("events_emitted_total", "Events offered to Producer.Emit."))
	sampled := prometheus.NewCounter(counterOpts("events_sampled_out_total",
		"Events not sent because their key is outside the sample."))
	delivered := prometheus.NewCounter(counterOpts("events_delivered_total",
		"Events acknowledged by the broker (sent, with RequiredAcks none)."))
	dropped := prometheus.NewCounterVec(counterOpts("events_dropped_total",
		"Events that Emit refused, by reason: queue_full, closed, invalid."), []string{"reason"})
	failed := prometheus.NewCounterVec(counterOpts("events_failed_total",
		"Queued events that were not delivered, by reason: write (every attempt failed or the broker was unreachable), "+
			"closed (cut off by the deadline of Close)."), []string{"reason"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "batch_write_duration_seconds",
		Help:    "Time from handing frames to the Kafka writer until their partition batch was acknowledged or failed.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
	})
	frameEvents := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name:    "frame_events",
		Help:    "Events per frame sealed (one Kafka message each).",
		Buckets: prometheus.ExponentialBuckets(1, 4, 9), // 1 to 65,536
	})
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "queue_length", Help: "Events waiting in the producer queue.",
	}, func() float64 { return float64(p.queue.len()) })
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem,
		Name: "in_flight_events", Help: "Events handed to the Kafka writer, in frames, without an outcome yet.",
	}, func() float64 { return float64(p.inflight.Load()) })
	framesDelivered := prometheus.NewCounter(counterOpts("frames_delivered_total",
		"Frames acknowledged by the broker; events_delivered_total counts their events."))
	retried := prometheus.NewCounter(counterOpts("events_retried_total",
		"Events of failed writes kept, in whole frames, to be sent again once the broker answers "+
			"(each is later counted delivered or failed)."))
	pauses := prometheus.NewCounter(counterOpts("pauses_total",
		"Times the producer paused because a write failed, or the topic's partitions could not be learnt, "+
			"until a probe of the broker succeeded."))
	retryLen := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "retry_length", Help: "Events of failed writes, in whole frames, waiting to be sent again."})
	paused := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "paused", Help: "1 while the producer waits for a failing broker to answer; events wait in the queue."})
	return producerMetrics{
		retried:         retried,
		pauses:          pauses,
		framesDelivered: framesDelivered,
		retryLen:        retryLen,
		paused:          paused,
		emitted:         emitted,
		sampledOut:      sampled,
		delivered:       delivered,
		droppedFull:     dropped.WithLabelValues("queue_full"),
		droppedClosed:   dropped.WithLabelValues("closed"),
		droppedInvalid:  dropped.WithLabelValues("invalid"),
		failedWrite:     failed.WithLabelValues("write"),
		failedClosed:    failed.WithLabelValues("closed"),
		latency:         latency,
		frameEvents:     frameEvents,
		collectors: []prometheus.Collector{emitted, sampled, delivered, dropped, failed, latency, frameEvents,
			queue, inflight, framesDelivered, retried, pauses, retryLen, paused},
	}
}

type consumerMetrics struct {
	consumed, decodeErrors, commitErrors, applyErrors, fetchErrors prometheus.Counter
	framesConsumed, duplicateFrames, duplicateEvents               prometheus.Counter
	refusedUnsigned, refusedBadMAC                                 prometheus.Counter
	lag                                                            *prometheus.GaugeVec
	collectors                                                     []prometheus.Collector
}

func newConsumerMetrics() consumerMetrics {
	refused := prometheus.NewCounterVec(counterOpts("messages_refused_total",
		"Messages dropped unread because the consumer has an events key and they are not frames signed with it, by reason: "+
			"unsigned (a single event, or a frame without a MAC), bad_mac (a MAC that does not match: another key, "+
			"altered bytes, or a frame moved to another partition)."), []string{"reason"})
	m := consumerMetrics{
		refusedUnsigned: refused.WithLabelValues("unsigned"),
		refusedBadMAC:   refused.WithLabelValues("bad_mac"),
		consumed:        prometheus.NewCounter(counterOpts("events_consumed_total", "Events decoded and accepted by apply.")),
		decodeErrors:    prometheus.NewCounter(counterOpts("decode_errors_total", "Messages skipped because they did not decode as an event or a frame.")),
		commitErrors:    prometheus.NewCounter(counterOpts("commit_errors_total", "Offset commits that failed (their events may be replayed).")),
		applyErrors:     prometheus.NewCounter(counterOpts("apply_errors_total", "Batches that apply refused, ending Run.")),
		fetchErrors:     prometheus.NewCounter(counterOpts("fetch_errors_total", "Errors of the consumer group reported by fetches; the reader retries.")),
		framesConsumed: prometheus.NewCounter(counterOpts("frames_consumed_total",
			"Frames decoded and accepted by apply (messages of one event without a frame are not counted).")),
		duplicateFrames: prometheus.NewCounter(counterOpts("duplicate_frames_total",
			"Frames dropped because a frame of the same edge, partition and sequence number was already read.")),
		duplicateEvents: prometheus.NewCounter(counterOpts("duplicate_events_total",
			"Events of the frames dropped as duplicates, not handed to apply.")),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name: "consumer_lag_messages",
			Help: "Messages (frames or single events) behind the partition's high watermark at the last message consumed from it.",
		}, []string{"partition"}),
	}
	m.collectors = []prometheus.Collector{m.consumed, m.decodeErrors, m.commitErrors, m.applyErrors, m.fetchErrors,
		m.framesConsumed, m.duplicateFrames, m.duplicateEvents, refused, m.lag}
	return m
}

// register registers cs with reg (nil: nothing), all or none.
func register(reg prometheus.Registerer, cs []prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}
