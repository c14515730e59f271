package loadtest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/loadtest"
)

func collect(t testing.TB, tr loadtest.Trace) []loadtest.TraceRequest {
	t.Helper()
	var out []loadtest.TraceRequest
	for r, err := range tr {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func traceBytes(t testing.TB, tr loadtest.Trace) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, _, err := loadtest.WriteTrace(&b, tr); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// generators returns one of each generator for seed.
func generators(t testing.TB, seed uint64) map[string]loadtest.Trace {
	zipf := must(t)(loadtest.Zipf(loadtest.ZipfConfig{Seed: seed, Clients: 500, Rate: 2000, Duration: 5 * time.Second}))
	abuser := must(t)(loadtest.Abuser(loadtest.AbuserConfig{Seed: seed, Rate: 50, Duration: 5 * time.Second, Jitter: 0.5}))
	burst := must(t)(loadtest.Burst(loadtest.BurstConfig{Limit: 50, Window: time.Second, Bursts: 2}))
	flood := must(t)(loadtest.Flood(loadtest.FloodConfig{Seed: seed, Rate: 1000, Duration: 5 * time.Second}))
	stuffing := must(t)(loadtest.Stuffing(loadtest.StuffingConfig{Seed: seed, IPs: 300, UserHeader: "X-Login-User", Gap: time.Second}))
	return map[string]loadtest.Trace{"zipf": zipf, "abuser": abuser, "burst": burst, "flood": flood, "stuffing": stuffing,
		"mix": loadtest.Mix(zipf, abuser, burst, flood, stuffing)}
}

// must adapts a (Trace, error) constructor for generators.
func must(t testing.TB) func(loadtest.Trace, error) loadtest.Trace {
	return func(tr loadtest.Trace, err error) loadtest.Trace {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
}

func TestGeneratorsReproducibleBySeed(t *testing.T) {
	a, b, c := generators(t, 7), generators(t, 7), generators(t, 8)
	for name := range a {
		ta, tb, tc := traceBytes(t, a[name]), traceBytes(t, b[name]), traceBytes(t, c[name])
		if !bytes.Equal(ta, tb) {
			t.Errorf("%s: seed=7 twice gave different traces", name)
		}
		if !bytes.Equal(ta, traceBytes(t, a[name])) {
			t.Errorf("%s: ranging over the same trace twice gave different requests", name)
		}
		if name != "burst" && bytes.Equal(ta, tc) {
			t.Errorf("%s: seed=7 and seed=8 gave the same trace", name)
		}
		// In time order, and valid trace lines.
		var prev time.Duration
		for r, err := range loadtest.NewReader(bytes.NewReader(ta)).All() {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r.At < prev {
				t.Fatalf("%s: %v after %v", name, r.At, prev)
			}
			prev = r.At
		}
	}
}

func TestZipfShape(t *testing.T) {
	const rate, secs, s = 5000.0, 10, 1.2
	reqs := collect(t, must(t)(loadtest.Zipf(loadtest.ZipfConfig{Seed: 1, Clients: 1000, S: s, Rate: rate, Duration: secs * time.Second})))
	if n, want := float64(len(reqs)), rate*secs; math.Abs(n-want)/want > 0.03 {
		t.Errorf("got %v requests, want %v ± 3%%", n, want)
	}
	counts := map[netip.Addr]int{}
	for _, r := range reqs {
		counts[r.IP]++
	}
	rank := func(k int) float64 {
		return float64(counts[netip.MustParseAddr(fmt.Sprintf("10.0.%d.%d", (k+1)>>8, (k+1)&0xff))])
	}
	// P(rank k) ∝ 1/(k+1)^s: rank 0 sends 2^s times rank 1 and 10^s times rank 9.
	for _, c := range []struct {
		a, b int
		tol  float64
	}{{0, 1, 0.06}, {0, 9, 0.12}} {
		got, want := rank(c.a)/rank(c.b), math.Pow(float64(c.b+1)/float64(c.a+1), s)
		if math.Abs(got-want)/want > c.tol {
			t.Errorf("rank %d / rank %d: got %.3f, want %.3f ± %.0f%%", c.a, c.b, got, want, 100*c.tol)
		}
	}
	var h float64
	for k := 1; k <= 1000; k++ {
		h += math.Pow(float64(k), -s)
	}
	if got, want := rank(0)/float64(len(reqs)), 1/h; math.Abs(got-want)/want > 0.05 {
		t.Errorf("top client's share: got %.4f, want %.4f ± 5%%", got, want)
	}
	if len(counts) < 500 {
		t.Errorf("only %d of 1000 clients sent anything; the tail is missing", len(counts))
	}
}

func TestAbuserBurstFloodStuffingShapes(t *testing.T) {
	ab := collect(t, must(t)(loadtest.Abuser(loadtest.AbuserConfig{Rate: 20, Duration: 2 * time.Second, Start: time.Second})))
	if len(ab) != 40 || ab[0].At != time.Second || ab[1].At-ab[0].At != 50*time.Millisecond || ab[39].IP.String() != "192.0.2.1" {
		t.Errorf("abuser: got %d requests from %v, spaced %v, want 40 from 1s, spaced 50ms", len(ab), ab[0].At, ab[1].At-ab[0].At)
	}

	const L, W = 100, time.Minute
	b := collect(t, must(t)(loadtest.Burst(loadtest.BurstConfig{Limit: L, Window: W, Bursts: 2})))
	before, after := 0, 0
	for _, r := range b {
		edge := W
		if r.At > 2*W {
			edge = 4 * W
		}
		switch d := r.At - edge; {
		case d >= -W/100 && d < 0:
			before++
		case d >= 0 && d < W/100:
			after++
		default:
			t.Errorf("burst request at %v, not within W/100 of an edge", r.At)
		}
	}
	if before != 2*L || after != 2*L {
		t.Errorf("burst: got %d before and %d after the edges, want %d each", before, after, 2*L)
	}

	seen := map[netip.Addr]bool{}
	fl := collect(t, must(t)(loadtest.Flood(loadtest.FloodConfig{Rate: 20000, Duration: 5 * time.Second})))
	for _, r := range fl {
		if seen[r.IP] {
			t.Fatalf("flood: %v repeated", r.IP)
		}
		if !netip.MustParsePrefix("2001:db8::/32").Contains(r.IP) {
			t.Fatalf("flood: %v outside 2001:db8::/32", r.IP)
		}
		seen[r.IP] = true
	}
	if len(fl) < 95_000 {
		t.Errorf("flood: %d requests, want about 100,000", len(fl))
	}
	// A small IPv4 prefix is used without repeats up to its size.
	clear(seen)
	for _, r := range collect(t, must(t)(loadtest.Flood(loadtest.FloodConfig{Rate: 100, Duration: time.Second, Prefix: netip.MustParsePrefix("198.18.0.0/24")}))) {
		if seen[r.IP] {
			t.Fatalf("flood /24: %v repeated", r.IP)
		}
		seen[r.IP] = true
	}

	st := collect(t, must(t)(loadtest.Stuffing(loadtest.StuffingConfig{Seed: 3, IPs: 400, Attempts: 3, UserHeader: "X-Login-User"})))
	per := map[netip.Addr]int{}
	for _, r := range st {
		per[r.IP]++
		if r.Method != "POST" || r.Path != "/login" || !strings.HasPrefix(r.Headers["X-Login-User"], "user") {
			t.Fatalf("stuffing request %+v, want POST /login with a user", r)
		}
	}
	if len(st) != 1200 || len(per) != 400 {
		t.Errorf("stuffing: %d requests from %d addresses, want 1200 from 400", len(st), len(per))
	}
	for ip, n := range per {
		if n != 3 {
			t.Errorf("stuffing: %v made %d attempts, want 3", ip, n)
		}
	}
}

func TestMixMergesInOrder(t *testing.T) {
	a := must(t)(loadtest.Abuser(loadtest.AbuserConfig{Rate: 10, Duration: time.Second}))
	b := must(t)(loadtest.Abuser(loadtest.AbuserConfig{Rate: 4, Duration: time.Second, IP: netip.MustParseAddr("192.0.2.2"), Start: 10 * time.Millisecond}))
	var got []string
	for r, err := range loadtest.Mix(a, b) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%v@%v", r.IP.As4()[3], r.At))
	}
	if len(got) != 14 {
		t.Fatalf("got %d requests, want 14", len(got))
	}
	if got[0] != "1@0s" || got[1] != "2@10ms" || got[2] != "1@100ms" || got[3] != "1@200ms" || got[4] != "2@260ms" {
		t.Errorf("got %v, want 1@0s 2@10ms 1@100ms 1@200ms 2@260ms first", got[:5])
	}
	// Stopping early stops the parts (no goroutine is left behind).
	for range loadtest.Mix(a, b) {
		break
	}
}

func TestGeneratorConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"zipf S", second(loadtest.Zipf(loadtest.ZipfConfig{S: 1})), "S 1"},
		{"zipf clients", second(loadtest.Zipf(loadtest.ZipfConfig{Clients: 300, Prefix: netip.MustParsePrefix("10.0.0.0/24")})), "Clients 300"},
		{"zipf rate", second(loadtest.Zipf(loadtest.ZipfConfig{Rate: -1})), "Rate -1"},
		{"abuser jitter", second(loadtest.Abuser(loadtest.AbuserConfig{Jitter: 2})), "Jitter 2"},
		{"abuser path", second(loadtest.Abuser(loadtest.AbuserConfig{Endpoint: loadtest.Endpoint{Path: "x"}})), "path"},
		{"burst spread", second(loadtest.Burst(loadtest.BurstConfig{Window: time.Second, Spread: time.Second})), "Spread 1s"},
		{"flood prefix", second(loadtest.Flood(loadtest.FloodConfig{Rate: 1000, Prefix: netip.MustParsePrefix("10.0.0.0/24")})), "Prefix 10.0.0.0/24"},
		{"stuffing header", second(loadtest.Stuffing(loadtest.StuffingConfig{UserHeader: "Host"})), "UserHeader"},
		{"stuffing attempts", second(loadtest.Stuffing(loadtest.StuffingConfig{Attempts: -1})), "Attempts -1"},
	}
	for _, tt := range tests {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error naming %q", tt.name, tt.err, tt.want)
		}
	}
}

