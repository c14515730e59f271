package middleware_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

const countingRules = `
rules:
  - name: failed-logins
    path_prefix: /login
    key: ["header:X-User"]
    limit: 5
    window: 15m
    count: {status: [401, 403]}
  - name: by-cost
    path_prefix: /search
    key: ["header:X-User"]
    limit: 10
    window: 1m
    count: {cost_header: X-Rate-Cost}
`

// The net/http middleware settles counting rules from the handler's
// response: failed logins count, successful ones do not, 200 attempts at
// once through two processes sharing memcached reach the handler at most
// 5 times; the handler still finds Flusher, Hijacker and ReaderFrom on its
// writer; the origin's cost header gives the units.
func TestNetHTTPCounting(t *testing.T) {
	_, shards := testenv.Shards(t, 1)
	var failures atomic.Int64
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/login/flush":
			w.(http.Flusher).Flush() // 200, implied by the flush
			io.WriteString(w, "streamed")
		case r.URL.Path == "/login/readfrom":
			w.(io.ReaderFrom).ReadFrom(strings.NewReader("copied"))
		case r.URL.Path == "/search":
			w.Header().Set("X-Rate-Cost", r.Header.Get("X-Cost"))
			io.WriteString(w, "results")
		case r.Header.Get("X-Password") == "right":
			io.WriteString(w, "welcome") // no WriteHeader: 200 at the first Write
		case r.Header.Get("X-Password") == "none":
			// nothing written: 200 when the handler returns
		default:
			time.Sleep(10 * time.Millisecond)
			failures.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	var servers [2]*httptest.Server
	for i := range servers {
		var o edge.Options
		o.Memcache.Servers = []shardproxy.Server{{Addr: shards[0]}}
		o.Limiter.StoreTimeout = 500 * time.Millisecond
		e := edgetest.New(t, countingRules, o)
		servers[i] = httptest.NewServer(e.NetHTTP()(login))
		t.Cleanup(servers[i].Close)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	defer c.CloseIdleConnections()
	post := func(srv *httptest.Server, path, user, password string, hdr ...string) int {
		req, _ := http.NewRequest("POST", srv.URL+path, nil)
		req.Header.Set("X-User", user)
		req.Header.Set("X-Password", password)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	// Successes of every shape give their units back.
	for i := range 30 {
		path, pw := []string{"/login", "/login/flush", "/login/readfrom", "/login"}[i%4], []string{"right", "right", "right", "none"}[i%4]
		if s := post(servers[i%2], path, "bob", pw); s != 200 {
			t.Fatalf("success %d (%s): %d, want 200", i, path, s)
		}
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	for i := range 200 {
		wg.Go(func() {
			s := post(servers[i%2], "/login", "alice", fmt.Sprint("guess-", i))
			mu.Lock()
			got[s]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if f := failures.Load(); f < 1 || f > 5 || got[401] != int(f) || got[429] != 200-int(f) {
		t.Errorf("200 parallel failures: answers %v, the handler answered %d failures; want 1 to 5, the rest 429", got, f)
	}
	if s := post(servers[0], "/login", "bob", "right"); s != 200 {
		t.Errorf("bob after alice's burst: %d, want 200", s)
	}

	// The origin's units: 4 + 0 + 6 = 10, the limit; a malformed header
	// counts the rule's cost (1) and is then refused.
	for i, cost := range []string{"4", "0", "6"} {
		if s := post(servers[i%2], "/search", "carol", "", "X-Cost", cost); s != 200 {
			t.Fatalf("search costing %s: %d, want 200", cost, s)
		}
	}
	if s := post(servers[0], "/search", "carol", "", "X-Cost", "1"); s != 429 {
		t.Errorf("search past 10 units: %d, want 429", s)
	}
}

// A handler that hijacks the connection sends no response the middleware
// sees: its request keeps its units.
func TestNetHTTPCountingHijack(t *testing.T) {
	e := edgetest.New(t, countingRules, edge.Options{})
	h := e.NetHTTP()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		rw.Flush()
		conn.Close()
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	statuses := []int{}
	for range 6 {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: x\r\nX-User: dave\r\nContent-Length: 0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		conn.Close()
	}
	if fmt.Sprint(statuses) != "[200 200 200 200 200 429]" {
		t.Errorf("hijacked logins: %v, want five admitted and kept, then 429", statuses)
	}
}
