package edge_test

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// dialFrom connects to addr from the loopback address src (Linux routes
// all of 127.0.0.0/8 to lo), skipping the test where that cannot be done.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot connect from %s (it must be routed to lo): %v", src, err)
	}
	return c
}

// rawAnswer sends req on c (none if empty) and returns the status line of
// its answer and the answer's Content-Type, or the read error.
func rawAnswer(c net.Conn, req string) (status, contentType string) {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if req != "" {
		io.WriteString(c, req)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err.Error(), ""
	}
	for {
		h, err := r.ReadString('\n')
		if err != nil || h == "\r\n" {
			break
		}
		if k, v, ok := strings.Cut(h, ":"); ok && strings.EqualFold(k, "Content-Type") {
			contentType = strings.TrimSpace(v)
		}
	}
	return strings.TrimSpace(line), contentType
}

// TestOneClientCannotHoldEveryConnection is the probe's connection
// exhaustion, scaled to a test: the edge may serve 1,500 connections at
// once (standing for the file-descriptor limit below -concurrency), and
// one client opens 2,000 and leaves them idle. The default cap of 1,024
// connections per client keeps the rest for others: another client,
// from 127.0.0.2, is answered; the first one's connections past its cap
// are answered 429 problem+json and closed, and counted.
func TestOneClientCannotHoldEveryConnection(t *testing.T) {
	const (
		idle        = 2000
		concurrency = 1500
		defaultCap  = 1024
	)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Both ends of each connection are this process's descriptors.
	if need := uint64(2*idle + 512); lim.Cur < need {
		t.Skipf("open-file limit %d: this test holds %d connections from both ends and needs %d (ulimit -n)", lim.Cur, idle, need)
	}
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1000000, window: 1m}]",
		cfg: httpedge.Config{Concurrency: concurrency}})
	dialFrom(t, "127.0.0.2", e.addr).Close()

	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	start := time.Now()
	for range idle {
		c, err := net.DialTimeout("tcp", e.addr, 2*time.Second)
		if err != nil {
			t.Fatalf("connection %d of the idle client: %v", len(conns)+1, err)
		}
		conns = append(conns, c)
	}
	t.Logf("%d idle connections opened in %v", idle, time.Since(start).Round(time.Millisecond))
	// Let the edge accept them all (it refuses those past the cap as it
	// accepts them); the other client then queues behind them.
	wantRefused := float64(idle - defaultCap)
	settled := func() bool {
		return metricSum(t, e, "poplimit_edge_client_conns_refused_total") >= wantRefused
	}
	for deadline := time.Now().Add(5 * time.Second); !settled() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}

	for i := range 20 {
		c := dialFrom(t, "127.0.0.2", e.addr)
		status, _ := rawAnswer(c, "GET /check/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		c.Close()
		if !strings.HasPrefix(status, "HTTP/1.1 200") {
			t.Fatalf("another client's request %d while one client holds %d idle connections: %q, want 200", i+1, idle, status)
		}
	}
	if got := metricSum(t, e, "poplimit_edge_client_conns_refused_total"); got != wantRefused {
		t.Errorf("poplimit_edge_client_conns_refused_total %v, want %v", got, wantRefused)
	}
	if got := metricSum(t, e, "poplimit_edge_conns_open"); got > defaultCap+1 {
		t.Errorf("poplimit_edge_conns_open %v while one client holds its cap, want at most %d", got, defaultCap+1)
	}
	// The last connection is past the cap: answered before any request.
	if status, ct := rawAnswer(conns[len(conns)-1], ""); !strings.HasPrefix(status, "HTTP/1.1 429") || ct != "application/problem+json" {
		t.Errorf("a connection past the cap: %q %q, want 429 problem+json", status, ct)
	}
}

// TestConnCapFreesAndExemptsProxies: a client at its cap is admitted
// again once it closes a connection, and a trusted proxy, whose
// connections carry many clients, is not capped.
func TestConnCapFreesAndExemptsProxies(t *testing.T) {
	const capN = 4
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1000000, window: 1m}]",
		cfg: httpedge.Config{MaxConnsPerClient: capN, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}})
	const check = "GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n"

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for i := range 3 * capN { // the trusted proxy
		c := dialFrom(t, "127.0.0.1", e.addr)
		held = append(held, c)
		if status, _ := rawAnswer(c, check); !strings.HasPrefix(status, "HTTP/1.1 200") {
			t.Fatalf("the trusted proxy's connection %d (cap %d): %q, want 200", i+1, capN, status)
		}
	}
	var client []net.Conn
	for i := range capN {
		c := dialFrom(t, "127.0.0.2", e.addr)
		held, client = append(held, c), append(client, c)
		if status, _ := rawAnswer(c, check); !strings.HasPrefix(status, "HTTP/1.1 200") {
			t.Fatalf("a client's connection %d of its %d: %q, want 200", i+1, capN, status)
		}
	}
	over := dialFrom(t, "127.0.0.2", e.addr)
	held = append(held, over)
	if status, ct := rawAnswer(over, ""); !strings.HasPrefix(status, "HTTP/1.1 429") || ct != "application/problem+json" {
		t.Errorf("the client's connection past its cap: %q %q, want 429 problem+json", status, ct)
	}
	client[0].Close()
	testenv.WaitFor(t, 3*time.Second, "a closed connection's place given back", func() bool {
		c := dialFrom(t, "127.0.0.2", e.addr)
		defer c.Close()
		status, _ := rawAnswer(c, check)
		return strings.HasPrefix(status, "HTTP/1.1 200")
	})
	if got := metricSum(t, e, "poplimit_edge_client_conns_refused_total"); got < 1 {
		t.Errorf("poplimit_edge_client_conns_refused_total %v, want the refusals counted", got)
	}
}
