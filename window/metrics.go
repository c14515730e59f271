package window

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	storeOps       prometheus.Counter
	storeErrors    prometheus.Counter
	storeReads     prometheus.Counter
	fallbackOpen   prometheus.Counter
	fallbackClosed prometheus.Counter
	shareHeld      prometheus.Counter // decisions held to the key's share while the store is split
	nearSyncs      prometheus.Counter // async decisions made by a round trip near the limit
	pendingDropped prometheus.Counter
	evictions      prometheus.Counter
	flushOps       prometheus.Histogram
	flushSeconds   prometheus.Histogram
	flushBackoffs  prometheus.Counter
	syncCalls      prometheus.Histogram
	flusherParks   prometheus.Counter
	newKeyRead     prometheus.Counter // waits that ended with the read (or its failure)
	newKeyTimeout  prometheus.Counter // waits that ended with NewKeyWait
}

func newMetrics(reg prometheus.Registerer, l *Limiter) (*metrics, error) {
	const ns, sub = "poplimit", "window"
	fallbacks := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "fallbacks_total", Help: "Decisions made by a rule's failure policy because the store failed, by policy."}, []string{"policy"})
	waits := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "new_key_waits_total", Help: "Requests that waited for the shared count of a key new to this edge, by outcome: read (it came, or the store failed) or timeout."}, []string{"result"})
	m := &metrics{
		newKeyRead:    waits.WithLabelValues("read"),
		newKeyTimeout: waits.WithLabelValues("timeout"),
		storeOps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "store_ops_total", Help: "Store operations sent by the limiter (flushes, reads, sync decisions)."}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "store_errors_total", Help: "Store operations that failed."}),
		storeReads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "window_reads_total", Help: "Reads of a key's window counts: its previous window, once per key per window unless its units were this edge's alone or it is new here with one unit in the window, and its current one when it is new here and has no increment to send."}),
		fallbackOpen:   fallbacks.WithLabelValues("open"),
		fallbackClosed: fallbacks.WithLabelValues("closed"),
		nearSyncs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "near_limit_syncs_total", Help: "Async decisions made by one store round trip because the units the other edges may have admitted since this edge's last reply could fill the key's room (unless -async-near-limit)."}),
		shareHeld: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "share_held_total", Help: "Decisions of a key counted by this edge alone while the store was split (a shard ejected), decided against this edge's share of its limit."}),
		pendingDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "pending_dropped_total", Help: "Counted units never delivered to the store (evicted or too old to matter)."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "evictions_total", Help: "Local key views evicted because the key table was full."}),
		flushOps: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "flush_ops", Help: "Store operations per flush batch (a flush sends at most MaxFlushOps at a time).", Buckets: prometheus.ExponentialBuckets(1, 4, 9)}),
		flushBackoffs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "flush_backoffs_total", Help: "Flushes whose every operation failed, after which the flusher waited longer."}),
		flusherParks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "flusher_parks_total", Help: "Times the flusher found nothing to flush and slept until an entry was queued."}),
		syncCalls: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "sync_call_requests", Help: "Sync requests to the store (a decision's increment, a refusal's take-back) per store call: those that wait while the limiter's calls are all in flight share the next one.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "flush_duration_seconds", Help: "Time one flush batch waited for the store.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14)}),
	}
	if reg == nil {
		return m, nil
	}
	keys := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "keys", Help: "Keys with a local view in the limiter."}, func() float64 { return float64(l.Keys()) })
	split := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "store_split", Help: "1 while a part of the store is out and its keys are counted on another (a memcached shard ejected), else 0."}, func() float64 {
		if l.split.Load() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{m.storeOps, m.storeErrors, m.storeReads, fallbacks, m.pendingDropped, m.evictions, m.flushOps, m.flushSeconds, m.flushBackoffs, m.syncCalls, m.flusherParks, waits, keys, split, m.shareHeld, m.nearSyncs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// durationOf converts nanoseconds to a Duration.
func durationOf(ns int64) time.Duration { return time.Duration(ns) }
