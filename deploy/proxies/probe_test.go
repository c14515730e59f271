package proxies_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// startNginxInFront runs nginx proxying every request to the edge at edge,
// with the given directives (the Host it sends among them) in its
// location, and returns its address.
func startNginxInFront(t *testing.T, edge, directives string) string {
	t.Helper()
	addr := freeAddr(t)
	conf := fmt.Sprintf(`server {
    listen %s;
    server_name api.example.com;
    location / {
        proxy_pass http://%s;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        %s
    }
}
`, addr, edge, directives)
	startNginx(t, conf, addr)
	return addr
}

// TestNginxJoinedForwardedKeepsTheClientsKey: nginx joins its element to
// the client's Forwarded line, as RFC 9110 §5.3 allows. A client that
// leaves a quote open, or names a victim's address, must spend its own
// quota (the third request in the window refused) and leave the victim's
// untouched.
func TestNginxJoinedForwardedKeepsTheClientsKey(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, "rules:\n  - {name: per-ip, limit: 3, window: 1m}\n",
		"-mode", "proxy", "-upstream", o.addr, "-trusted-proxies", "127.0.0.1/32", "-forwarded-header", "forwarded")
	front := startNginxInFront(t, e.addr, `proxy_set_header Host $host; proxy_set_header Forwarded "$http_forwarded, for=$remote_addr";`)

	victim := newClient(t, "127.0.0.9")
	for i, forged := range []string{
		`for=127.0.0.9;x="a`, // the open quote swallowed nginx's element: keyed on the victim
		`for="127.0.0.9`,     // likewise, with the node itself open
		`for=127.0.0.9;x="a\`,
		`for=127.0.0.9`, // well-formed: nginx's element is still the rightmost
	} {
		attacker := newClient(t, fmt.Sprintf("127.0.0.%d", i+2))
		var got []int
		for range 5 {
			got = append(got, attacker.do(t, "GET", front, "/x", "", "", "Forwarded", forged).status)
		}
		if want := []int{200, 200, 200, 429, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("attacker %s with Forwarded %q: statuses %v, want %v (its own quota of 3)", attacker.ip, forged, got, want)
		}
	}
	if r := victim.do(t, "GET", front, "/x", "", ""); r.status != http.StatusOK {
		t.Errorf("victim after the attacks: status %d, want 200 (its quota untouched)", r.status)
	}
	// The setup is the one attacked: nginx joined its element to the
	// client's line.
	if seen := o.requests(); len(seen) == 0 || !strings.HasPrefix(seen[0].Header.Get("Forwarded"), `for=127.0.0.9;x="a, for=127.0.0.2`) {
		t.Errorf("the origin did not see nginx's joined Forwarded line: %+v", seen)
	}
}

// TestTrailingDotHostMeetsItsRule: a fully qualified host (a trailing dot),
// with a port, in either case, or in an absolute-form target, is the same
// host to nginx, which routes it to the server named without the dot. The
// edge must apply that host's rule to it too: as the first hop, and behind
// an nginx that passes the client's Host on ($http_host; nginx's $host
// would drop the dot itself).
func TestTrailingDotHostMeetsItsRule(t *testing.T) {
	o := startOrigin(t)
	e := startEdge(t, "rules:\n  - {name: api, host: api.example.com, limit: 3, window: 1m}\n",
		"-mode", "proxy", "-upstream", o.addr, "-trusted-proxies", "127.0.0.1/32")
	front := startNginxInFront(t, e.addr, `proxy_set_header Host $http_host; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`)

	for i, tc := range []struct {
		name, via, host, target string
	}{
		{"dot", front, "api.example.com.", "/x"},
		{"dot and port", front, "api.example.com.:80", "/x"},
		{"upper case and dot", front, "API.Example.COM.", "/x"},
		// The edge as the first hop.
		{"direct, dot", e.addr, "api.example.com.", "/x"},
		{"direct, dot and port", e.addr, "Api.Example.Com.:8080", "/x"},
		{"direct, absolute form", e.addr, "other.example", "http://api.example.com.:8080/x"},
	} {
		c := fmt.Sprintf("127.0.1.%d", i+1)
		var got []int
		for range 5 {
			got = append(got, rawHostRequest(t, c, tc.via, tc.target, tc.host))
		}
		if want := []int{200, 200, 200, 429, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s (Host %q, target %q): statuses %v, want %v", tc.name, tc.host, tc.target, got, want)
		}
	}
}

// rawHostRequest sends GET target with the given Host from loopback
// address from to addr, on a connection of its own, and returns the status.
func rawHostRequest(t *testing.T, from, addr, target, host string) int {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s (Host %s) via %s: %v", target, host, addr, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
