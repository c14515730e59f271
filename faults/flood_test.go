package faults

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// floodRules: the flood hits a login route, one attempt per minute per
// address, so that an address trying twice is blocked (and the block cache
// fills); the legitimate clients use an API route. The flood's addresses
// share IPv6 /64s, so login keys each address (ipv6_prefix: 128): the
// test is of never-seen keys, not of a /64 rotating its addresses.
const floodRules = `
rules:
  - {name: login, path_prefix: /login, limit: 1,  window: 1m, ipv6_prefix: 128}
  - {name: api,                        limit: 50, window: 5s}
`

// floodSample is one sample of the edge during the flood.
type floodSample struct {
	at                          time.Duration
	sent                        int64
	rss                         int64 // kB
	keys, keyEvictions, dropped float64
	blocked, blockEvictions     float64
	blockRejected, goroutines   float64
	heapInuse                   float64
}

// TestKeyFlood sends 1 million never-seen client addresses (10 million in
// the full version) through an edge binary run with -max-keys 65536 and
// -block-cache-entries 16384, a quarter of them trying twice (so that they
// are blocked), pipelined over four connections, while ten legitimate
// clients send at twice their limit. The edge's RSS stays under its bound
// and stops growing once its tables are full; both tables evict, and count
// it; the legitimate clients are limited as they would be without the
// flood.
func TestKeyFlood(t *testing.T) {
	keys := pick(1_000_000, 10_000_000)
	if s := os.Getenv("POPLIMIT_FLOOD_KEYS"); s != "" { // for experiments
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			keys = n
		}
	}
	const (
		maxKeys     = 65536
		blockCache  = 16384
		conns       = 4
		depth       = 2000 // requests in flight per connection at most
		legit       = 10
		legitLimit  = 50
		legitWindow = 5 * time.Second
		// The RSS bound, from the two settings: the Go runtime, fasthttp's
		// and the memcached client's buffers (about 15 MB at rest, 30 MB
		// busy), the limiter's table (65,536 × about 110 bytes: 7 MB) and
		// the block cache (16,384 × about 260 bytes, counters included:
		// 4 MB), twice over for the garbage collector (GOGC=100), and a
		// margin. Measured peak: see RESULTS.md.
		rssBoundMB = 96
	)
	_, shards := testenv.Shards(t, 2)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(floodRules), 0o644)
	e := startEdgeProc(t, "-rules", rules, "-memcache", strings.Join(shards, ","), "-trusted-proxies", "127.0.0.0/8",
		"-max-keys", strconv.Itoa(maxKeys), "-block-cache-entries", strconv.Itoa(blockCache))
	idleRSS := procStatus(t, e.pid(), "VmRSS")

	// The flood.
	var next, sent, answered atomic.Int64
	statuses := make([]map[int]int64, conns)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range conns {
		statuses[c] = map[int]int64{}
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var inflight atomic.Int64
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			w := bufio.NewWriterSize(conn, 64<<10)
			var buf []byte
			for {
				i := next.Add(1) - 1
				if i >= int64(keys) {
					break
				}
				for inflight.Load() > depth {
					w.Flush()
					time.Sleep(100 * time.Microsecond)
				}
				ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
				if i >= 1<<24 {
					ip = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
				}
				n := 1
				if i%4 == 0 {
					n = 2 // tries twice: refused, and blocked
				}
				for range n {
					buf = append(buf[:0], "GET /check/login HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: "...)
					buf = ip.AppendTo(buf)
					buf = append(buf, "\r\n\r\n"...)
					w.Write(buf)
					inflight.Add(1)
					sent.Add(1)
				}
			}
			// The last request asks the edge to close the connection
			// once it has answered everything before it.
			w.WriteString("GET /check/end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			w.Flush()
		}()
		go func() { // reader
			defer wg.Done()
			r := bufio.NewReaderSize(conn, 64<<10)
			for {
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.Close {
					return // the answer to the last request
				}
				statuses[c][resp.StatusCode]++
				inflight.Add(-1)
				answered.Add(1)
			}
		}()
	}

	// The legitimate clients, paced at twice their limit.
	stop := make(chan struct{})
	legitOK := make([]int, legit)
	legitAll := make([]int, legit)
	var lwg sync.WaitGroup
	for c := range legit {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			hc := &http.Client{Timeout: 10 * time.Second}
			tick := time.NewTicker(legitWindow / (2 * legitLimit))
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				req, _ := http.NewRequest("GET", "http://"+e.addr+"/check/api", nil)
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("192.0.2.%d", c+1))
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				legitAll[c]++
				if resp.StatusCode == 200 {
					legitOK[c]++
				}
			}
		}()
	}

	// Watch the edge until the flood is answered.
	var samples []floodSample
	sample := func() {
		m := e.metrics(t)
		samples = append(samples, floodSample{at: time.Since(start), sent: sent.Load(), rss: procStatus(t, e.pid(), "VmRSS"),
			keys: m.sum("poplimit_window_keys"), keyEvictions: m.sum("poplimit_window_evictions_total"),
			dropped: m.sum("poplimit_window_pending_dropped_total"), blocked: m.sum("poplimit_blockcache_entries"),
			blockEvictions: m.sum("poplimit_blockcache_evictions_total"), blockRejected: m.sum("poplimit_blockcache_sets_rejected_total") + m.sum("poplimit_blockcache_sets_dropped_total"),
			goroutines: m.sum("go_goroutines"), heapInuse: m.sum("go_memstats_heap_inuse_bytes")})
	}
	floodDone := make(chan struct{})
	go func() { wg.Wait(); close(floodDone) }()
	tick := time.NewTicker(pick(2*time.Second, 10*time.Second))
	timeout := time.After(pick(4*time.Minute, 40*time.Minute))
