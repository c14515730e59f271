package proxies_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// startHAProxy runs HAProxy with haproxy/haproxy.cfg in front of the edge
// e (in proxy mode to origin) and returns its address.
func startHAProxy(t *testing.T, e *edgeProc, origin, onFailure string) string {
	t.Helper()
	bin := testenv.LookBinary(t, "haproxy", "haproxy")
	addr := freeAddr(t)
	vars := map[string]string{
		"POPLIMIT_LISTEN":     addr,
		"POPLIMIT_EDGE":       e.addr,
		"POPLIMIT_ADMIN_PORT": port(t, e.admin),
		"POPLIMIT_ORIGIN":     origin,
		"POPLIMIT_ON_FAILURE": onFailure,
	}
	p := startProc(t, env(vars), bin, "-db", "-f", "haproxy/haproxy.cfg")
	p.waitAccept(t, addr)
	return addr
}

// spoofLines returns one to three X-Forwarded-For lines a client makes up:
// addresses, lists, garbage, "unknown", a trusted address.
func spoofLines(r *rand.Rand) []string {
	var out []string
	for range 1 + r.IntN(3) {
		switch r.IntN(5) {
		case 0:
			out = append(out, fmt.Sprintf("203.0.113.%d", r.IntN(256)))
		case 1:
			out = append(out, fmt.Sprintf("198.51.100.%d, 192.0.2.%d", r.IntN(256), r.IntN(256)))
		case 2:
			out = append(out, "unknown")
		case 3:
			out = append(out, "127.0.0.1") // the trusted proxy's own address
		default:
			out = append(out, "not-an-address, ,")
		}
	}
	return out
}

// TestHAProxyForwardFor: HAProxy's option forwardfor line reaches poplimit
// (in proxy mode) after whatever the client wrote, and the limit follows
// the client's own address: a client sending made-up X-Forwarded-For lines
// on every request is limited as itself, and another client is not.
func TestHAProxyForwardFor(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, testRules, "-mode", "proxy", "-upstream", o.addr, "-trusted-proxies", "127.0.0.1/32")
	site := startHAProxy(t, e, o.addr, "closed")
	a, b := newClient(t, "127.0.0.2"), newClient(t, "127.0.0.3")
	rnd := rand.New(rand.NewPCG(1, 2))

	for i := int64(0); i < 20; i++ {
		lines := spoofLines(rnd)
		var hdr []string
		for _, l := range lines {
			hdr = append(hdr, "X-Forwarded-For", l)
		}
		r := a.do(t, "GET", site, "/about", host, "", hdr...)
		if r.status != http.StatusOK {
			t.Fatalf("request %d with X-Forwarded-For %q: status %d (body %q), want 200", i+1, lines, r.status, r.body)
		}
		if q := quotaOf(t, r.header); q.policy != "per-client" || q.remaining != 19-i {
			t.Errorf("request %d with X-Forwarded-For %q: quota %+v, want per-client with %d remaining", i+1, lines, q, 19-i)
		}
		// The edge, a proxy too, joins the lines it trusts (HAProxy's) and
		// appends its own hop, HAProxy's address.
		want := []string{strings.Join(append(lines, "127.0.0.2", "127.0.0.1"), ", ")}
		if got := r.echoed(t).Header.Values("X-Forwarded-For"); !slices.Equal(got, want) {
			t.Errorf("request %d: the origin saw X-Forwarded-For lines %q, want %q", i+1, got, want)
		}
	}
	r := a.do(t, "GET", site, "/about", host, "", "X-Forwarded-For", "203.0.113.200")
	checkRefusal(t, r, "per-client", 20, 60)

	r = b.do(t, "GET", site, "/about", host, "", "X-Forwarded-For", "127.0.0.2")
	if q := quotaOf(t, r.header); r.status != http.StatusOK || q.policy != "per-client" || q.remaining != 19 {
		t.Errorf("client 127.0.0.3 claiming 127.0.0.2: status %d quota %+v, want 200 with its own 19 remaining", r.status, q)
	}
	// In proxy mode poplimit sees the request itself: methods and paths.
	for i := 0; i < 3; i++ {
		r = b.do(t, "POST", site, "/login", host, "user=b")
	}
	checkRefusal(t, r, "login", 2, 60)
	if got, want := len(o.requests()), 20+1+2; got != want {
		t.Errorf("the origin received %d requests, want the %d allowed", got, want)
	}
}

// TestHAProxyPoplimitDown: what clients see when poplimit is killed:
// HAProxy's 503 (closed), or, once its health checks see poplimit down,
// the origin directly through the backup server (open).
func TestHAProxyPoplimitDown(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			o := startOrigin(t)
			e := startEdge(t, testRules, "-mode", "proxy", "-upstream", o.addr, "-trusted-proxies", "127.0.0.1/32")
			site := startHAProxy(t, e, o.addr, mode)
			a := newClient(t, "127.0.0.2")
			if r := a.do(t, "GET", site, "/about", host, ""); r.status != http.StatusOK || quotaOf(t, r.header).policy != "per-client" {
				t.Fatalf("poplimit up: status %d fields %v, want 200 under per-client", r.status, r.header)
			}
			n := len(o.requests())
			e.kill()
			killed := time.Now()
			first := a.do(t, "GET", site, "/about", host, "")
			t.Logf("%s: right after the kill: %d in %v, body %q", mode, first.status, first.elapsed.Round(time.Millisecond), first.body)
			if first.status != http.StatusServiceUnavailable && (mode == "closed" || first.status != http.StatusOK) {
				t.Errorf("right after the kill: status %d, want HAProxy's 503", first.status)
			}
			switch mode {
			case "closed":
				time.Sleep(1500 * time.Millisecond) // past the checks' fall 2 x inter 500ms
				r := a.do(t, "GET", site, "/about", host, "")
				t.Logf("closed: once the checks failed: %d in %v", r.status, r.elapsed.Round(time.Millisecond))
				if r.status != http.StatusServiceUnavailable {
					t.Errorf("poplimit down: status %d, want HAProxy's 503", r.status)
				}
				if got := len(o.requests()); got != n {
					t.Errorf("the origin received %d requests while poplimit was down, want none", got-n)
				}
			case "open":
				var r reply
				waitFor(t, 4*time.Second, "HAProxy failing open", func() bool {
					r = a.do(t, "GET", site, "/about", host, "")
					return r.status == http.StatusOK
				})
				t.Logf("open: the origin answered directly %v after the kill", time.Since(killed).Round(10*time.Millisecond))
				for _, f := range quotaFields {
					if v := r.header.Values(f); len(v) > 0 {
						t.Errorf("failing open: the client saw %s %q, want none", f, v)
					}
				}
				if got := r.echoed(t).Header.Values("X-Forwarded-For"); !slices.Equal(got, []string{"127.0.0.2"}) {
					t.Errorf("failing open: the origin saw X-Forwarded-For %q, want [127.0.0.2]", got)
				}
			}
		})
	}
}
