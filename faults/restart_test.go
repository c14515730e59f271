package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/rules"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

// restartRules: a generous rule for the flush check, a tight one for the
// hand-over. An hour's window: no window edge falls inside the test
// (counters of the window before are read too, in case one does).
const restartRules = `
rules:
  - {name: api,   path_prefix: /api,   limit: 100000, window: 1h}
  - {name: login, path_prefix: /login, limit: 50,     window: 1h}
`

// TestEdgeRestart runs the edge binary as deployed. An edge whose flush
// interval is a minute (so that nothing is flushed before it stops) is sent
// SIGTERM while 20 clients keep it busy: it stops accepting, finishes what
// is in flight and flushes, so that memcached's counter of every client
// equals the requests that client saw admitted. Then an edge that admitted
// 30 of a client's 50 is stopped and a new one takes over: it starts from
// the shared counter and admits about 20 more, not 50.
func TestEdgeRestart(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(restartRules), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rules.ParseRules([]byte(restartRules))
	if err != nil {
		t.Fatal(err)
	}
	servers := []shardproxy.Server{{Addr: addrs[0]}, {Addr: addrs[1]}}
	mc, err := shardproxy.New(shardproxy.Config{Servers: servers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	common := []string{"-rules", rulesFile, "-memcache", addrs[0] + "," + addrs[1], "-trusted-proxies", "127.0.0.0/8"}
	// counted reads a client's counter of the rule over this window and the
	// one before.
	counted := func(rule, ip string) uint64 {
		r := rs.Lookup(rule)
		start := time.Now().Truncate(r.Window).UnixMilli()
		v, err := mc.Get(context.Background(), r.Hash([]byte(ip)), start, start-r.Window.Milliseconds())
		if err != nil {
			t.Fatalf("reading %s's counter: %v", ip, err)
		}
		return v[0] + v[1]
	}

	// 1. SIGTERM flushes what is pending.
	e := startEdgeProc(t, append(common, "-flush-interval", "1m")...)
	const nClients = 20
	admitted := make([]int, nClients)
	var wg sync.WaitGroup
	var stopped sync.WaitGroup
	stopped.Add(1)
	for c := range nClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 5 * time.Second}
			ip := fmt.Sprintf("198.18.0.%d", c+1)
			for {
				req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/api/x", nil)
				req.Header.Set("X-Forwarded-For", ip)
				resp, err := hc.Do(req)
				if err != nil {
					return // the edge has stopped
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					admitted[c]++
				}
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	stopAt := time.Now()
	if err := e.stop(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Errorf("edge after SIGTERM: %v\n%s", err, e.out.String())
	}
	t.Logf("SIGTERM to exit: %v", time.Since(stopAt))
	wg.Wait()
	var total, inStore uint64
	mismatched := 0
	for c := range nClients {
		ip := fmt.Sprintf("198.18.0.%d", c+1)
		got := counted("api", ip)
		total += uint64(admitted[c])
		inStore += got
		if got != uint64(admitted[c]) {
			mismatched++
			t.Errorf("client %s: memcached counts %d, the client saw %d admitted", ip, got, admitted[c])
		}
	}
	t.Logf("SIGTERM under load (flush interval 1 min, so every count came from the last flush): %d admitted, %d in memcached, %d of %d clients mismatched",
		total, inStore, mismatched, nClients)
	if total == 0 {
		t.Fatal("no request was admitted before the SIGTERM")
	}

	// 2. A new edge starts from the shared counters.
	const ip = "198.18.1.1"
	send := func(e *edgeProc, n int, gap time.Duration) (ok int) {
		hc := &http.Client{Timeout: 5 * time.Second}
		for range n {
			req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/login", nil)
			req.Header.Set("X-Forwarded-For", ip)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			}
			time.Sleep(gap)
		}
		hc.CloseIdleConnections()
		return ok
	}
	first := startEdgeProc(t, common...)
	if got := send(first, 30, 0); got != 30 {
		t.Fatalf("first edge: %d of 30 admitted under a limit of 50", got)
	}
	if err := first.stop(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Errorf("first edge after SIGTERM: %v", err)
	}
	if got := counted("login", ip); got != 30 {
		t.Errorf("after the first edge stopped: memcached counts %d, want 30", got)
	}
	second := startEdgeProc(t, common...)
	// A client that waits 20 ms between requests: the new edge's first
	// flush (5 ms) answers with the shared count before its next request.
	got := send(second, 40, 20*time.Millisecond)
	t.Logf("a new edge taking over a client that had 30 of its 50 admitted: %d more admitted of 40 sent (20 left; an edge counting from zero would admit 40)", got)
	if got > 21 {
		t.Errorf("the new edge admitted %d more, want at most the 20 left (and one it decides before its first flush)", got)
	}
	if got < 19 {
		t.Errorf("the new edge admitted %d more, want about the 20 left", got)
	}
	// The same hand-over for a client that bursts: the new edge decides
	// the first request from its own count, and the others wait for the
	// shared count (window.Config.NewKeyWait).
	const burstIP = "198.18.1.2"
	third := startEdgeProc(t, common...)
	hc := &http.Client{Timeout: 5 * time.Second}
	burst := func(e *edgeProc, n int) (ok int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		answers := map[string]int{} // by status, or the transport's error
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/login", nil)
				req.Header.Set("X-Forwarded-For", burstIP)
				resp, err := hc.Do(req)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					answers[err.Error()]++
					return
				}
				resp.Body.Close()
				answers[resp.Status]++
				if resp.StatusCode == 200 {
					ok++
				}
			}()
		}
		wg.Wait()
		t.Logf("a burst of %d to %s: %v", n, e.addr, answers)
		return ok
	}
	before := burst(third, 30)
	third.stop(t, syscall.SIGTERM, 15*time.Second)
	fourth := startEdgeProc(t, common...)
	after := burst(fourth, 40)
	t.Logf("the same with 40 requests at once to the new edge: %d admitted (after %d on the old edge; limit 50)", after, before)
	// Over the rest is the hand-over failing (an edge counting from zero
	// would admit 40): at most one more, decided before the shared count
	// came. Under it, by a few, is the burst: its near-limit round trips
	// run at once, and a few were seen refused within the limit (17 of 20,
	// once in about ten full runs), likely by increments of requests
	// refused meanwhile that had not yet been taken back.
	if left := 50 - before; after > left+1 || after < left-4 {
		t.Errorf("a burst of 40 to a new edge: %d admitted after %d on the old edge, want the %d left (at most one more, at most four fewer)", after, before, left)
	}
	second.stop(t, syscall.SIGTERM, 15*time.Second)
	fourth.stop(t, syscall.SIGTERM, 15*time.Second)
}
