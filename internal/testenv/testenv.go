// Package testenv starts the real servers that integration tests need
// (memcached shards, nutcracker) on loopback ports it picks, and stops them
// in t.Cleanup. A missing binary skips the test with the Debian package to
// install; `make test` (scripts/test.sh) installs them first, so in CI
// nothing is skipped.
package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// LookBinary returns the path of a server binary, or skips the test naming
// the Debian package that provides it.
func LookBinary(t testing.TB, name, pkg string) string {
	t.Helper()
	for _, p := range []string{name, "/usr/bin/" + name, "/usr/sbin/" + name, "/usr/local/bin/" + name} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skipf("%s not found: apt-get install %s", name, pkg)
	return ""
}

// WaitAccept waits until addr accepts a connection, or until exited is
// closed, or 5 seconds. A process that exits just after addr accepted did
// not bind it: another one (of another test binary that took the free port
// meanwhile) answered, and WaitAccept says so rather than let the test
// share that server.
func WaitAccept(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			select {
			case <-exited:
				return fmt.Errorf("exited after %s accepted: another process holds the port", addr)
			case <-time.After(50 * time.Millisecond): // a failed bind exits well within this
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before accepting on %s", addr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not accepting after 5s", addr)
}

// Proc is a server process started by a test. Its methods are safe for
// concurrent use.
type Proc struct {
	Name string
	Args []string
	Addr string // where it accepts connections

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    bytes.Buffer
}

// Start runs the process and waits until it accepts on Addr.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	cmd := exec.Command(p.Name, p.Args...)
	p.out.Reset()
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	if err := WaitAccept(p.Addr, exited); err != nil {
		p.killLocked()
		return fmt.Errorf("%s %s: %w: %s", p.Name, strings.Join(p.Args, " "), err, p.out.String())
	}
	return nil
}

// Kill stops the process and waits for it to exit.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *Proc) killLocked() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// MemcachedAt starts `memcached -l host -p port -U 0 -m 64` and returns it
// once it accepts connections; it is killed at cleanup. The error is a
// start failure, such as the port being in use.
func MemcachedAt(t testing.TB, host string, port int) (*Proc, error) {
	t.Helper()
	bin := LookBinary(t, "memcached", "memcached")
	args := []string{"-l", host, "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "2"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root") // memcached refuses root without -u
	}
	p := &Proc{Name: bin, Args: args, Addr: net.JoinHostPort(host, strconv.Itoa(port))}
	if err := p.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(p.Kill)
	return p, nil
}

// Memcached starts memcached on a free loopback port (trying again if the
// port was taken meanwhile).
func Memcached(t testing.TB) *Proc {
	t.Helper()
	var last error
	for try := 0; try < 3; try++ {
		p, err := MemcachedAt(t, "127.0.0.1", FreePort(t))
		if err == nil {
			return p
		}
		last = err
	}
	t.Fatal(last)
	return nil
}

// Shards starts n memcached shards and returns them with their addresses.
func Shards(t testing.TB, n int) ([]*Proc, []string) {
	t.Helper()
	ps := make([]*Proc, n)
	addrs := make([]string, n)
	for i := range ps {
		ps[i] = Memcached(t)
		addrs[i] = ps[i].Addr
	}
	return ps, addrs
}
