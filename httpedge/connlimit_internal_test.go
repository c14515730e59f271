package httpedge

import (
	"bytes"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

// The cap counts a client by the key a rule with the default ipv6_prefix
// gives its address: every spelling of an IPv4 client is one client, an
// IPv6 client is its /64, a trusted proxy and a peer without an IP
// address are not counted.
func TestConnClientKey(t *testing.T) {
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	l, err := newConnLimiter(2, 0, trusted.Contains, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		peer    net.Addr
		want    string
		counted bool
	}{
		{tcp("203.0.113.9:1"), "203.0.113.9", true},
		{tcp("[::ffff:203.0.113.9]:1"), "203.0.113.9", true},
		{tcp("[64:ff9b::203.0.113.9]:1"), "203.0.113.9", true}, // an IPv4 client through SIIT-DC
		{tcp("[2001:db8:1:2::1]:1"), "2001:db8:1:2::", true},
		{tcp("[2001:db8:1:2:ffff:ffff:ffff:ffff]:1"), "2001:db8:1:2::", true},
		{tcp("[2001:db8:1:3::1]:1"), "2001:db8:1:3::", true},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, "fe80::", true},
		{tcp("10.1.2.3:1"), "", false},
		{tcp("[::ffff:10.1.2.3]:1"), "", false},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "", false},
	} {
		got, counted := l.clientKey(tc.peer)
		if counted != tc.counted || counted && got.String() != tc.want {
			t.Errorf("peer %v: key %v counted %v, want %s counted %v", tc.peer, got, counted, tc.want, tc.counted)
		}
	}

	a, b := netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::")
	for i, want := range []bool{true, true, false} {
		if got := l.acquire(a, l.max) == nil; got != want {
			t.Errorf("connection %d of a client capped at 2: admitted %v, want %v", i+1, got, want)
		}
	}
	if l.acquire(b, l.max) != nil {
		t.Error("another client, when the first is at its cap: refused")
	}
	l.release(a)
	if l.acquire(a, l.max) != nil {
		t.Error("a client at its cap after closing one: refused")
	}
	l.release(a)
	l.release(a)
	l.release(b)
	if n := len(l.counts); n != 0 {
		t.Errorf("every connection closed: %d clients still counted, want 0", n)
	}
}

// A listener wrapped with a cap of 2 hands out one client's first two
// connections and closes the rest; with -1 (off) it hands out all.
func TestConnCapListener(t *testing.T) {
	for _, tc := range []struct{ max, accepted, refused int }{{2, 2, 3}, {-1, 5, 0}} {
		l, err := newConnLimiter(tc.max, 0, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := l.wrap(raw, true)
		accepted := make(chan net.Conn, 5)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		var dialed []net.Conn
		for range 5 {
			c, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			dialed = append(dialed, c)
		}
		deadline := time.Now().Add(3 * time.Second)
		for len(accepted)+int(testutil.ToFloat64(l.stats.refusedClient)) < 5 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		ln.Close()
		<-done
		if n, r := len(accepted), int(testutil.ToFloat64(l.stats.refusedClient)); n != tc.accepted || r != tc.refused {
			t.Errorf("cap %d, 5 connections: %d accepted, %d refused, want %d and %d", tc.max, n, r, tc.accepted, tc.refused)
		}
		if got := l.open.Load(); got != int64(tc.accepted) {
			t.Errorf("cap %d: %d open, want %d", tc.max, got, tc.accepted)
		}
		close(accepted)
		for c := range accepted {
			c.Close()
			c.Close() // a second Close gives nothing back twice
		}
		if got := l.open.Load(); got != 0 || len(l.counts) != 0 {
			t.Errorf("cap %d, every connection closed: %d open, %d clients counted, want none", tc.max, got, len(l.counts))
		}
		for _, c := range dialed {
			c.Close()
		}
	}
}

// scriptedListener answers Accept from its script, then with net.ErrClosed.
type scriptedListener struct {
	net.Listener
	script []acceptResult
}

type acceptResult struct {
	c   net.Conn
	err error
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.script) == 0 {
		return nil, net.ErrClosed
	}
	r := l.script[0]
	l.script = l.script[1:]
	return r.c, r.err
}

// An accept that fails for want of a file descriptor or of kernel memory
// is retried after a pause and counted, with one warning for a burst;
// any other error ends Accept, as fasthttp's Serve expects.
func TestAcceptPausesWhenOutOfFiles(t *testing.T) {
	var log bytes.Buffer
	l, err := newConnLimiter(2, 0, nil, slog.New(slog.NewTextHandler(&log, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	server, client := net.Pipe()
	defer client.Close()
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	ln := l.wrap(&scriptedListener{script: []acceptResult{{err: emfile}, {err: emfile},
		{err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENFILE)}},
		{err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENOBUFS)}},
		{c: server}}}, true)
	start := time.Now()
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept after 4 failures for want of resources: %v, want the connection that followed", err)
	}
	c.Close()
	// Pauses of 5, 10, 20 and 40 ms.
	if d := time.Since(start); d < 75*time.Millisecond {
		t.Errorf("4 failed accepts retried within %v, want pauses of at least 75 ms in all", d)
	}
	if f, m := testutil.ToFloat64(l.stats.pausedFiles), testutil.ToFloat64(l.stats.pausedMemory); f != 3 || m != 1 {
		t.Errorf("paused accepts: files %v memory %v, want 3 and 1", f, m)
	}
	if n := strings.Count(log.String(), "level=WARN"); n != 1 {
		t.Errorf("a burst of failed accepts logged %d warnings, want 1: %s", n, log.String())
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener: %v, want net.ErrClosed returned", err)
	}
}

