package deploy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

// The sizing figures of BENCHMARKS.md ("Sizing") that concern memcached
// and nutcracker. They take a GiB of memory and tens of seconds, so they
// run only with POPLIMIT_SIZING=1:
//
//	POPLIMIT_SIZING=1 go test -count=1 -run TestSizing -v ./deploy

func sizingOnly(t *testing.T) {
	if os.Getenv("POPLIMIT_SIZING") == "" {
		t.Skip("POPLIMIT_SIZING=1 measures BENCHMARKS.md's sizing figures")
	}
}

// startProc starts name with args and stops it at cleanup; it waits for
// addr to accept.
func startProc(t *testing.T, addr, name string, args ...string) *exec.Cmd {
	t.Helper()
	if name == "memcached" && os.Geteuid() == 0 {
		args = append(args, "-u", "root") // memcached refuses root without -u
	}
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.WaitFor(t, 10*time.Second, name+" accepting", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return cmd
}

// procKiB reads a field (VmRSS, VmHWM) of /proc/pid/status, in KiB.
func procKiB(t *testing.T, pid int, field string) int64 {
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

// procCPU returns the user + system CPU seconds of process pid.
func procCPU(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// memcachedStats returns memcached's "stats" at addr.
func memcachedStats(t *testing.T, addr string) map[string]int64 {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "stats\r\n")
	r := bufio.NewReader(c)
	st := map[string]int64{}
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		l = strings.TrimSpace(l)
		if l == "END" {
			return st
		}
		if f := strings.Fields(l); len(f) == 3 {
			st[f[1]], _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
}

// TestSizingMemcachedCountersPerGiB fills a memcached of -m 1024 -M (the
// units' and manifests' flags) with counters named as the edges name them
// (shardproxy.AppendCounterKey: a key hash and a window start) holding a
// small count, until it refuses more: the counters one GiB of item memory
// holds, and the RSS that takes.
func TestSizingMemcachedCountersPerGiB(t *testing.T) {
	sizingOnly(t)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := startProc(t, addr, "memcached", "-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "1024", "-M", "-c", "4096", "-t", "4")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Drain the replies (errors once full) so that memcached never blocks.
	go func() {
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	w := bufio.NewWriterSize(c, 1<<20)
	start := time.Now().Truncate(time.Minute).UnixMilli()
	var key []byte
	var written, last int64
	for round := 0; ; round++ {
		for range 200_000 {
			written++
			key = shardproxy.AppendCounterKey(key[:0], uint64(written)*0x9E3779B97F4A7C15, start)
			fmt.Fprintf(w, "add %s 0 600 2 noreply\r\n12\r\n", key)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		st := memcachedStats(t, addr)
		if st["curr_items"] == last {
			rss := procKiB(t, cmd.Process.Pid, "VmRSS")
			t.Logf("full: %d counters (key %d bytes, e.g. %s) in -m %d MiB: %.2f M counters per GiB of item memory; "+
				"bytes %d, total_malloced %d, hash_bytes %d; RSS %.0f MiB after %d writes",
				st["curr_items"], len(key), key, st["limit_maxbytes"]>>20, float64(st["curr_items"])/1e6*float64(1<<30)/float64(st["limit_maxbytes"]),
				st["bytes"], st["total_malloced"], st["hash_bytes"], float64(rss)/1024, written)
			return
		}
		last = st["curr_items"]
		if round > 200 {
			t.Fatalf("memcached still taking counters after %d", written)
		}
	}
}

// TestSizingNutcrackerRSS drives a nutcracker configured as
// deploy/systemd/nutcracker.yml (in front of three memcached shards) with
// connections each pipelining 64 incr and get of counters at a time, for
// 10 s: its peak RSS by the requests in flight, the operations per second
// it passed, and the operations the shards answered per second of their
// CPU.
func TestSizingNutcrackerRSS(t *testing.T) {
	sizingOnly(t)
	var servers []string
	var shards []*exec.Cmd
	for range 3 {
		port := testenv.FreePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		shards = append(shards, startProc(t, addr, "memcached", "-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-M", "-c", "4096"))
		servers = append(servers, addr)
	}
	port := testenv.FreePort(t)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	conf := fmt.Sprintf(`poplimit:
  listen: %s
  hash: fnv1a_64
  hash_tag: "{}"
  distribution: ketama
  timeout: 100
  preconnect: true
  auto_eject_hosts: true
  server_failure_limit: 3
  server_retry_timeout: 5000
  servers:
    - %s:1
    - %s:1
    - %s:1
`, listen, servers[0], servers[1], servers[2])
	path := filepath.Join(t.TempDir(), "nutcracker.yml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ conns, depth int }{{16, 64}, {64, 64}, {128, 64}} {
		nc := startProc(t, listen, "nutcracker", "-c", path, "-s", strconv.Itoa(testenv.FreePort(t)), "-a", "127.0.0.1", "-v", "1")
		shardCPU := func() (s float64) {
			for _, c := range shards {
				s += procCPU(t, c.Process.Pid)
			}
			return s
		}
		cpu0 := shardCPU()
		ops, errs := driveCounters(t, listen, tc.conns, tc.depth, 10*time.Second)
		cpu := shardCPU() - cpu0
		t.Logf("nutcracker, %d connections x %d in flight (%d): %.0f ops/s, RSS peak %.1f MiB; memcached: %.0f ops per CPU-second (%.1f s CPU, 3 shards); errors %d",
			tc.conns, tc.depth, tc.conns*tc.depth, float64(ops)/10, float64(procKiB(t, nc.Process.Pid, "VmHWM"))/1024, float64(ops)/cpu, cpu, errs)
		if float64(errs) > 0.01*float64(ops) {
			t.Errorf("%d of %d operations answered with an error (nutcracker's timeout, 100 ms): the figures are of an overload", errs, ops)
		}
		_ = nc.Process.Kill()
		_ = nc.Wait()
	}
}

// driveCounters runs conns connections to addr, each pipelining depth incr
// and get of counters at a time, for d, and returns the operations answered,
// and those answered with an error.
func driveCounters(t *testing.T, addr string, conns, depth int, d time.Duration) (int64, int64) {
	var ops, errs atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			r, w := bufio.NewReader(c), bufio.NewWriter(c)
			start := time.Now().Truncate(time.Minute).UnixMilli()
			var key []byte
			for n := uint64(0); time.Now().Before(stop); {
				for range depth {
					n++
					key = shardproxy.AppendCounterKey(key[:0], (uint64(i)<<32|n%100_000)*0x9E3779B97F4A7C15, start)
					if n%2 == 0 {
						fmt.Fprintf(w, "incr %s 1\r\n", key)
					} else {
						fmt.Fprintf(w, "get %s\r\n", key)
					}
				}
				if w.Flush() != nil {
					return
				}
				for range depth {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.Contains(l, "ERROR") {
						errs.Add(1)
					}
					for strings.HasPrefix(l, "VALUE") { // a hit: its data, then END
						r.ReadString('\n')
						l, _ = r.ReadString('\n')
					}
				}
				ops.Add(int64(depth))
			}
		}()
	}
	wg.Wait()
	return ops.Load(), errs.Load()
}
