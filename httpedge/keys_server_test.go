package httpedge_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/httpedge"
)

// rawResponse sends one raw request (lines ending in \n) to addr and
// returns the response, its body read.
func rawResponse(t *testing.T, addr, head string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, strings.ReplaceAll(head, "\n", "\r\n")); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(head, " ")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method}) // a HEAD's response has no body
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// A client that repeats its key field, a fresh value beside the one the
// origin reads, is refused with 400 and counted, not keyed by a fresh
// counter each time; a rule may key by the first or last value instead.
func TestDuplicateKeyFieldsRefused(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: hdr, path_prefix: /h, key: ["header:X-API-Key"], limit: 2, window: 1m}
  - {name: qry, path_prefix: /q, key: ["query:key"], limit: 2, window: 1m}
  - {name: ckie, path_prefix: /c, key: ["cookie:sid"], limit: 2, window: 1m}
  - {name: last, path_prefix: /l, key: ["query:key"], duplicate_key: last, limit: 2, window: 1m}
  - {name: cost, path_prefix: /m, cost_header: X-Cost, limit: 10, window: 1m}
`})
	// The real key's quota: two requests.
	for _, path := range []string{"/h", "/q?key=real", "/c"} {
		for i := 0; i < 2; i++ {
			get(t, e.addr, path, "X-API-Key", "real", "Cookie", "sid=real")
		}
	}
	rotations := []struct{ name, head string }{
		{"two header lines", "GET /h HTTP/1.1\nHost: x\nX-API-Key: r%d\nX-API-Key: real\n\n"},
		{"two header lines, names in two cases", "GET /h HTTP/1.1\nHost: x\nx-api-key: r%d\nX-Api-Key: real\n\n"},
		{"two query parameters", "GET /q?key=r%d&key=real HTTP/1.1\nHost: x\n\n"},
		{"a query name percent-encoded", "GET /q?key=r%d&k%%65y=real HTTP/1.1\nHost: x\n\n"},
		{"two cookies in one line", "GET /c HTTP/1.1\nHost: x\nCookie: sid=r%d; sid=real\n\n"},
		{"two Cookie lines", "GET /c HTTP/1.1\nHost: x\nCookie: sid=r%d\nCookie: a=b; sid=real\n\n"},
		{"two cost headers", "GET /m HTTP/1.1\nHost: x\nX-Cost: 1\nX-Cost: 10%d\n\n"},
	}
	for _, tc := range rotations {
		before := metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "duplicate_key") +
			metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "bad_cost")
		for i := 0; i < 3; i++ {
			head := strings.Replace(tc.head, "%d", string(rune('0'+i)), 1)
			head = strings.ReplaceAll(head, "%%", "%")
			resp, body := rawResponse(t, e.addr, head)
			if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "more than once") {
				t.Errorf("%s, request %d: %d %q %s; want 400, a problem saying the field appears more than once", tc.name, i, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
		}
		after := metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "duplicate_key") +
			metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "bad_cost")
		if after-before != 3 {
			t.Errorf("%s: bad_requests_total{duplicate_key or bad_cost} rose by %v, want 3", tc.name, after-before)
		}
	}
	if n := metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "duplicate_key"); n != 18 {
		t.Errorf("bad_requests_total{reason=duplicate_key} = %v, want 18", n)
	}
	// duplicate_key: last spends the quota of the value the origin reads.
	for i, want := range []int{200, 200, 429} {
		resp, _ := rawResponse(t, e.addr, "GET /l?key=r"+string(rune('0'+i))+"&key=real HTTP/1.1\nHost: x\n\n")
		if resp.StatusCode != want {
			t.Errorf("duplicate_key: last, request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	// Cookies are keyed as written, queries percent-decoded.
	if resp, _ := rawResponse(t, e.addr, "GET /c HTTP/1.1\nHost: x\nCookie: sid=%72eal\n\n"); resp.StatusCode != 200 {
		t.Errorf("cookie sid=%%72eal: %d, want 200 (a key of its own)", resp.StatusCode)
	}
	if resp, _ := rawResponse(t, e.addr, "GET /q?key=%72eal HTTP/1.1\nHost: x\n\n"); resp.StatusCode != 429 {
		t.Errorf("query key=%%72eal: %d, want 429 (real's key, spent)", resp.StatusCode)
	}
}

// A HEAD request meets a rule for GET; path_case: insensitive meets a
// path however its prefix is cased.
func TestHeadAndPathCaseMeetRules(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: get, path_prefix: /x, methods: [GET], limit: 1, window: 1m}
  - {name: login, path_prefix: /login, path_case: insensitive, limit: 1, window: 1m}
  - {name: exact, path_prefix: /Exact, limit: 1, window: 1m}
  - {name: rest, limit: 1000, window: 1m}
`})
	steps := []struct {
		method, path string
		want         int
	}{
		{"HEAD", "/x", 200},
		{"GET", "/x", 429},
		{"HEAD", "/x", 429},
		{"POST", "/x", 200}, // under rest
		{"GET", "/LOGIN", 200},
		{"GET", "/login", 429},
		{"GET", "/LoGiN/form", 429},
		{"GET", "/Exact", 200},
		{"GET", "/exact", 200}, // sensitive by default: under rest
		{"GET", "/Exact", 429},
	}
	for _, s := range steps {
		resp, _ := rawResponse(t, e.addr, s.method+" "+s.path+" HTTP/1.1\nHost: x\n\n")
		if resp.StatusCode != s.want {
			t.Errorf("%s %s: %d, want %d", s.method, s.path, resp.StatusCode, s.want)
		}
	}
}

