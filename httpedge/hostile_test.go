package httpedge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/httpedge"
)

func rawStatus(t *testing.T, addr, request string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, request)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

func TestHostileKeys(t *testing.T) {
	e := startEdge(t, edgeOpts{cfg: httpedge.Config{MaxHeaderSize: 32 << 10}, rules: `
rules:
  - {name: by-key, key: ["header:X-API-Key"], missing_key: deny, limit: 2, window: 1m}
`})
	huge := strings.Repeat("k", 10<<10) // a 10 KB key
	for i, want := range []int{200, 200, 429} {
		if s := get(t, e.addr, "/", "X-API-Key", huge).StatusCode; s != want {
			t.Errorf("10 KB key, request %d: %d, want %d", i, s, want)
		}
	}
	// Bytes that are not UTF-8 are a key like any other; control
	// characters are refused by the HTTP parser before any decision.
	for _, tc := range []struct{ value, want string }{
		{"\xff\xfe\x80", "200"},
		{"a\x01b", "400"},
	} {
		got := rawStatus(t, e.addr, "GET / HTTP/1.1\r\nHost: x\r\nX-API-Key: "+tc.value+"\r\n\r\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("key %q answered %q, want %s", tc.value, got, tc.want)
		}
	}
	if s := get(t, e.addr, "/", "X-API-Key", "other").StatusCode; s != 200 {
		t.Errorf("a normal client after the hostile ones: %d", s)
	}
}

func TestPipelinedFlood(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: flood, limit: 100, window: 1m}]"})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const n = 1000
	go func() {
		w := bufio.NewWriter(c)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		}
		w.Flush()
	}()
	r := bufio.NewReader(c)
	codes := map[int]int{}
	for i := 0; i < n; i++ {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("response %d of %d pipelined: %v", i, n, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200] != 100 || codes[429] != n-100 {
		t.Errorf("%d pipelined requests under 100 per minute: %v, want 100×200 and %d×429", n, codes, n-100)
	}
}

func TestSlowlorisIsCutOff(t *testing.T) {
	e := startEdge(t, edgeOpts{cfg: httpedge.Config{ReadTimeout: 500 * time.Millisecond}, rules: threePerMinute})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	closed := make(chan time.Duration, 1)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, err := c.Read(buf); err != nil {
				closed <- time.Since(start)
				return
			}
		}
	}()
	// Trickle a byte every 100 ms; the server's read deadline ends it.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case d := <-closed:
			if d > 3*time.Second {
				t.Errorf("a trickling client held its connection %v, want about the 500 ms read timeout", d)
			}
			if s := get(t, e.addr, "/").StatusCode; s != 200 {
				t.Errorf("a normal client meanwhile: %d", s)
			}
			return
		case <-tick.C:
			c.Write([]byte("X"))
		case <-time.After(5 * time.Second):
			t.Fatal("the trickling connection was never closed")
		}
	}
}
