package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/pipeline"
)

// runningEdge is cmd/edge's run serving in the test process.
type runningEdge struct {
	addr   string
	out    *testenv.LockedBuffer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startRun runs an edge listening on addr ("": a free loopback port)
// with args, until the test's cleanup.
func startRun(t *testing.T, addr string, args ...string) *runningEdge {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	}
	e := &runningEdge{addr: addr, out: &testenv.LockedBuffer{}, done: make(chan error, 1)}
	var ctx context.Context
	ctx, e.cancel = context.WithCancel(context.Background())
	args = append([]string{"-listen", addr, "-admin", "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))}, args...)
	go func() { e.done <- run(ctx, args, e.out) }()
	// The start line is logged once the listeners accept, so it is what to
	// wait for: a port that accepts may not yet have its line written (or
	// may, on a busy machine, be another process's).
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(e.out.String(), `msg="edge: started"`) {
		select {
		case err := <-e.done:
			t.Fatalf("edge on %s ended before starting: %v\n%s", addr, err, e.out.String())
		default:
		}
		if time.Now().After(deadline) {
			e.cancel()
			t.Fatalf("edge on %s not started: %s", addr, e.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(e.stop)
	return e
}

// stop ends run and waits for it (15 s at most), once.
func (e *runningEdge) stop() {
	e.once.Do(func() {
		e.cancel()
		select {
		case <-e.done:
		case <-time.After(15 * time.Second):
		}
	})
}

var startedID = regexp.MustCompile(`msg="edge: started".* edge_id=(\d+) edge_id_derived=(\w+)`)

// loggedID returns the edge id and whether it was derived, as the start
// log line says.
func (e *runningEdge) loggedID(t *testing.T) (int, bool) {
	t.Helper()
	m := startedID.FindStringSubmatch(e.out.String())
	if m == nil {
		t.Fatalf("no start line with edge_id in:\n%s", e.out.String())
	}
	id, _ := strconv.Atoi(m[1])
	return id, m[2] == "true"
}

// Two edges started without -edge-id on one host, at two addresses, are
// two edges in their decision events (each was edge 0, so the
// aggregator's per-edge figures merged them); an edge restarted with the
// same flags keeps its id; -edge-id, 0 included, is taken as given.
func TestEdgesWithoutIDAreDistinct(t *testing.T) {
	_, broker := testenv.Broker(t, 0, 1, "decisions")
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte("rules: [{name: api, limit: 100, window: 1m}]\n"), 0o644)
	common := []string{"-rules", rules, "-brokers", broker, "-topic", "decisions", "-flush-interval", "5ms"}
	a, b := startRun(t, "", common...), startRun(t, "", common...)
	for _, e := range []*runningEdge{a, b} {
		resp, err := http.Get("http://" + e.addr + "/check/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	idA, derivedA := a.loggedID(t)
	idB, derivedB := b.loggedID(t)
	if !derivedA || !derivedB || idA == idB || idA == 0 || idB == 0 {
		t.Errorf("edge ids without -edge-id: %d (derived %v) and %d (derived %v), want two different derived ids, not 0", idA, derivedA, idB, derivedB)
	}
	a.stop()
	b.stop() // both flush their events on the way out

	cc := pipeline.DefaultConsumerConfig()
	cc.Brokers, cc.Topic, cc.GroupID = []string{broker}, "decisions", "edge-ids"
	cons, err := pipeline.NewConsumer(cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	edges := map[uint16]int{}
	go cons.Run(ctx, func(batch []event.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range batch {
			edges[ev.Edge]++
		}
		if len(edges) >= 2 {
			cancel()
		}
		return nil
	})
	<-ctx.Done()
	cons.Close()
	mu.Lock()
	if edges[uint16(idA)] != 1 || edges[uint16(idB)] != 1 || len(edges) != 2 {
		t.Errorf("events by edge %v, want one from edge %d and one from edge %d", edges, idA, idB)
	}
	mu.Unlock()

	// Restarted with the same flags on the same address: the same id.
	again := startRun(t, a.addr, common...)
	if id, _ := again.loggedID(t); id != idA {
		t.Errorf("restarted on %s: edge id %d, want %d as before", a.addr, id, idA)
	}
	again.stop()

	for _, want := range []int{0, 7} {
		e := startRun(t, "", append([]string{"-edge-id", strconv.Itoa(want)}, common...)...)
		if id, derived := e.loggedID(t); id != want || derived {
			t.Errorf("-edge-id %d: edge id %d, derived %v", want, id, derived)
		}
		e.stop()
	}
}

// The derived id depends on the host, the address and the PoP, not on the
// process, unless the port is chosen at start.
func TestDefaultEdgeID(t *testing.T) {
	base := defaultEdgeID("h1", "0.0.0.0:7070", "ams", 10)
	for _, tc := range []struct {
		host, listen, pop string
		pid               int
		same              bool
	}{
		{"h1", "0.0.0.0:7070", "ams", 11, true},
		{"h2", "0.0.0.0:7070", "ams", 10, false},
		{"h1", "0.0.0.0:7071", "ams", 10, false},
		{"h1", "0.0.0.0:7070", "fra", 10, false},
	} {
		id := defaultEdgeID(tc.host, tc.listen, tc.pop, tc.pid)
		if id < 1 || id > 65535 || (id == base) != tc.same {
			t.Errorf("%+v: id %d (base %d), same %v", tc, id, base, tc.same)
		}
	}
	if defaultEdgeID("h", "127.0.0.1:0", "", 1) == defaultEdgeID("h", "127.0.0.1:0", "", 2) {
		t.Error("port 0: two processes got one id")
	}
}
