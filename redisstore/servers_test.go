package redisstore

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// This file starts the real servers the tests need: standalone redis-server
// processes and a three-master Redis Cluster, all on loopback ports picked
// here, without persistence, each stopped in t.Cleanup.

// redisArgs are the arguments every test server gets: loopback only, no
// RDB snapshots, no AOF, no daemon.
func redisArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--loglevel", "warning",
	}
}

// startRedis starts a standalone redis-server (testenv.Redis).
func startRedis(t testing.TB, extra ...string) *testenv.Proc {
	t.Helper()
	return testenv.Redis(t, extra...)
}

// redisCLI runs redis-cli with args, bounded by timeout, and returns its
// output.
func redisCLI(t testing.TB, timeout time.Duration, args ...string) string {
	t.Helper()
	bin := testenv.LookBinary(t, "redis-cli", "redis-tools")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// startCluster starts a Redis Cluster of n masters without replicas on free
// loopback ports, creates it with redis-cli --cluster create, waits until
// every node reports cluster_state:ok, and returns the nodes.
func startCluster(t testing.TB, n int) []*testenv.Proc {
	t.Helper()
	bin := testenv.LookBinary(t, "redis-server", "redis-server")
	nodes := make([]*testenv.Proc, n)
	addrs := make([]string, n)
	for i := range nodes {
		var last error
		for try := 0; try < 3; try++ {
			port := testenv.FreePort(t)
			dir := t.TempDir()
			args := append(redisArgs(port, dir),
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "2000")
			p := &testenv.Proc{Name: bin, Args: args, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
			if last = p.Start(); last == nil {
				t.Cleanup(p.Kill)
				nodes[i], addrs[i] = p, p.Addr
				break
			}
		}
		if nodes[i] == nil {
			t.Fatal(last)
		}
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	redisCLI(t, 30*time.Second, args...)
	testenv.WaitFor(t, 20*time.Second, "cluster_state:ok on every node", func() bool {
		for _, a := range addrs {
			host, port, _ := net.SplitHostPort(a)
			out := redisCLI(t, 5*time.Second, "-h", host, "-p", port, "cluster", "info")
			if !strings.Contains(out, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return nodes
}

// addrsOf returns the addresses of ps.
func addrsOf(ps []*testenv.Proc) []string {
	a := make([]string, len(ps))
	for i, p := range ps {
		a[i] = p.Addr
	}
	return a
}

// cli runs one redis-cli command against the server at addr.
func cli(t testing.TB, addr string, args ...string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(redisCLI(t, 5*time.Second, append([]string{"-h", host, "-p", port}, args...)...))
}

// fmtKey is the counter key of (key, start) as a string, for redis-cli.
func fmtKey(key uint64, start int64) string {
	return fmt.Sprintf("pl:{%016x}:%d", key, start)
}
