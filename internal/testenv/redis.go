package testenv

import (
	"net"
	"strconv"
	"testing"
)

// Redis starts a standalone redis-server on a free loopback port (no
// persistence, its files in a temporary directory), with extra arguments
// appended, and returns it once it accepts connections; it is killed at
// cleanup.
func Redis(t testing.TB, extra ...string) *Proc {
	t.Helper()
	bin := LookBinary(t, "redis-server", "redis-server")
	var last error
	for try := 0; try < 3; try++ {
		port := FreePort(t)
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--dir", t.TempDir(), "--loglevel", "warning"}, extra...)
		p := &Proc{Name: bin, Args: args, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		if last = p.Start(); last == nil {
			t.Cleanup(p.Kill)
			return p
		}
	}
	t.Fatal(last)
	return nil
}
