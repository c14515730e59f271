package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// TestSizingFlood measures BENCHMARKS.md's aggregator figures: the
// aggregator binary (built as deployed, without the race detector), at its
// default flags, consumes a backlog of POPLIMIT_SIZING_EVENTS events
// (default 2,400,000) of clients choosing random keys, 1.2 M unique keys
// then the same keys again, from a broker in this process: its peak RSS,
// and the events it judged per second of its own CPU time. With
// POPLIMIT_SIZING_GLOBAL=1 the keys are of a global rule (the judge and
// the global tally both hold them). POPLIMIT_SIZING_PROFILE=file writes a
// CPU profile of the aggregator's first 20 s there.
//
//	POPLIMIT_SIZING=1 go test -count=1 -run TestSizingFlood -v ./cmd/aggregator
//	POPLIMIT_SIZING=1 POPLIMIT_SIZING_GLOBAL=1 go test -count=1 -run TestSizingFlood -v ./cmd/aggregator
func TestSizingFlood(t *testing.T) {
	if os.Getenv("POPLIMIT_SIZING") == "" {
		t.Skip("POPLIMIT_SIZING=1 measures BENCHMARKS.md's sizing figures")
	}
	total := 2_400_000
	if v := os.Getenv("POPLIMIT_SIZING_EVENTS"); v != "" {
		total, _ = strconv.Atoi(v)
	}
	isGlobal := os.Getenv("POPLIMIT_SIZING_GLOBAL") != ""
	_, addr := testenv.Broker(t, 0, 8, pipeline.DefaultTopic, global.DefaultTopic)

	pc := pipeline.DefaultProducerConfig()
	pc.Brokers, pc.Topic = []string{addr}, pipeline.DefaultTopic
	p, err := pipeline.NewProducer(pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := total / 2
	began := time.Now()
	for i := range total {
		k := i % keys
		e := event.Event{Time: time.Now().UnixNano(), KeyHash: uint64(k)*0x9E3779B97F4A7C15 + 1,
			Rule: []byte("api"), Pop: []byte("pop-a"), Global: isGlobal, Cost: 1, Limit: 100, WindowMillis: 60_000,
			Edge: uint16(1 + k%4), Decision: event.Allowed, Estimate: 1}
		for !p.Emit(&e) {
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err = p.Close(ctx)
	cancel()
	if err != nil {
		t.Fatalf("Producer.Close: %v (every event delivered)", err)
	}
	t.Logf("produced %d events in %v", total, time.Since(began).Round(time.Millisecond))

	bin := testenv.Command(t, "aggregator")
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	args := []string{"-brokers", addr, "-listen", listen, "-log-level", "warn"}
	if !isGlobal {
		args = append(args, "-global-interval", "0")
	}
	if os.Getenv("POPLIMIT_SIZING_PROFILE") != "" {
		args = append(args, "-pprof")
	}
	cmd := exec.Command(bin, args...)
	// The aggregator's own limit, as at the defaults, unless
	// POPLIMIT_SIZING_GOMEMLIMIT gives one.
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+os.Getenv("POPLIMIT_SIZING_GOMEMLIMIT"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	began = time.Now()
	if out := os.Getenv("POPLIMIT_SIZING_PROFILE"); out != "" {
		// A CPU profile of the first 20 s, for where the time goes.
		go func() {
			time.Sleep(500 * time.Millisecond)
			resp, err := http.Get("http://" + listen + "/debug/pprof/profile?seconds=20")
			if err != nil {
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(out)
			if err != nil {
				return
			}
			defer f.Close()
			_, _ = f.ReadFrom(resp.Body)
		}()
	}
	testenv.WaitFor(t, 10*time.Minute, "the backlog judged", func() bool {
		return scrapeValue(listen, "poplimit_aggregator_events_total") >= float64(total) &&
			scrapeValue(listen, "poplimit_aggregator_buffered_events") == 0
	})
	wall := time.Since(began)
	cpu := cpuSeconds(t, cmd.Process.Pid)
	hwm := statusKiB(t, cmd.Process.Pid, "VmHWM")
	t.Logf("global=%v GOMEMLIMIT=%q: %d events judged in %v wall, %.1f s CPU: %.0f events per CPU-second; RSS peak %.0f MiB; keys %v, evicted max_keys %v, tally dropped %v",
		isGlobal, os.Getenv("POPLIMIT_SIZING_GOMEMLIMIT"), total, wall.Round(time.Millisecond), cpu, float64(total)/cpu, float64(hwm)/1024,
		scrapeValue(listen, "poplimit_aggregator_keys"), scrapeValue(listen, `poplimit_aggregator_keys_evicted_total{reason="max_keys"}`),
		scrapeValue(listen, "poplimit_aggregator_global_tally_dropped_events_total"))
}

// scrapeValue returns the value of the series named exactly series (name
// and labels, as exposed) on addr's /metrics, or -1.
func scrapeValue(addr, series string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// cpuSeconds returns the user + system CPU time of process pid.
func cpuSeconds(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64) // utime, field 14
	st, _ := strconv.ParseFloat(f[12], 64) // stime, field 15
	return (ut + st) / 100                 // USER_HZ
}

// statusKiB reads a field (VmRSS, VmHWM) of /proc/pid/status, in KiB.
func statusKiB(t *testing.T, pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
