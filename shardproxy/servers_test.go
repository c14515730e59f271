package shardproxy

import (
	"bufio"
	"fmt"
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

	"github.com/poplimit/poplimit/internal/testenv"
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

// skewRelay starts a loopback relay in front of a real memcached at target
// that puts the replies of one pipeline round out of step with its
// commands, once: on the first connection it carries, it sends an extra
// "STORED" line before the round-th VERSION reply (every pipeline round
// ends with a version command). With race set, it also plays the other
// client of an add race: before forwarding an add, it creates that counter
// with the value 100 through a connection of its own, so the add is
// refused and a third round (an incr) follows. Everything else is carried
// as memcached sent it.
func skewRelay(t testing.TB, target string, round int, race bool) string {
	t.Helper()
	var mu sync.Mutex
	conns := 0
	return listen(t, func(c net.Conn) {
		mu.Lock()
		first := conns == 0
		conns++
		mu.Unlock()
		up, err := net.DialTimeout("tcp", target, time.Second)
		if err != nil {
			return
		}
		defer up.Close()
		var side net.Conn
		var sideR *bufio.Reader
		if race {
			if side, err = net.DialTimeout("tcp", target, time.Second); err != nil {
				return
			}
			defer side.Close()
			sideR = bufio.NewReader(side)
		}
		done := make(chan struct{})
		go func() { // client to memcached
			defer close(done)
			defer up.Close()
			r, w := bufio.NewReader(c), bufio.NewWriter(up)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if f := strings.Fields(line); race && len(f) == 5 && f[0] == "add" {
					fmt.Fprintf(side, "set %s 0 60 3\r\n100\r\n", f[1])
					if reply, err := sideR.ReadString('\n'); err != nil || reply != "STORED\r\n" {
						return
					}
				}
				w.WriteString(line)
				if r.Buffered() == 0 && w.Flush() != nil {
					return
				}
			}
		}()
		r, w := bufio.NewReader(up), bufio.NewWriter(c)
		versions := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				break
			}
			if strings.HasPrefix(line, "VERSION ") {
				if versions++; first && versions == round {
					w.WriteString("STORED\r\n")
				}
			}
			w.WriteString(line)
			if r.Buffered() == 0 && w.Flush() != nil {
				break
			}
		}
		c.Close()
		<-done
	})
}

// fakeMemcached is a memcached of the text protocol's get, incr, decr, add
// and version over a map, with the counters of preset, for tests that
// break its replies. fault, when not nil, sees each command line (its
// index n on the connection, conn the connection's index) and the reply
// memcached would give, and returns what to send instead: replyHang
// stops replying, a reply ending in replyClose closes the connection after
// sending the rest. Replies are flushed when no command is waiting, so a
// pipeline's replies leave in one write, as memcached's do.
func fakeMemcached(t testing.TB, preset map[string]string, fault func(conn, n int, cmd, reply string) string) string {
	var mu sync.Mutex
	vals := map[string]string{}
	for k, v := range preset {
		vals[k] = v
	}
	var conns int
	exec := func(f []string, data string) string {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(f) >= 2 && f[0] == "get":
			var b strings.Builder
			for _, k := range f[1:] {
				if v, ok := vals[k]; ok {
					fmt.Fprintf(&b, "VALUE %s 0 %d\r\n%s\r\n", k, len(v), v)
				}
			}
			return b.String() + "END\r\n"
		case len(f) == 3 && (f[0] == "incr" || f[0] == "decr"):
			v, ok := vals[f[1]]
			if !ok {
				return "NOT_FOUND\r\n"
			}
			n, err := strconv.ParseUint(strings.TrimRight(v, " "), 10, 64)
			d, _ := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				return "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
			}
			if f[0] == "incr" {
				n += d
			} else {
				n -= min(n, d)
			}
			vals[f[1]] = strconv.FormatUint(n, 10)
			return vals[f[1]] + "\r\n"
		case len(f) == 5 && f[0] == "add":
			if _, ok := vals[f[1]]; ok {
				return "NOT_STORED\r\n"
			}
			vals[f[1]] = data
			return "STORED\r\n"
		case len(f) == 1 && f[0] == "version":
			return "VERSION 1.6.18-fake\r\n"
		}
		return "ERROR\r\n"
	}
	return listen(t, func(c net.Conn) {
		mu.Lock()
		conn := conns
		conns++
		mu.Unlock()
		defer c.Close()
		r := bufio.NewReader(c)
		w := bufio.NewWriter(c)
		defer w.Flush()
		hung := false
		for n := 0; ; n++ {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			cmd := strings.TrimSuffix(line, "\r\n")
			f := strings.Fields(cmd)
			var data string
			if len(f) > 0 && f[0] == "add" {
				d, err := r.ReadString('\n')
				if err != nil {
					return
				}
				data = strings.TrimSuffix(d, "\r\n")
			}
			reply := exec(f, data)
			if fault != nil {
				reply = fault(conn, n, cmd, reply)
			}
			if hung {
				continue
			}
			if rest, ok := strings.CutSuffix(reply, replyHang); ok {
				w.WriteString(rest)
				w.Flush()
				hung = true
				continue
			}
			if rest, ok := strings.CutSuffix(reply, replyClose); ok {
				w.WriteString(rest)
				return
			}
			w.WriteString(reply)
			if r.Buffered() == 0 {
				if err := w.Flush(); err != nil {
					return
				}
			}
		}
	})
}

const (
	replyHang  = "\x00hang"
	replyClose = "\x00close"
)
