package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/judge"
)

// TestMain removes the commands the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveCommands()
	os.Exit(code)
}

// binary returns the path of cmd/<name>, built once per test binary
// without the race detector: the processes are measured as deployed.
func binary(t testing.TB, name string) string { return testenv.Command(t, name) }

// lockedBuffer is a process's output, safe for concurrent use.
type lockedBuffer = testenv.LockedBuffer

// process is a command started by a test; it is killed at cleanup if still
// running.
type process struct {
	name string
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan struct{}
	err  error // after done
}

func startProcess(t testing.TB, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: filepath.Base(bin), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// stop sends sig and waits up to d for the process to exit.
func (p *process) stop(t testing.TB, sig syscall.Signal, d time.Duration) error {
	t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		t.Fatalf("%s did not exit within %v of %v; output:\n%s", p.name, d, sig, p.out.String())
		return nil
	}
}

// waitLog waits up to d for a line of the output to match re and returns
// the submatches of the first that does.
func (p *process) waitLog(t testing.TB, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, p.err, re, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v:\n%s", p.name, re, d, p.out.String())
		}
	}
}

var edgeStarted = regexp.MustCompile(`msg="edge: started" listen=(\S+) admin=(\S+)`)

// edgeProc is a running cmd/edge.
type edgeProc struct {
	*process
	addr, admin string
}

// startEdgeProc runs cmd/edge with args (-listen and -admin are added, on
// free ports) and waits until it serves.
func startEdgeProc(t testing.TB, args ...string) *edgeProc {
	t.Helper()
	args = append([]string{"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...)
	p := startProcess(t, binary(t, "edge"), args...)
	m := p.waitLog(t, edgeStarted, 30*time.Second)
	return &edgeProc{process: p, addr: m[1], admin: m[2]}
}

// metrics scrapes the edge's /metrics.
func (e *edgeProc) metrics(t testing.TB) metricSet {
	t.Helper()
	return scrape(t, "http://"+e.admin+"/metrics")
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

type metricSet []sample

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape fetches and parses a Prometheus text exposition.
func scrape(t testing.TB, url string) metricSet {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	var ms metricSet
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sampleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		s := sample{name: m[1], labels: map[string]string{}, value: v}
		for _, lp := range labelPair.FindAllStringSubmatch(m[2], -1) {
			s.labels[lp[1]] = lp[2]
		}
		ms = append(ms, s)
	}
	return ms
}

// sum returns the sum of the samples of name whose labels include the
// pairs in labels ("k", "v", …).
func (ms metricSet) sum(name string, labels ...string) float64 {
	var total float64
next:
	for _, s := range ms {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// procStatus reads a field of /proc/PID/status in kB (VmRSS, VmHWM).
func procStatus(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// openFDs counts the open file descriptors of a process.
func openFDs(t testing.TB, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

var aggStarted = regexp.MustCompile(`msg="aggregator: started" listen=(\S+)`)

// aggProc is a running cmd/aggregator.
type aggProc struct {
	*process
	addr string
}

// startAggregatorProc runs cmd/aggregator with args (-listen is added) and
// waits until it serves.
func startAggregatorProc(t testing.TB, args ...string) *aggProc {
	t.Helper()
	args = append([]string{"-listen", "127.0.0.1:0"}, args...)
	p := startProcess(t, binary(t, "aggregator"), args...)
	m := p.waitLog(t, aggStarted, 30*time.Second)
	return &aggProc{process: p, addr: m[1]}
}

// report fetches the aggregator's /report (flush: judge what is buffered
// first).
func (a *aggProc) report(t testing.TB, flush bool) judge.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := "http://" + a.addr + "/report"
	if flush {
		u += "?flush=1"
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("aggregator report: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r judge.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("aggregator report %q: %v", b, err)
	}
	return r
}

// logField returns the integer value of key=N in the last line of s that
// contains marker.
func logField(s, marker, key string) (int64, bool) {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], marker) {
			continue
		}
		for _, f := range strings.Fields(lines[i]) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}
