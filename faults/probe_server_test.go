package faults

import (
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// TestEdgeSurvivesItsOpenFileLimit runs cmd/edge under an open-file limit
// of 128, soft and hard, with the default -concurrency: it warns at start
// that the limit is below what -concurrency needs. Then one client opens
// 300 connections, more than the edge has descriptors for. The edge does
// not exit (fasthttp ends Serve on such an accept error): it pauses its
// accepts, counted, while the connections wait in the backlog, and
// answers again once they close. The connection cap, which by default
// keeps the edge below its open-file limit, is off (-max-conns -1): this
// is the edge short of descriptors all the same (edge's
// TestConnFloodLeavesRoomForOthers has the cap on).
func TestEdgeSurvivesItsOpenFileLimit(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to set the edge's open-file limit with ulimit")
	}
	const conns = 300
	p := startProcess(t, bash, "-c", `ulimit -n 128 && exec "$0" "$@"`, binary(t, "edge"),
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-max-conns", "-1")
	m := p.waitLog(t, edgeStarted, 30*time.Second)
	addr, admin := m[1], m[2]
	if out := p.out.String(); !strings.Contains(out, "open-file limit is below what -concurrency needs") || !strings.Contains(out, "open_files=128") {
		t.Errorf("started under an open-file limit of 128 with -concurrency 65536, logged no warning:\n%s", out)
	}

	held := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			select {
			case <-p.done:
			case <-time.After(2 * time.Second):
			}
			t.Fatalf("connection %d of %d: %v; the edge's output:\n%s", i+1, conns, err, p.out.String())
		}
		held = append(held, c)
	}
	select {
	case <-p.done:
		t.Fatalf("the edge exited holding %d connections under an open-file limit of 128 (%v):\n%s", conns, p.err, p.out.String())
	case <-time.After(500 * time.Millisecond):
	}
	for _, c := range held {
		c.Close()
	}
	held = held[:0]
	client := &http.Client{Timeout: time.Second}
	testenv.WaitFor(t, 10*time.Second, "the edge answering once the connections closed", func() bool {
		select {
		case <-p.done:
			t.Fatalf("the edge exited (%v):\n%s", p.err, p.out.String())
		default:
		}
		resp, err := client.Get("http://" + addr + "/check/x")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	ms := scrape(t, "http://"+admin+"/metrics")
	if n := ms.sum("poplimit_edge_accept_paused_total", "reason", "files"); n < 1 {
		t.Errorf("poplimit_edge_accept_paused_total{reason=files} %v, want the paused accepts counted", n)
	}
	if !strings.Contains(p.out.String(), "cannot accept connections: out of file descriptors") {
		t.Errorf("no warning logged for the failed accepts:\n%s", p.out.String())
	}
}
