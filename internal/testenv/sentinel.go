package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelSet is a Redis master, one replica of it and three sentinels
// watching them under the name Master, all on loopback ports picked here,
// each killed at cleanup.
type SentinelSet struct {
	Master    string // the master set's name, "mymaster"
	Primary   *Proc  // the first master
	Replica   *Proc  // its replica, which a failover promotes
	Sentinels []*Proc
	TLS       *TLSFiles // every process's TLS files; nil: plaintext
}

// CLI runs RedisCLI against addr, one of the set's processes, over TLS
// when the set speaks it.
func (s *SentinelSet) CLI(t testing.TB, addr string, args ...string) string {
	t.Helper()
	return redisCLI(t, addr, s.TLS.cliArgs(), args...)
}

// SentinelAddrs returns the sentinels' addresses.
func (s *SentinelSet) SentinelAddrs() []string {
	a := make([]string, len(s.Sentinels))
	for i, p := range s.Sentinels {
		a[i] = p.Addr
	}
	return a
}

// Sentinels starts a master, a replica of it and three sentinels with a
// quorum of two that call the master down after downAfter without an
// answer (failover-timeout four times that), and returns once every
// sentinel knows the replica and the two other sentinels, so that a
// failover can start as soon as the master dies.
func Sentinels(t testing.TB, downAfter time.Duration) *SentinelSet {
	t.Helper()
	return sentinels(t, downAfter, nil)
}

// SentinelsTLS is Sentinels with every process speaking TLS alone with
// the files of x (NewTLSFiles when nil): the master and the replica on
// their TLS ports only, the replica replicating over TLS, and the
// sentinels served on TLS ports, talking TLS to the master, the replica
// and each other.
func SentinelsTLS(t testing.TB, downAfter time.Duration, x *TLSFiles) *SentinelSet {
	t.Helper()
	if x == nil {
		x = NewTLSFiles(t)
	}
	return sentinels(t, downAfter, x)
}

func sentinels(t testing.TB, downAfter time.Duration, x *TLSFiles) *SentinelSet {
	t.Helper()
	bin := LookBinary(t, "redis-server", "redis-server")
	s := &SentinelSet{Master: "mymaster", TLS: x}
	s.Primary = redis(t, x)
	_, mport, _ := net.SplitHostPort(s.Primary.Addr)
	s.Replica = redis(t, x, "--replicaof", "127.0.0.1", mport)
	WaitFor(t, 10*time.Second, "the replica in sync with the master", func() bool {
		return strings.Contains(s.CLI(t, s.Replica.Addr, "info", "replication"), "master_link_status:up")
	})
	for i := 0; i < 3; i++ {
		var last error
		for try := 0; try < 3 && len(s.Sentinels) == i; try++ {
			port := FreePort(t)
			dir := t.TempDir()
			conf := filepath.Join(dir, "sentinel.conf") // sentinels rewrite their file: it must be theirs
			listen := fmt.Sprintf("port %d\n", port)
			if x != nil {
				listen = fmt.Sprintf("port 0\ntls-port %d\n", port) + strings.Join(x.conf(), "\n") + "\n"
			}
			text := fmt.Sprintf("%sbind 127.0.0.1\ndir %s\nloglevel warning\n"+
				"sentinel monitor %s 127.0.0.1 %s 2\n"+
				"sentinel down-after-milliseconds %s %d\n"+
				"sentinel failover-timeout %s %d\n"+
				"sentinel parallel-syncs %s 1\n",
				listen, dir, s.Master, mport, s.Master, downAfter.Milliseconds(), s.Master, 4*downAfter.Milliseconds(), s.Master)
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			p := &Proc{Name: bin, Args: []string{conf, "--sentinel"}, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
			if last = p.Start(); last == nil {
				t.Cleanup(p.Kill)
				s.Sentinels = append(s.Sentinels, p)
			}
		}
		if len(s.Sentinels) == i {
			t.Fatal(last)
		}
	}
	// Sentinels learn the replica from the master's INFO and each other
	// from their hello messages (every 2 s) on the master.
	WaitFor(t, 20*time.Second, "every sentinel knowing the replica and the other two sentinels", func() bool {
		for _, p := range s.Sentinels {
			if !strings.Contains(s.CLI(t, p.Addr, "sentinel", "ckquorum", s.Master), "OK 3 usable") ||
				!strings.Contains(s.CLI(t, p.Addr, "sentinel", "replicas", s.Master), s.Replica.Addr[len("127.0.0.1:"):]) {
				return false
			}
		}
		return true
	})
	return s
}

// MasterAddr returns the master's address as the first sentinel that
// answers names it.
func (s *SentinelSet) MasterAddr(t testing.TB) string {
	t.Helper()
	for _, p := range s.Sentinels {
		out := strings.Fields(s.CLI(t, p.Addr, "sentinel", "get-master-addr-by-name", s.Master))
		if len(out) == 2 {
			return net.JoinHostPort(out[0], out[1])
		}
	}
	return ""
}

// RedisCLI runs one redis-cli command against the server at addr, bounded
// by 5 s, and returns its output (an error's text too: a dead server's
// "Could not connect" is an answer here).
func RedisCLI(t testing.TB, addr string, args ...string) string {
	t.Helper()
	return redisCLI(t, addr, nil, args...)
}

func redisCLI(t testing.TB, addr string, opts []string, args ...string) string {
	t.Helper()
	bin := LookBinary(t, "redis-cli", "redis-tools")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, append(append([]string{"-h", host, "-p", port}, opts...), args...)...).CombinedOutput()
	return strings.TrimSpace(string(out))
}
