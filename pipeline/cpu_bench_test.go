//go:build linux

package pipeline_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/policy"
)

const brokerProcessEnv = "POPLIMIT_PIPELINE_BROKER_PROCESS"

// TestBrokerProcess is the broker of BenchmarkProducerCPU, run in a process
// of its own so that the benchmark's CPU time is the producer's alone: the
// test binary runs itself with brokerProcessEnv set. It prints the broker's
// address and serves until its standard input closes (the benchmark ended,
// or died) or ten minutes passed. Otherwise it is skipped.
func TestBrokerProcess(t *testing.T) {
	if os.Getenv(brokerProcessEnv) == "" {
		t.Skip("the broker process of BenchmarkProducerCPU")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Println(c.ListenAddrs()[0])
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
	}
}

// brokerProcess starts TestBrokerProcess and returns its broker's address;
// the process stops when the benchmark ends.
func brokerProcess(b *testing.B) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), brokerProcessEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			line <- strings.TrimSpace(s.Text())
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case addr, ok := <-line:
		if !ok || addr == "" {
			b.Fatal("the broker process printed no address")
		}
		return addr
	case <-time.After(30 * time.Second):
		b.Fatal("the broker process did not start within 30s")
	}
	return ""
}

// written returns the bytes this process has written with system calls
// (wchar of /proc/self/io): in the benchmark, what it sent to the broker.
func written(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no wchar in /proc/self/io")
	return 0
}

// cpuTime returns the CPU time this process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProducerCPU measures the producer's CPU time per decision event:
// Emit from one goroutine, framing, encoding, kafka-go's batching,
// compression and produce requests, and the garbage collector, everything
// this process does between the first Emit and the return of Close, which
// waits for every event to be acknowledged, divided by the events
// (cpu-ns/event); sent-B/event is what it wrote to the broker. The broker
// runs in another process. "frames" is the default configuration;
// "frames-signed" signs each frame with an events key (one HMAC-SHA256 per
// frame); "message-per-event" sends each event in a message of its own, as
// the producer did before frames. The cases not "paced" emit as fast as the
// producer takes events; the paced ones emit at a rate, in bursts every
// millisecond, and include what pacing costs alone ("pacing-only", no
// producer: the Go scheduler's wake-ups from sleep), to be subtracted.
//
//	go test -run '^$' -bench 'ProducerCPU/^(frames|message)' -benchtime 1000000x ./pipeline/
//	go test -run '^$' -bench 'ProducerCPU/^paced' -benchtime 200000x ./pipeline/
//
// On a shared machine, run each case in a process of its own, several
// times, interleaved: a case's figure moves by a third with the machine's
// load and with its position in one run.
func BenchmarkProducerCPU(b *testing.B) {
	perEvent := func(c *pipeline.ProducerConfig) { c.FrameEvents, c.FrameBytes = 1, 512 }
	cases := []struct {
		name string
		rate int // events per second, in bursts every millisecond; 0: as fast as the producer takes them
		mod  func(*pipeline.ProducerConfig)
	}{
		{"frames", 0, func(*pipeline.ProducerConfig) {}},
		{"frames-signed", 0, func(c *pipeline.ProducerConfig) { c.Key = make([]byte, pipeline.MinKeyLen) }},
		{"frames-snappy", 0, func(c *pipeline.ProducerConfig) { c.Compression = kafka.Snappy }},
		{"frames-zstd", 0, func(c *pipeline.ProducerConfig) { c.Compression = kafka.Zstd }},
		{"frames-uncompressed", 0, func(c *pipeline.ProducerConfig) { c.Compression = 0 }},
		{"message-per-event", 0, perEvent},
		{"paced-20k-frames", 20_000, func(*pipeline.ProducerConfig) {}},
		{"paced-20k-frames-signed", 20_000, func(c *pipeline.ProducerConfig) { c.Key = make([]byte, pipeline.MinKeyLen) }},
		{"paced-20k-message-per-event", 20_000, perEvent},
		{"paced-20k-frames-100ms", 20_000, func(c *pipeline.ProducerConfig) { c.BatchTimeout = 100 * time.Millisecond }},
		{"paced-20k-frames-50ms", 20_000, func(c *pipeline.ProducerConfig) { c.BatchTimeout, c.BatchSize = 50*time.Millisecond, 4096 }},
		{"paced-20k-pacing-only", -20_000, nil},
		{"paced-200k-frames", 200_000, func(*pipeline.ProducerConfig) {}},
		{"paced-200k-message-per-event", 200_000, perEvent},
		{"paced-200k-pacing-only", -200_000, nil},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			if tc.rate < 0 {
				benchmarkPacingCPU(b, -tc.rate)
				return
			}
			addr := brokerProcess(b)
			cfg := pipeline.DefaultProducerConfig()
			cfg.Brokers, cfg.Topic = []string{addr}, "events"
			tc.mod(&cfg)
			benchmarkProducerCPU(b, cfg, tc.rate)
		})
	}
}

func benchmarkProducerCPU(b *testing.B, cfg pipeline.ProducerConfig, rate int) {
	reg := prometheus.NewRegistry()
	p, err := pipeline.NewProducer(cfg, reg)
	if err != nil {
		b.Fatal(err)
	}
	p.Emit(&event.Event{Rule: []byte("warm-up")})
	testenv.WaitFor(b, 20*time.Second, "the producer to reach the broker", func() bool {
		return producerOutcomes(b, reg).delivered == 1
	})
	// Decisions as an edge emits them: one rule, 100,000 clients, time
	// advancing.
	rule := []byte("api-per-key")
	e := event.Event{Rule: rule, Cost: 1, Limit: 100, Burst: 100, WindowMillis: 60_000, Edge: 1,
		Algorithm: policy.SlidingWindow}
	t0 := time.Now().UnixNano()
	runtime.GC()
	waits := 0
	b.ReportAllocs()
	start, cpu0, wrote0 := time.Now(), cpuTime(b), written(b)
	b.ResetTimer()
	burst := rate / 1000
	next := time.Now()
	for i := range b.N {
		if burst > 0 && i%burst == 0 {
			next = next.Add(time.Millisecond)
			time.Sleep(time.Until(next))
		}
		e.KeyHash = uint64(i%100_000)*0x9e3779b97f4a7c15 + 1
		e.Time = t0 + int64(i)*1000
		e.Estimate = float32(i % 101)
		e.Decision = event.Admission(i % 7 / 6)
		for !p.Emit(&e) { // measure the cost of delivering every event, not of dropping
			waits++
			time.Sleep(20 * time.Microsecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpu, wall, wrote := cpuTime(b)-cpu0, time.Since(start), written(b)-wrote0
	o := producerOutcomes(b, reg)
	if o.delivered != float64(b.N+1) || o.failed != 0 {
		b.Fatalf("outcomes: got %+v, want %d delivered and none failed", o, b.N+1)
	}
	frames := testenv.MetricSum(b, reg, "poplimit_pipeline_frames_delivered_total")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64(b.N)/wall.Seconds(), "events/s")
	b.ReportMetric(float64(b.N+1)/frames, "events/frame")
	b.ReportMetric(float64(wrote)/float64(b.N), "sent-B/event")
	b.ReportMetric(float64(waits)/float64(b.N), "full-waits/event")
}

// benchmarkPacingCPU measures what the paced cases spend pacing alone.
func benchmarkPacingCPU(b *testing.B, rate int) {
	burst := rate / 1000
	cpu0 := cpuTime(b)
	next := time.Now()
	for i := range b.N {
		if i%burst == 0 {
			next = next.Add(time.Millisecond)
			time.Sleep(time.Until(next))
		}
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/event")
}
