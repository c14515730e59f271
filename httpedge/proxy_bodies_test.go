package httpedge_test

import (
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
)

// patternReader yields n bytes of a fixed pseudo-random pattern.
type patternReader struct {
	n   int64
	off int
}

var pattern = func() []byte {
	b := make([]byte, 64<<10)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	n := 0
	for n < len(b) {
		c := copy(b[n:], pattern[p.off:])
		p.off = (p.off + c) % len(pattern)
		n += c
	}
	p.n -= int64(n)
	return n, nil
}

func patternCRC(n int64) uint32 {
	h := crc32.NewIEEE()
	io.Copy(h, &patternReader{n: n})
	return h.Sum32()
}

// vmRSS returns the process's resident set size in bytes.
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// TestProxyStreamsBodies sends a 100 MB upload and a 100 MB download
// through one edge, with Content-Length and chunked, and checks every byte
// arrives while the resident memory of the process (client, edge and
// origin together) stays flat: nothing buffers a body.
func TestProxyStreamsBodies(t *testing.T) {
	const size = 100 << 20
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			h := crc32.NewIEEE()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%d %08x %v", n, h.Sum32(), r.TransferEncoding)
		case "/download":
			n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			if r.URL.Query().Get("chunked") == "" {
				w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			}
			io.Copy(w, &patternReader{n: n})
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go origin.Serve(ln)
	t.Cleanup(func() { origin.Close() })
	e := startEdge(t, edgeOpts{rules: "rules: [{name: p, limit: 1000, window: 1m}]", cfg: httpedge.Config{Mode: httpedge.Proxy, Upstream: ln.Addr().String(),
		UpstreamTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute}})
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()

	upload := func(n int64, chunked bool) string {
		t.Helper()
		var body io.Reader = &patternReader{n: n}
		req, _ := http.NewRequest("PUT", "http://"+e.addr+"/upload", body)
		req.ContentLength = n
		if chunked {
			req.ContentLength = -1
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("upload of %d bytes (chunked %v): %d %s", n, chunked, resp.StatusCode, got)
		}
		return string(got)
	}
	download := func(n int64, chunked bool) (int64, uint32) {
		t.Helper()
		url := fmt.Sprintf("http://%s/download?n=%d", e.addr, n)
		if chunked {
			url += "&chunked=1"
		}
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("download: status %d", resp.StatusCode)
		}
		if want := n; !chunked && resp.ContentLength != want {
			t.Errorf("download Content-Length %d, want %d", resp.ContentLength, want)
		}
		h := crc32.NewIEEE()
		got, err := io.Copy(h, resp.Body)
		if err != nil {
			t.Fatalf("download (chunked %v) after %d bytes: %v", chunked, got, err)
		}
		return got, h.Sum32()
	}

	// Warm up every path, then measure from a collected heap.
	upload(1<<20, false)
	download(1<<20, true)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	allocBefore := ms.TotalAlloc
	before := vmRSS(t)
	var peak atomic.Int64
	peak.Store(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if r := vmRSS(t); r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	}()
	start := time.Now()
	want := fmt.Sprintf("%d %08x", size, patternCRC(size))
	if got := upload(size, false); got != want+" []" {
		t.Errorf("upload with Content-Length: origin saw %q, want %q", got, want+" []")
	}
	if got := upload(size, true); got != want+" [chunked]" {
		t.Errorf("chunked upload: origin saw %q, want %q", got, want+" [chunked]")
	}
	for _, chunked := range []bool{false, true} {
		if n, crc := download(size, chunked); fmt.Sprintf("%d %08x", n, crc) != want {
			t.Errorf("download (chunked %v): got %d bytes crc %08x, want %s", chunked, n, crc, want)
		}
	}
	close(stop)
	<-sampled
	runtime.ReadMemStats(&ms)
	allocated := ms.TotalAlloc - allocBefore
	growth := peak.Load() - before
	t.Logf("4 × 100 MiB through the edge in %v: VmRSS %.1f MiB before, %.1f MiB at most during (+%.1f MiB); %.1f MiB allocated by the process",
		time.Since(start).Round(time.Millisecond), float64(before)/(1<<20), float64(peak.Load())/(1<<20), float64(growth)/(1<<20),
		float64(allocated)/(1<<20))
	// Buffering one body would allocate its 100 MiB at least.
	if allocated > 32<<20 {
		t.Errorf("%.1f MiB allocated while 400 MiB streamed, want a small fraction of one body", float64(allocated)/(1<<20))
	}
	// The race detector's own memory makes the resident size noisy.
	if !raceOn && growth > 48<<20 {
		t.Errorf("VmRSS grew %.1f MiB while 100 MiB bodies streamed, want well under a body's size", float64(growth)/(1<<20))
	}
}
