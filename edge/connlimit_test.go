package edge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
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
		return metricSum(t, e, "poplimit_edge_conns_refused_total", "reason", "client") >= wantRefused
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
	if got := metricSum(t, e, "poplimit_edge_conns_refused_total", "reason", "client"); got != wantRefused {
		t.Errorf("poplimit_edge_conns_refused_total{reason=client} %v, want %v", got, wantRefused)
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
	if got := metricSum(t, e, "poplimit_edge_conns_refused_total", "reason", "client"); got < 1 {
		t.Errorf("poplimit_edge_conns_refused_total{reason=client} %v, want the refusals counted", got)
	}
}

// The open-file limit of the flood test's edge, and what each of its
// twenty flooding addresses may hold (the per-client cap): 20 × 60 =
// 1,200 connections, more than the edge has descriptors for, and each
// address within its cap. It is the probe's 20 × 1,010 against 20,000
// descriptors, scaled down.
const (
	floodFileLimit = 1024
	floodPerClient = 60
	floodAddrs     = 20
	floodChildEnv  = "POPLIMIT_CONNFLOOD_EDGE"
)

// TestConnFloodEdge is the edge of TestConnFloodLeavesRoomForOthers, run
// in a process of its own (this test binary started again), whose
// open-file limit it lowers: the limit is the process's, and lowering it
// here would starve every other test. Run alone, it skips.
func TestConnFloodEdge(t *testing.T) {
	if os.Getenv(floodChildEnv) == "" {
		t.Skip("the edge of TestConnFloodLeavesRoomForOthers, which starts it in a process of its own")
	}
	lim := syscall.Rlimit{Cur: floodFileLimit, Max: floodFileLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("setrlimit NOFILE %d: %v", floodFileLimit, err)
	}
	// The defaults, but for a per-client cap scaled as the open-file limit is.
	e := edgetest.Start(t, "rules: [{name: api, limit: 1000000, window: 1m}]",
		edge.Options{Server: httpedge.Config{MaxConnsPerClient: floodPerClient}})
	fmt.Printf("edge %s %s\n", e.Addr(), e.AdminAddr())
	// Serve until the parent closes stdin (or a bound passes).
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Error("the parent test never closed stdin")
	}
}

// TestConnFloodLeavesRoomForOthers is the probe's twenty addresses,
// scaled down: an edge under an open-file limit of 1,024, with its
// default connection caps but a per-client cap of 60, is flooded by 20
// addresses (127.0.0.2 to 127.0.0.21) opening 60 connections each, 1,200
// in all, most sending one request and keeping the connection alive.
// An honest client from another address is answered (within 2 s; the
// aim is 100 ms, logged) and the admin listener answers /metrics and
// /healthz. The edge runs in a process of its own (TestConnFloodEdge),
// whose open-file limit is lowered.
func TestConnFloodLeavesRoomForOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 1,200 connections")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if need := uint64(floodAddrs*floodPerClient + 256); lim.Cur < need {
		t.Skipf("open-file limit %d: the flood holds %d connections and needs %d", lim.Cur, floodAddrs*floodPerClient, need)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConnFloodEdge$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), floodChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.LockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var rest strings.Builder
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("the edge's process did not stop within 20 s:\n%s%s", rest.String(), stderr.String())
		}
	})
	lines := make(chan string, 16)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	var addr, admin string
	select {
	case l, ok := <-lines:
		if _, err := fmt.Sscanf(l, "edge %s %s", &addr, &admin); !ok || err != nil {
			t.Fatalf("the edge's process said %q (%v), want its addresses:\n%s", l, err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the edge's process did not start within 30 s:\n%s", stderr.String())
	}
	go func() {
		for l := range lines {
			rest.WriteString(l + "\n")
		}
	}()

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	start := time.Now()
	const keepAlive = "GET /check/x HTTP/1.1\r\nHost: x\r\n\r\n"
	for a := range floodAddrs {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+a))}, Timeout: 2 * time.Second}
		for i := range floodPerClient {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatalf("flood connection %d from 127.0.0.%d: %v", i+1, 2+a, err)
			}
			held = append(held, c)
			if i%10 != 9 { // one in ten sends nothing, the rest one request each
				c.SetWriteDeadline(time.Now().Add(time.Second))
				io.WriteString(c, keepAlive)
			}
		}
	}
	t.Logf("%d connections from %d addresses opened in %v", len(held), floodAddrs, time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second) // the edge accepts what it can of them

	// The honest client, from an address of its own: each request on a
	// new connection, as a client with nothing kept alive makes it.
	var slowest time.Duration
	for i := range 10 {
		begin := time.Now()
		c := dialFrom(t, "127.0.0.22", addr)
		c.SetDeadline(time.Now().Add(2 * time.Second))
		io.WriteString(c, "GET /check/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		took := time.Since(begin)
		slowest = max(slowest, took)
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("the honest client's request %d during a flood of %d connections: %q %v after %v, want 200 within 2 s",
				i+1, len(held), line, err, took.Round(time.Millisecond))
		}
	}
	t.Logf("the honest client's slowest of 10 requests during the flood: %v", slowest.Round(time.Microsecond))

	hc := &http.Client{Timeout: 2 * time.Second}
	var metrics string
	for _, path := range []string{"/healthz", "/metrics"} {
		begin := time.Now()
		resp, err := hc.Get("http://" + admin + path)
		if err != nil {
			t.Fatalf("the admin listener's %s during the flood: %v, want an answer within 2 s", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("the admin listener's %s during the flood: %d, want 200", path, resp.StatusCode)
		}
		t.Logf("the admin listener's %s during the flood: answered in %v", path, time.Since(begin).Round(time.Microsecond))
		metrics = string(body)
	}
	open, capN := textMetric(metrics, "poplimit_edge_conns_open"), textMetric(metrics, "poplimit_edge_conns_max")
	closed := textMetric(metrics, "poplimit_edge_conns_closed_pressure_total")
	refused := textMetric(metrics, "poplimit_edge_conns_refused_total")
	t.Logf("open %v of at most %v; %v idle connections closed under pressure, %v refused", open, capN, closed, refused)
	if capN <= 0 || capN > floodFileLimit-64 || open > capN {
		t.Errorf("poplimit_edge_conns_open %v, poplimit_edge_conns_max %v: want a cap in force, below the open-file limit %d with room to spare",
			open, capN, floodFileLimit)
	}
	if closed+refused == 0 {
		t.Errorf("a flood past the cap: no connection closed under pressure nor refused, counted")
	}
}