// IPv4 clients behind a NAT64 or SIIT translator key apart, each as its
// IPv4 address, not as the translator's shared /64.
func TestTranslatedClientsKeyApart(t *testing.T) {
	var cfg httpedge.Config
	cfg.TrustedProxies, _ = clientaddr.ParsePrefixes("127.0.0.0/8")
	e := startEdge(t, edgeOpts{cfg: cfg, rules: "rules: [{name: per-client, limit: 1, window: 1m}]"})
	for _, tc := range []struct {
		xff  string
		want int
	}{
		{"64:ff9b::192.0.2.1", 200},
		{"64:ff9b::192.0.2.2", 200},   // another IPv4 client of the translator
		{"64:ff9b::c000:201", 429},    // the first, again
		{"192.0.2.2", 429},            // the second, over IPv4
		{"::ffff:0:192.0.2.3", 200},   // IPv4-translated
		{"64:ff9b:1::192.0.2.4", 200}, // local use: each address
		{"64:ff9b:1::192.0.2.5", 200},
		{"2001:db8:1:2::1", 200}, // native IPv6 keys its /64
		{"2001:db8:1:2::2", 429},
	} {
		if s := get(t, e.addr, "/", "X-Forwarded-For", tc.xff).StatusCode; s != tc.want {
			t.Errorf("client %s: %d, want %d", tc.xff, s, tc.want)
		}
	}
}

// Some origins split the query on ';' as on '&' (Python before 3.9.2,
// Go before 1.17, Perl's CGI.pm), and some strip Unicode blanks from a
// key (Python's str.strip, JavaScript's trim): a client could then send
// its key twice (?key=A;key=B) or with a trailing U+00A0 and meet a fresh
// counter. query_semicolon: split reads ';' as a separator, so the key
// seen twice is refused as a duplicate; key_trim: unicode strips the
// blanks, so the padded key is the same key. Without them, the documented
// decoding holds: ?key=A;key=B is the one value "A;key=B".
func TestKeySemicolonAndTrimOptions(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: split, path_prefix: /s, key: ["query:key"], query_semicolon: split, limit: 2, window: 1m}
  - {name: plain, path_prefix: /p, key: ["query:key"], limit: 2, window: 1m}
  - {name: trimq, path_prefix: /tq, key: ["query:key"], key_trim: unicode, limit: 2, window: 1m}
  - {name: trimh, path_prefix: /th, key: ["header:X-API-Key", "query:v"], key_trim: unicode, query_semicolon: split, limit: 2, window: 1m}
  - {name: deny, path_prefix: /d, key: ["header:X-API-Key"], key_trim: unicode, missing_key: deny, limit: 2, window: 1m}
`})
	status := func(target string, hdr ...string) int {
		head := "GET /check" + target + " HTTP/1.1\nHost: x\n"
		for i := 0; i+1 < len(hdr); i += 2 {
			head += hdr[i] + ": " + hdr[i+1] + "\n"
		}
		resp, _ := rawResponse(t, e.addr, head+"\n")
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name   string
		target string
		hdr    []string
		want   int
	}{
		{"split: the key twice across ';'", "/s?key=A;key=B", nil, 400},
		{"split: the key twice across ';' and '&'", "/s?key=A&x=1;key=B", nil, 400},
		{"split: A after another pair", "/s?x=1;key=A", nil, 200},
		{"split: A again", "/s?key=A;x=2", nil, 200},
		{"split: A's third, plain", "/s?key=A", nil, 429},
		{"split: an escaped ';' is no separator", "/s?key=A%3Bkey=B", nil, 200},
		{"plain: one value A;key=B", "/p?key=A;key=B", nil, 200},
		{"plain: A;key=B again", "/p?key=A;key=B", nil, 200},
		{"plain: A;key=B a third time", "/p?key=A;key=B", nil, 429},
		{"plain: A is another key", "/p?key=A", nil, 200},
		{"trim: k", "/tq?key=k", nil, 200},
		{"trim: k and U+00A0", "/tq?key=k%C2%A0", nil, 200},
		{"trim: U+3000, k, U+FEFF", "/tq?key=%E3%80%80k%EF%BB%BF", nil, 429},
		{"trim: k and a space", "/tq?key=k+", nil, 429},
		{"trim: U+200B is no blank", "/tq?key=k%E2%80%8B", nil, 200},
		{"header trim: k", "/th?v=1", []string{"X-API-Key", "k"}, 200},
		{"header trim: k and U+00A0", "/th?v=1", []string{"X-API-Key", "k\u00a0"}, 200},
		{"header trim: U+2003, k", "/th?v=1%C2%A0", []string{"X-API-Key", "\u2003k"}, 429},
		{"header trim: v twice", "/th?v=1;v=2", []string{"X-API-Key", "k"}, 400},
		{"deny: only blanks is no key", "/d", []string{"X-API-Key", "\u00a0\u3000"}, 400},
	} {
		if got := status(tc.target, tc.hdr...); got != tc.want {
			t.Errorf("%s (%s %q): %d, want %d", tc.name, tc.target, tc.hdr, got, tc.want)
		}
	}
	if n := metricSum(t, e, "poplimit_edge_bad_requests_total", "reason", "duplicate_key"); n != 3 {
		t.Errorf("duplicate keys counted %v, want 3", n)
	}
}
