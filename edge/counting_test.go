package edge_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/shardproxy"
)

// loginOrigin is a real origin for POST /login: 401 unless X-Password is
// "right", 200 then. It counts the attempts it answered, by status.
type loginOrigin struct {
	addr             string
	failures, logins atomic.Int64
}

func startLoginOrigin(t *testing.T, delay time.Duration) *loginOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &loginOrigin{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(delay) // a password hash takes a while: the attempts overlap
		if r.Header.Get("X-Password") != "right" {
			o.failures.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, "wrong password\n")
			return
		}
		o.logins.Add(1)
		io.WriteString(w, "welcome\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// failedLoginRules counts failed logins per account: 5 per 15 minutes,
// by the algorithm alg (a bucket's burst is its limit).
func failedLoginRules(alg, mode string) string {
	return `
rules:
  - name: failed-logins
    path_prefix: /login
    methods: [POST]
    key: ["header:X-User"]
    limit: 5
    window: 15m
    algorithm: ` + alg + `
    mode: ` + mode + `
    count: {status: [401, 403]}
`
}

// countingAlgorithms are the algorithms that give units back.
var countingAlgorithms = []string{"sliding_window", "fixed_window", "token_bucket", "leaky_bucket", "sliding_log"}

// countingEdges starts two proxy-mode edges in front of origin, sharing
// store: three memcached shards or one redis-server.
func countingEdges(t *testing.T, store, rulesYAML, origin string) [2]*edge.Edge {
	t.Helper()
	var o edge.Options
	o.Limiter.FlushInterval = 5 * time.Millisecond
	o.Limiter.StoreTimeout = 500 * time.Millisecond
	o.Server = httpedge.Config{Mode: httpedge.Proxy, Upstream: origin, UpstreamTimeout: 10 * time.Second}
	switch store {
	case "memcached":
		_, addrs := testenv.Shards(t, 3)
		for _, a := range addrs {
			o.Memcache.Servers = append(o.Memcache.Servers, shardproxy.Server{Addr: a})
		}
	case "redis":
		o.Redis.Addrs = []string{testenv.Redis(t).Addr}
	}
	var edges [2]*edge.Edge
	for i := range edges {
		oi := o
		oi.EdgeID = i + 1
		edges[i] = edgetest.Start(t, rulesYAML, oi)
	}
	return edges
}

// login posts one attempt for user to the edge at addr and returns the
// status.
func login(t *testing.T, c *http.Client, addr, user, password string) int {
	req, _ := http.NewRequest("POST", "http://"+addr+"/login", strings.NewReader("user="+user))
	req.Header.Set("X-User", user)
	req.Header.Set("X-Password", password)
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// 200 wrong-password attempts for one account, sent at once through two
// edges, under 5 failed logins per 15 minutes: at most 5 reach the
// origin, whatever the store and the mode. Each admitted attempt reserves
// its unit when it is admitted, so the others see it before any failure
// is counted.
func TestFailedLoginsParallelBurst(t *testing.T) {
	for _, store := range []string{"memcached", "redis"} {
		for _, mode := range []string{"async", "sync"} {
			for _, alg := range countingAlgorithms {
				if alg == "sliding_log" && mode == "async" {
					continue // a sliding log runs in sync mode only
				}
				t.Run(store+"/"+mode+"/"+alg, func(t *testing.T) {
					origin := startLoginOrigin(t, 20*time.Millisecond)
					edges := countingEdges(t, store, failedLoginRules(alg, mode), origin.addr)
					c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
					defer c.CloseIdleConnections()
					const n = 200
					var wg sync.WaitGroup
					var mu sync.Mutex
					got := map[int]int{}
					start := make(chan struct{})
					for i := range n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							s := login(t, c, edges[i%2].Addr(), "alice@example.com", fmt.Sprint("guess-", i))
							mu.Lock()
							got[s]++
							mu.Unlock()
						}()
					}
					close(start)
					wg.Wait()
					f := origin.failures.Load()
					t.Logf("%s/%s: answers %v; the origin answered %d failures", store, mode, got, f)
					if f > 5 || f < 1 {
						t.Errorf("the origin answered %d failed logins, want 1 to 5", f)
					}
					if got[401] != int(f) || got[429] != n-int(f) {
						t.Errorf("answers %v: want %d×401 and the rest 429", got, f)
					}
					// Once the burst is over, the account stays at its limit.
					if s := login(t, c, edges[0].Addr(), "alice@example.com", "right"); s != 429 {
						t.Errorf("after the burst: %d, want 429", s)
					}
				})
			}
		}
	}
}

// A user who logs in successfully 1,000 times in a window is never
// refused by the failed-login rule: each success gives its reserved unit
// back. Through two edges, on both stores and both modes.
func TestSuccessfulLoginsCostNothing(t *testing.T) {
	for _, store := range []string{"memcached", "redis"} {
		for _, mode := range []string{"async", "sync"} {
			for _, alg := range countingAlgorithms {
				if alg == "sliding_log" && mode == "async" {
					continue // a sliding log runs in sync mode only
				}
				t.Run(store+"/"+mode+"/"+alg, func(t *testing.T) {
					origin := startLoginOrigin(t, 0)
					edges := countingEdges(t, store, failedLoginRules(alg, mode), origin.addr)
					c := &http.Client{Timeout: 10 * time.Second}
					defer c.CloseIdleConnections()
					refused := 0
					for i := range 1000 {
						if s := login(t, c, edges[i%2].Addr(), "bob@example.com", "right"); s != 200 {
							refused++
							if refused < 5 {
								t.Errorf("login %d: %d, want 200", i, s)
							}
						}
					}
					if refused > 0 || origin.logins.Load() != 1000 {
						t.Fatalf("%d of 1,000 logins refused; the origin welcomed %d", refused, origin.logins.Load())
					}
					// Failures still count: five, then refused.
					for i := range 5 {
						if s := login(t, c, edges[i%2].Addr(), "bob@example.com", "wrong"); s != 401 {
							t.Errorf("failure %d: %d, want 401", i, s)
						}
					}
					if s := login(t, c, edges[1].Addr(), "bob@example.com", "right"); s != 429 {
						t.Errorf("after 5 failures: %d, want 429", s)
					}
				})
			}
		}
	}
}