func second(_ loadtest.Trace, err error) error { return err }

func BenchmarkZipf(b *testing.B) {
	tr, err := loadtest.Zipf(loadtest.ZipfConfig{Clients: 100_000, Rate: 1e6, Duration: 1000 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	n := 0
	for range tr {
		if n++; n == b.N {
			break
		}
	}
}

func BenchmarkWriteZipfTrace(b *testing.B) {
	tr, _ := loadtest.Zipf(loadtest.ZipfConfig{Clients: 100_000, Rate: 1e6, Duration: 1000 * time.Hour})
	w := loadtest.NewWriter(discard{})
	b.ReportAllocs()
	n := 0
	for r := range tr {
		w.Write(&r)
		if n++; n == b.N {
			break
		}
	}
	w.Flush()
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func ExampleZipf() {
	tr, _ := loadtest.Zipf(loadtest.ZipfConfig{Seed: 42, Clients: 100, Rate: 10, Duration: 500 * time.Millisecond})
	loadtest.WriteTrace(os.Stdout, tr)
	// Output:
	// {"offset_ms":32.005681,"ip":"10.0.0.75","method":"GET","path":"/"}
	// {"offset_ms":61.348812,"ip":"10.0.0.13","method":"GET","path":"/"}
	// {"offset_ms":102.276873,"ip":"10.0.0.1","method":"GET","path":"/"}
	// {"offset_ms":207.352718,"ip":"10.0.0.3","method":"GET","path":"/"}
	// {"offset_ms":350.551033,"ip":"10.0.0.34","method":"GET","path":"/"}
	// {"offset_ms":372.277191,"ip":"10.0.0.66","method":"GET","path":"/"}
	// {"offset_ms":492.158926,"ip":"10.0.0.1","method":"GET","path":"/"}
}

func ExampleAbuser() {
	tr, _ := loadtest.Abuser(loadtest.AbuserConfig{Rate: 4, Duration: time.Second, Endpoint: loadtest.Endpoint{Path: "/api"}})
	for r := range tr {
		fmt.Println(r.At, r.IP, r.Path)
	}
	// Output:
	// 0s 192.0.2.1 /api
	// 250ms 192.0.2.1 /api
	// 500ms 192.0.2.1 /api
	// 750ms 192.0.2.1 /api
}

func ExampleBurst() {
	tr, _ := loadtest.Burst(loadtest.BurstConfig{Limit: 2, Window: time.Minute, Spread: time.Second})
	for r := range tr {
		fmt.Println(r.At)
	}
	// Output:
	// 59s
	// 59.5s
	// 1m0s
	// 1m0.5s
}

func ExampleFlood() {
	tr, _ := loadtest.Flood(loadtest.FloodConfig{Seed: 1, Rate: 3, Duration: time.Second})
	for r := range tr {
		fmt.Println(r.IP)
	}
	// Output:
	// 2001:db8::5692:161d:100b:5e5
	// 2001:db8::dbd2:3897:3a2b:148a
}

func ExampleStuffing() {
	tr, _ := loadtest.Stuffing(loadtest.StuffingConfig{Seed: 1, IPs: 2, Attempts: 2, Rate: 1, Gap: time.Second})
	for r := range tr {
		fmt.Println(r.At.Round(time.Millisecond), r.IP, r.Method, r.Path)
	}
	// Output:
	// 217ms 100.64.0.1 POST /login
	// 1.497s 100.64.0.1 POST /login
	// 2.268s 100.74.124.22 POST /login
	// 3.298s 100.74.124.22 POST /login
}

func ExampleMix() {
	a, _ := loadtest.Abuser(loadtest.AbuserConfig{Rate: 2, Duration: time.Second})
	b, _ := loadtest.Abuser(loadtest.AbuserConfig{Rate: 2, Duration: time.Second, Start: 100 * time.Millisecond, IP: netip.MustParseAddr("192.0.2.9")})
	for r := range loadtest.Mix(a, b) {
		fmt.Println(r.At, r.IP)
	}
	// Output:
	// 0s 192.0.2.1
	// 100ms 192.0.2.9
	// 500ms 192.0.2.1
	// 600ms 192.0.2.9
}

// TestStuffingAccounts: many addresses against a few accounts, with the
// credentials in a form body, plus honest users who sometimes mistype and
// retry with their password.
func TestStuffingAccounts(t *testing.T) {
	cfg := loadtest.StuffingConfig{Seed: 4, IPs: 600, Attempts: 3, Rate: 100, Gap: time.Second, Accounts: 20, Body: "form",
		HonestUsers: 50, HonestRate: 10, Mistype: 0.2}
	reqs := collect(t, must(t)(loadtest.Stuffing(cfg)))
	perVictim, perIP := map[string]int{}, map[netip.Addr]int{}
	var honest, mistyped, last int
	var prev time.Duration
	for i, r := range reqs {
		if r.At < prev {
			t.Fatalf("request %d at %v before the previous one at %v", i, r.At, prev)
		}
		prev = r.At
		if r.Method != "POST" || r.Path != "/login" || r.ContentType != "application/x-www-form-urlencoded" {
			t.Fatalf("request %+v: want POST /login with a form body", r)
		}
		form, err := url.ParseQuery(r.Body)
		if err != nil || len(form["username"]) != 1 || len(form["password"]) != 1 {
			t.Fatalf("body %q: want one username and one password (%v)", r.Body, err)
		}
		user, pw := form.Get("username"), form.Get("password")
		right := pw == loadtest.StuffingPassword(user)
		switch {
		case strings.HasPrefix(strings.ToLower(user), "member"):
			honest++
			if !right {
				mistyped++
				last = i
			}
		case strings.HasPrefix(user, "victim"):
			if right {
				t.Fatalf("an attacker sent %s's right password", user)
			}
			perVictim[user]++
			perIP[r.IP]++
		default:
			t.Fatalf("user %q: neither a victim nor a member", user)
		}
	}
	if len(perVictim) != 20 || len(perIP) != 600 {
		t.Errorf("attack: %d accounts from %d addresses, want 20 from 600", len(perVictim), len(perIP))
	}
	for v, n := range perVictim {
		if n < 45 || n > 135 {
			t.Errorf("%s tried %d times, want about 1800/20 = 90", v, n)
		}
	}
	// 600 addresses at 100/s: the attack spans about 6 s + 3 gaps; honest
	// users log in at 10/s over it, each mistyped login retried.
	if honest < 60 || mistyped == 0 || float64(mistyped)/float64(honest) > 0.35 {
		t.Errorf("honest: %d attempts, %d mistyped; want about 90+, a fifth mistyped", honest, mistyped)
	}
	if last == len(reqs)-1 {
		t.Errorf("the last request is a mistyped honest login: its retry is missing")
	}
	j := collect(t, must(t)(loadtest.Stuffing(loadtest.StuffingConfig{Seed: 4, IPs: 10, Accounts: 2, Body: "json", HonestUsers: 1})))
	for _, r := range j {
		var b struct {
			User struct {
				Email string `json:"email"`
			} `json:"user"`
			Password string `json:"password"`
		}
		if r.ContentType != "application/json" || json.Unmarshal([]byte(r.Body), &b) != nil || b.User.Email == "" || b.Password == "" {
			t.Fatalf("json body %q (%s): want {\"user\":{\"email\":…},\"password\":…}", r.Body, r.ContentType)
		}
	}
	for _, bad := range []loadtest.StuffingConfig{{Body: "xml"}, {Accounts: -1}, {HonestUsers: 1, Mistype: 0.95}} {
		if _, err := loadtest.Stuffing(bad); err == nil {
			t.Errorf("Stuffing(%+v): got nil error", bad)
		}
	}
}