// A client's cap is MaxConnsPerClient below the high-water mark (three
// quarters of MaxConns), and an eighth of the room left past it, at
// least pressureFloor, never above MaxConnsPerClient.
func TestClientCapTightensUnderPressure(t *testing.T) {
	for _, tc := range []struct{ perClient, total, open, want int }{
		{100, 1000, 0, 100},
		{100, 1000, 749, 100},
		{100, 1000, 750, 31},
		{100, 1000, 900, 12},
		{100, 1000, 990, pressureFloor},
		{100, 1000, 1000, pressureFloor},
		{4, 1000, 750, 4},
		{-1, 1000, 750, 31},
		{100, 0, 5000, 100}, // no total cap: no pressure
	} {
		l, err := newConnLimiter(tc.perClient, tc.total, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.clientCap(tc.open); got != tc.want {
			t.Errorf("MaxConnsPerClient %d, MaxConns %d, %d open: a client's cap %d, want %d", tc.perClient, tc.total, tc.open, got, tc.want)
		}
	}
}

// Past the high-water mark each accepted connection closes the one idle
// longest (a connection serving a request is not idle); at MaxConns,
// with none idle, a new one is answered 503 and closed, counted.
func TestPressureClosesLongestIdleFirst(t *testing.T) {
	const total = 8 // the high-water mark: 6
	// The one client here is a trusted proxy: no cap of its own, however
	// tight, refuses it before the total does.
	proxy := func(netip.Addr) bool { return true }
	l, err := newConnLimiter(-1, total, proxy, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.wrap(raw, true)
	defer ln.Close()
	var clients, servers []net.Conn
	defer func() {
		for _, c := range append(clients, servers...) {
			c.Close()
		}
	}()
	// next dials one connection and accepts it, or returns nil when the
	// listener refused it (it then accepts nothing until the next dial).
	next := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		done := make(chan net.Conn, 1)
		go func() {
			s, err := ln.Accept()
			if err != nil {
				s = nil
			}
			done <- s
		}()
		select {
		case s := <-done:
			servers = append(servers, s)
			return s
		case <-time.After(300 * time.Millisecond):
			return nil // refused: Accept waits for the next connection
		}
	}
	// closedByEdge reports whether the edge closed client connection i.
	closedByEdge := func(i int) bool {
		clients[i].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := clients[i].Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	for i := range 6 {
		if next() == nil {
			t.Fatalf("connection %d of 6, below the high-water mark: refused", i+1)
		}
	}
	// Connection 0 idles from its accept; 1 serves a request; 2 to 5 go
	// active then idle again, 5 first.
	l.connState(servers[1], fasthttp.StateActive)
	for _, i := range []int{5, 2, 3, 4} {
		l.connState(servers[i], fasthttp.StateActive)
		l.connState(servers[i], fasthttp.StateIdle)
	}
	if next() == nil {
		t.Fatal("a connection at the high-water mark: refused, want the idlest closed for it")
	}
	if !closedByEdge(0) || closedByEdge(1) {
		t.Errorf("the first connection past the high-water mark: want the one idle longest (0) closed, not the active one (1)")
	}
	next()
	if !closedByEdge(5) || closedByEdge(2) {
		t.Errorf("the second: want connection 5 closed (idle since before 2, 3, 4), not 2")
	}
	if got, want := testutil.ToFloat64(l.stats.closedPressure), 2.0; got != want {
		t.Errorf("poplimit_edge_conns_closed_pressure_total %v, want %v", got, want)
	}
	// Everything open serves a request: nothing to close.
	for _, s := range servers {
		if s != nil {
			l.connState(s, fasthttp.StateActive)
		}
	}
	for l.open.Load() < total {
		if next() == nil {
			t.Fatalf("below MaxConns with %d open: refused", l.open.Load())
		}
		l.connState(servers[len(servers)-1], fasthttp.StateActive)
	}
	if s := next(); s != nil {
		t.Fatalf("at MaxConns with none idle: accepted")
	}
	if status, _ := readStatus(clients[len(clients)-1]); !strings.HasPrefix(status, "HTTP/1.1 503") {
		t.Errorf("at MaxConns with none idle: %q, want 503", status)
	}
	if got := testutil.ToFloat64(l.stats.refusedTotal); got != 1 {
		t.Errorf("poplimit_edge_conns_refused_total{reason=total} %v, want 1", got)
	}
	for _, s := range servers {
		if s != nil {
			s.Close()
		}
	}
	if got := l.open.Load(); got != 0 {
		t.Errorf("every connection closed: %d open", got)
	}
	for i := range l.idle {
		if l.idle[i].head != nil || l.idle[i].tail != nil {
			t.Errorf("every connection closed: idle shard %d still lists one", i)
		}
	}
}

func readStatus(c net.Conn) (string, error) {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, 64)
	n, err := c.Read(b)
	return string(b[:n]), err
}

// A connection going active and idle again, as fasthttp reports it for
// every request, allocates nothing, over TLS too.
func TestConnStateDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	l, err := newConnLimiter(2, 8, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, client := net.Pipe()
	defer client.Close()
	lc := &limitedConn{Conn: server, l: l, shard: &l.idle[0]}
	l.open.Add(1)
	defer lc.Close()
	tc := tls.Server(lc, &tls.Config{})
	if n := testing.AllocsPerRun(1000, func() {
		l.connState(lc, fasthttp.StateActive)
		l.connState(lc, fasthttp.StateIdle)
		l.connState(tc, fasthttp.StateActive)
		l.connState(tc, fasthttp.StateIdle)
	}); n != 0 {
		t.Errorf("a request's state changes: %v allocations, want 0", n)
	}
	if l.idle[0].head != lc {
		t.Error("the connection idle again: not listed")
	}
}
