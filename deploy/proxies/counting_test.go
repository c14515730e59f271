package proxies_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const countingRules = `
rules:
  - name: failed-logins
    path_prefix: /login
    methods: [POST]
    key: ["header:X-User"]
    limit: 5
    window: 15m
    count: {status: [401, 403]}
`

// settlingOrigin answers POST /login 401 unless X-Password is "right",
// and settles the reservation nginx passed it in Poplimit-Reservation
// with the edge before it answers, as an origin that knows the result
// does. It counts the failures it answered.
type settlingOrigin struct {
	addr     string
	failures atomic.Int64
	settled  atomic.Int64
}

func startSettlingOrigin(t *testing.T, edge string) *settlingOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &settlingOrigin{addr: ln.Addr().String()}
	c := &http.Client{Timeout: 5 * time.Second}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		status := http.StatusOK
		if r.Header.Get("X-Password") != "right" {
			time.Sleep(10 * time.Millisecond) // the attempts overlap
			status = http.StatusUnauthorized
			o.failures.Add(1)
		}
		if id := r.Header.Get("Poplimit-Reservation"); id != "" {
			resp, err := c.Post(fmt.Sprintf("http://%s/_poplimit/settle?id=%s&status=%d", edge, id, status), "", nil)
			if err == nil {
				if resp.StatusCode == http.StatusNoContent {
					o.settled.Add(1)
				}
				resp.Body.Close()
			}
		}
		w.WriteHeader(status)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

// Behind nginx's auth_request, which cannot call after the response, the
// origin settles what the failed-login rule reserved: 100 wrong passwords
// for one account sent at once reach the origin at most 5 times, and a
// user who logs in successfully 100 times is never refused.
func TestNginxCountingSettledByOrigin(t *testing.T) {
	e := startEdge(t, countingRules, "-trusted-proxies", "127.0.0.1/32")
	o := startSettlingOrigin(t, e.addr)
	testCountingSettledByOrigin(t, o, startNginxPoplimit(t, e.addr, o.addr, "closed"))
}

// The same behind Caddy's forward_auth, which copies the reservation to
// the origin (copy_headers) and passes the original method in a header.
func TestCaddyCountingSettledByOrigin(t *testing.T) {
	e := startEdge(t, countingRules, "-trusted-proxies", "127.0.0.1/32", "-forwarded-method-header", "X-Forwarded-Method")
	o := startSettlingOrigin(t, e.addr)
	testCountingSettledByOrigin(t, o, startCaddy(t, e.addr, o.addr, "closed"))
}

func testCountingSettledByOrigin(t *testing.T, o *settlingOrigin, site string) {
	c := newClient(t, "127.0.0.2")
	post := func(user, password string) int {
		return c.do(t, "POST", site, "/login", host, "x=1", "X-User", user, "X-Password", password).status
	}

	for i := range 100 {
		if s := post("bob", "right"); s != http.StatusOK {
			t.Fatalf("login %d: %d, want 200", i, s)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	for i := range 100 {
		wg.Go(func() {
			s := post("alice", fmt.Sprint("guess-", i))
			mu.Lock()
			got[s]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if f := o.failures.Load(); f < 1 || f > 5 || got[401] != int(f) || got[429] != 100-int(f) {
		t.Errorf("100 wrong passwords at once: answers %v, the origin answered %d failures; want 1 to 5, the rest 429", got, f)
	}
	if n := o.settled.Load(); n != 100+o.failures.Load() {
		t.Errorf("the origin settled %d reservations, want %d", n, 100+o.failures.Load())
	}
	if s := post("bob", "right"); s != http.StatusOK {
		t.Errorf("bob after alice's burst: %d, want 200", s)
	}
}
