package aggregator

import (
	"io"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
)

// heapInUse returns the heap in use after two collections: the live heap,
// what the documented bound is about (GOMEMLIMIT bounds the garbage).
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestMemoryBoundUnderFlood floods a real aggregator, through a real
// producer and broker, with the events of clients choosing random keys of a
// global rule: 1.2 x -max-keys unique keys, then the same keys again (at
// the defaults, 1.2 M + 1.2 M events). With its bounds scaled down 128
// times, the aggregator's heap after the flood stays within the bound it
// documents for those flags, and what did not fit is counted.
func TestMemoryBoundUnderFlood(t *testing.T) {
	cfg := testConfig(t)
	const scale = 128
	cfg.Judge.MaxKeys = (1 << 20) / scale
	cfg.Judge.MaxLogEntries = (1 << 24) / scale
	cfg.Judge.MaxBuffered = (1 << 20) / scale
	cfg.Judge.Dedup = (1 << 18) / scale
	cfg.Judge.MaxWrongKeys = 10000 / scale
	cfg.Consumer.DedupFrames = (1 << 18) / scale
	cfg.GlobalInterval = time.Hour // the tally counts; nothing is published during the test
	cfg.GlobalTopic = global.DefaultTopic
	cfg.GlobalMaxKeys = (1 << 18) / scale
	_, addr := testenv.Broker(t, 0, 4, topic, "idle", global.DefaultTopic)
	cfg.Brokers = []string{addr}

	// The flood, produced before the aggregator starts, so that the
	// broker's log is in the baseline.
	keys := cfg.Judge.MaxKeys * 12 / 10
	p := newProducer(t, cfg.Brokers)
	now := time.Now().UnixNano()
	for pass := range 2 {
		for k := range keys {
			e := event.Event{Time: now + int64(pass*keys+k)*int64(time.Microsecond), KeyHash: uint64(k)*0x9E3779B97F4A7C15 + 1,
				Rule: []byte("api"), Pop: []byte("pop-a"), Global: true, Cost: 1, Limit: 100, WindowMillis: 60_000,
				Edge: 1, Decision: event.Allowed, Estimate: 1}
			for !p.Emit(&e) {
				time.Sleep(time.Millisecond) // the queue is full: the producer is writing
			}
		}
	}
	closeProducer(t, p)
	total := int64(2 * keys)

	// What the aggregator holds with no event: the fixed part of the
	// bound, measured apart so that the scaled parts are checked alone
	// (the consumer's queue of fetched messages is empty once the flood
	// is consumed, and bounded apart).
	idle := cfg
	idle.Consumer.Topic, idle.Consumer.GroupID = "idle", "idle"
	before := heapInUse()
	a := startAggregator(t, idle)
	time.Sleep(time.Second) // its consumer joins its group and fetches
	fixed := heapInUse() - before
	stopAggregator(t, a)

	before = heapInUse()
	a = startAggregator(t, cfg)
	testenv.WaitFor(t, 40*time.Second, "the flood consumed", func() bool {
		return testenv.MetricSum(t, a.reg, "poplimit_aggregator_events_total") >= float64(total)
	})
	used := heapInUse() - before
	bound := cfg.MemoryBound() - fixedBytes - int64(cfg.Consumer.QueueCapacity)*maxMessageBytes - int64(cfg.Consumer.MaxBytes)
	tallied, _ := a.tally.Keys()
	t.Logf("heap with no event: %d KiB (documented %d KiB); after the flood: %d KiB beyond it, bound %d KiB; judge keys %v, tally keys %d",
		fixed>>10, fixedBytes>>10, (used-fixed)>>10, bound>>10, testenv.MetricSum(t, a.reg, "poplimit_aggregator_keys"), tallied)
	if fixed > fixedBytes {
		t.Errorf("heap in use with no event: %d KiB, over the documented %d KiB", fixed>>10, fixedBytes>>10)
	}
	if used-fixed > bound {
		t.Errorf("heap in use after %d events of %d keys: %d KiB beyond the fixed part, over the bound of %d KiB",
			total, keys, (used-fixed)>>10, bound>>10)
	}
	if ev := testenv.MetricSum(t, a.reg, "poplimit_aggregator_keys_evicted_total", "reason", "max_keys"); ev < float64(keys-cfg.Judge.MaxKeys) {
		t.Errorf("keys evicted for max_keys: got %v, want at least %d", ev, keys-cfg.Judge.MaxKeys)
	}
	if d := testenv.MetricSum(t, a.reg, "poplimit_aggregator_global_tally_dropped_events_total"); d < float64(2*(keys-cfg.GlobalMaxKeys)) {
		t.Errorf("global tally: dropped events %v, want at least %d (keys past -global-max-keys)", d, 2*(keys-cfg.GlobalMaxKeys))
	}
	stopAggregator(t, a)
	runtime.KeepAlive(a)
}

// TestSoftMemoryLimit checks that the aggregator sets the Go runtime's soft
// memory limit from its bound when GOMEMLIMIT is unset (the default GOGC
// alone lets garbage double the heap: 1.5 GiB of RSS under a flood whose
// state fitted 1 GiB), and leaves GOMEMLIMIT's when it is set.
func TestSoftMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	var cfg Config // the defaults, as the command's flags are
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	t.Setenv("GOMEMLIMIT", "")
	debug.SetMemoryLimit(math.MaxInt64)
	SetMemoryLimit(cfg, log)
	want := memoryLimit(cfg.MemoryBound())
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Errorf("without GOMEMLIMIT: soft limit %d, want %d (the bound %d plus an eighth)", got, want, cfg.MemoryBound())
	}
	if want > 1200<<20 {
		t.Errorf("soft limit at the defaults %d MiB: over the documented 1,137 MiB", want>>20)
	}

	t.Setenv("GOMEMLIMIT", "1800MiB")
	debug.SetMemoryLimit(1800 << 20) // as the runtime read it at start
	SetMemoryLimit(cfg, log)
	if got := debug.SetMemoryLimit(-1); got != 1800<<20 {
		t.Errorf("with GOMEMLIMIT=1800MiB: soft limit %d, want it left", got)
	}
}