watch:
	for {
		select {
		case <-floodDone:
			break watch
		case <-tick.C:
			sample()
		case <-timeout:
			t.Fatalf("the flood was not answered in time: %d sent, %d answered", sent.Load(), answered.Load())
		}
	}
	tick.Stop()
	elapsed := time.Since(start)
	close(stop)
	lwg.Wait()
	sample()

	total := map[int]int64{}
	for _, s := range statuses {
		for code, n := range s {
			total[code] += n
		}
	}
	rows := [][]string{{"t", "requests sent", "RSS MB", "heap in use MB", "limiter keys", "key evictions", "units dropped", "blocked keys", "block evictions", "blocks refused", "goroutines"}}
	for _, s := range samples {
		rows = append(rows, []string{s.at.Round(time.Second).String(), strconv.FormatInt(s.sent, 10), fmt.Sprintf("%.1f", float64(s.rss)/1024),
			fmt.Sprintf("%.1f", s.heapInuse/1e6), fmt.Sprint(s.keys), fmt.Sprint(s.keyEvictions), fmt.Sprint(s.dropped), fmt.Sprint(s.blocked),
			fmt.Sprint(s.blockEvictions), fmt.Sprint(s.blockRejected), fmt.Sprint(s.goroutines)})
	}
	peak := procStatus(t, e.pid(), "VmHWM")
	t.Logf("%d never-seen keys, %d requests in %v (%.0f/s): statuses %v; RSS idle %.1f MB, peak %.1f MB (bound %d MB):%s",
		keys, sent.Load(), elapsed.Round(time.Millisecond), float64(sent.Load())/elapsed.Seconds(), total,
		float64(idleRSS)/1024, float64(peak)/1024, rssBoundMB, table(rows))

	last := samples[len(samples)-1]
	if total[200] != int64(keys) || total[429] != int64(keys+3)/4 {
		t.Errorf("statuses %v: want each of the %d keys admitted once, and the %d that tried twice refused once", total, keys, (keys+3)/4)
	}
	if peak > rssBoundMB*1024 {
		t.Errorf("peak RSS %.1f MB, want under %d MB", float64(peak)/1024, rssBoundMB)
	}
	if last.keys > maxKeys+64 || last.keyEvictions == 0 {
		t.Errorf("limiter: %v keys (bound %d), %v evictions: want it at its bound, evicting", last.keys, maxKeys, last.keyEvictions)
	}
	if last.blocked > 2*blockCache || last.blockEvictions+last.blockRejected == 0 {
		t.Errorf("block cache: %v entries (bound %d), %v evicted, %v refused: want it at its bound, evicting or refusing", last.blocked, blockCache, last.blockEvictions, last.blockRejected)
	}
	// Once the tables are full, memory does not grow with more keys.
	if len(samples) >= 4 {
		q := samples[len(samples)/4]
		if last.rss > q.rss+16*1024 {
			t.Errorf("RSS grew from %.1f MB (at %d requests) to %.1f MB: want it flat once the tables are full", float64(q.rss)/1024, q.sent, float64(last.rss)/1024)
		}
	}
	// The legitimate clients: a sliding window of 50 per 5 s admits, over
	// the run, between a window's worth less and a window's worth more than
	// 10 per second.
	allowance := legitLimit * elapsed.Seconds() / legitWindow.Seconds()
	for c := range legit {
		lo, hi := allowance-legitLimit, allowance+legitLimit+5
		if float64(legitOK[c]) < lo || float64(legitOK[c]) > hi {
			t.Errorf("legitimate client %d: %d of %d admitted over %v, want %.0f to %.0f", c+1, legitOK[c], legitAll[c], elapsed.Round(time.Second), lo, hi)
		}
	}
	t.Logf("legitimate clients (limit %d per %v, sending twice that): admitted %v of %v over %v (allowance %.0f each)",
		legitLimit, legitWindow, legitOK, legitAll, elapsed.Round(time.Second), allowance)
}
