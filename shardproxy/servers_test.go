package shardproxy

import (
	"bufio"
	"fmt"
	"github.com/poplimit/poplimit/internal/testenv"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// This file starts real servers for the tests: memcached shards, nutcracker
// proxies, and loopback listeners that misbehave. Every process and
// listener is stopped in t.Cleanup.

// startMemcached starts memcached on host:port.
func startMemcached(t testing.TB, host string, port int) *testenv.Proc {
	t.Helper()
	p, err := testenv.MemcachedAt(t, host, port)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startShards starts n memcached shards on free loopback ports.
func startShards(t testing.TB, n int) []*testenv.Proc {
	t.Helper()
	ps := make([]*testenv.Proc, n)
	for i := range ps {
		ps[i] = startMemcached(t, "127.0.0.1", testenv.FreePort(t))
	}
	return ps
}

// serversOf returns a Server of weight 1 for each shard.
func serversOf(ps []*testenv.Proc) []Server {
	s := make([]Server, len(ps))
	for i, p := range ps {
		s[i] = Server{Addr: p.Addr, Weight: 1}
	}
	return s
}

// startNutcracker starts nutcracker with one pool over servers, with the
// given hash, distribution ketama, hash tag "{}" and no ejection, and returns
// its listen address.
func startNutcracker(t testing.TB, servers []Server, hash Hash) string {
	t.Helper()
	bin := testenv.LookBinary(t, "nutcracker", "nutcracker")
	dir := t.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	var conf strings.Builder
	fmt.Fprintf(&conf, "pool:\n  listen: %s\n  hash: %s\n  distribution: ketama\n  hash_tag: \"{}\"\n", addr, hash)
	fmt.Fprintf(&conf, "  auto_eject_hosts: false\n  timeout: 2000\n  servers:\n")
	for _, s := range servers {
		line := fmt.Sprintf("%s:%d", s.Addr, s.weight())
		if s.Name != "" {
			line += " " + s.Name
		}
		fmt.Fprintf(&conf, "   - %s\n", line)
	}
	path := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-c", path).CombinedOutput(); err != nil {
		t.Fatalf("nutcracker -t rejects\n%s\n%v: %s", conf.String(), err, out)
	}
	p := &testenv.Proc{Name: bin, Addr: addr, Args: []string{
		"-c", path, "-o", filepath.Join(dir, "nutcracker.log"),
		"-s", strconv.Itoa(testenv.FreePort(t)), "-a", "127.0.0.1", "-v", "4",
	}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	t.Logf("nutcracker on %s:\n%s", addr, conf.String())
	return addr
}

// setAll writes every key with the value "v<index>" through addr with the
// text protocol, pipelined on one connection.
func setAll(t testing.TB, addr string, keys []string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	go func() {
		w := bufio.NewWriter(conn)
		for i, k := range keys {
			v := "v" + strconv.Itoa(i)
			fmt.Fprintf(w, "set %s 0 0 %d\r\n%s\r\n", k, len(v), v)
		}
		errc <- w.Flush()
	}()
	r := bufio.NewReader(conn)
	for i := range keys {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("set %d of %d through %s: %v", i, len(keys), addr, err)
		}
		if line != "STORED\r\n" {
			t.Fatalf("set %q through %s: got %q, want STORED", keys[i], addr, line)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// getAll reads keys from one server with multi-gets of up to 100 keys and
// returns the values found.
func getAll(t testing.TB, addr string, keys []string) map[string]string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	got := make(map[string]string)
	for len(keys) > 0 {
		n := min(len(keys), 100)
		if _, err := fmt.Fprintf(conn, "get %s\r\n", strings.Join(keys[:n], " ")); err != nil {
			t.Fatal(err)
		}
		keys = keys[n:]
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("get from %s: %v", addr, err)
			}
			if line == "END\r\n" {
				break
			}
			f := strings.Fields(line)
			if len(f) != 4 || f[0] != "VALUE" {
				t.Fatalf("get from %s: got line %q, want VALUE or END", addr, line)
			}
			size, _ := strconv.Atoi(f[3])
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				t.Fatal(err)
			}
			got[f[1]] = string(buf[:size])
		}
	}
	return got
}

// command sends one text-protocol line to addr and returns the reply's first
// line.
func command(t testing.TB, addr, line string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "%s\r\n", line); err != nil {
		t.Fatal(err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("%s to %s: %v", line, addr, err)
	}
	return strings.TrimRight(reply, "\r\n")
}

// listen starts a loopback listener that hands every connection to serve,
// and closes it all in t.Cleanup.
func listen(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); serve(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// hungServer accepts connections and never answers: it reads and discards
// until the client goes away.
func hungServer(t testing.TB) string {
	return listen(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}

// garbageServer answers every request line with reply.
func garbageServer(t testing.TB, reply string) string {
	return listen(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "add ") { // skip the data block
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
}

// deadAddr returns a loopback address that refuses connections.
func deadAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
}