// textMetric sums the samples of name in a text exposition.
func textMetric(text, name string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || len(rest) == 0 || rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		if v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// Build takes the traffic connection cap from the open-file limit when
// MaxConns is unset, and keeps one that is set.
func TestMaxConnsDerivedFromFileLimit(t *testing.T) {
	e := edgetest.New(t, "", edge.Options{})
	if got, want := e.Options.Server.MaxConns, e.Options.ConnsFor(edge.CurrentFileLimit().Soft); got != want || got <= 0 {
		t.Errorf("MaxConns unset: %d, want %d, from the open-file limit %+v", got, want, edge.CurrentFileLimit())
	}
	if lim := edge.CurrentFileLimit().Soft; lim > 0 && uint64(e.Options.Server.MaxConns) >= lim {
		t.Errorf("MaxConns %d: not below the open-file limit %d", e.Options.Server.MaxConns, lim)
	}
	e = edgetest.New(t, "", edge.Options{Server: httpedge.Config{MaxConns: 50}})
	if got := e.Options.Server.MaxConns; got != 50 {
		t.Errorf("MaxConns 50: %d in force", got)
	}
	if _, err := edge.Build(edge.Options{AdminMaxConns: -1}); err == nil || !strings.Contains(err.Error(), "AdminMaxConns") {
		t.Errorf("AdminMaxConns -1: %v, want an error naming it", err)
	}
	if _, err := edge.Build(edge.Options{Server: httpedge.Config{MaxConns: -2}}); err == nil || !strings.Contains(err.Error(), "MaxConns") {
		t.Errorf("MaxConns -2: %v, want an error naming it", err)
	}
}

// The admin listener holds AdminMaxConns connections at most: one beyond
// is closed when accepted and counted, and a place given back serves
// again.
func TestAdminConnCap(t *testing.T) {
	e := edgetest.Start(t, "", edge.Options{AdminMaxConns: 2})
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 2 {
		c, err := net.DialTimeout("tcp", e.AdminAddr(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	over, err := net.DialTimeout("tcp", e.AdminAddr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if status, _ := rawAnswer(over, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); strings.HasPrefix(status, "HTTP/1.1 200") {
		t.Errorf("a third admin connection under AdminMaxConns 2: %q, want it closed", status)
	}
	if got := testenv.MetricSum(t, e.Registry, "poplimit_edge_admin_conns_refused_total"); got != 1 {
		t.Errorf("poplimit_edge_admin_conns_refused_total %v, want 1", got)
	}
	if status, _ := rawAnswer(held[0], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); !strings.HasPrefix(status, "HTTP/1.1 200") {
		t.Errorf("an admin connection within AdminMaxConns: %q, want 200", status)
	}
	held[1].Close()
	testenv.WaitFor(t, 3*time.Second, "a closed admin connection's place given back", func() bool {
		c, err := net.DialTimeout("tcp", e.AdminAddr(), 2*time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		status, _ := rawAnswer(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		return strings.HasPrefix(status, "HTTP/1.1 200")
	})
}
