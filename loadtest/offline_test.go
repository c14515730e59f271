package loadtest_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/window"
)

func parseRules(t testing.TB, yaml string) *window.Rules {
	t.Helper()
	rs, err := window.ParseRules([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestOfflineBoundaryBurst is seed 003's 2× problem: Limit requests just
// before a window edge and Limit just after. A fixed window admits them
// all; the sliding window admits the first Limit only.
func TestOfflineBoundaryBurst(t *testing.T) {
	const L = 100
	tr := must(t)(loadtest.Burst(loadtest.BurstConfig{Limit: L, Window: time.Minute}))
	for _, tt := range []struct {
		algorithm      string
		allowed, limit int64
	}{{"sliding_window", L, L}, {"fixed_window", 2 * L, 0}} {
		rs := parseRules(t, fmt.Sprintf("rules: [{name: r, limit: %d, window: 1m, algorithm: %s}]", L, tt.algorithm))
		rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs}, tr)
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Rules[0]
		if r.Allowed != tt.allowed || r.Limited != tt.limit {
			t.Errorf("%s: got %d allowed, %d limited; want %d and %d", tt.algorithm, r.Allowed, r.Limited, tt.allowed, tt.limit)
		}
		if tt.limit > 0 {
			if len(r.TopKeys) != 1 || r.TopKeys[0].Key != "198.51.100.1" || r.TopKeys[0].FirstLimitedMillis != 60000 || r.FromBlockCache != L-1 {
				t.Errorf("%s: got top keys %+v (%d from the block cache), want 198.51.100.1 first limited at the edge, 60 s, and %d from the cache",
					tt.algorithm, r.TopKeys, r.FromBlockCache, L-1)
			}
		}
	}
}

func TestOfflineRulesAndKeys(t *testing.T) {
	rs := parseRules(t, `
match: all
rules:
  - name: login
    path_prefix: /login
    limit: 2
    window: 1s
  - name: by-key
    path_prefix: /api
    key: ["header:X-API-Key"]
    limit: 1
    window: 1m
  - name: deny-keyless
    path_prefix: /strict
    key: ["query:token"]
    missing_key: deny
    limit: 1
    window: 1m
  - name: watch
    limit: 3
    window: 1s
    shadow: true
`)
	ip1, ip2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::2")
	reqs := []loadtest.Request{
		{At: 0, IP: ip1, Path: "/login", Count: 3},                                                           // 2 allowed, 1 limited (login); watch sees 2
		{At: 100 * time.Millisecond, IP: ip1, Path: "/check/login"},                                          // stripped: from the block cache
		{At: 200 * time.Millisecond, IP: ip2, Path: "/api/x", Headers: map[string]string{"X-API-Key": "k1"}}, // allowed
		{At: 300 * time.Millisecond, IP: ip1, Path: "/api/y", Headers: map[string]string{"X-API-Key": "k1"}}, // limited: same key
		{At: 400 * time.Millisecond, IP: ip2, Path: "/api/z"},                                                // no key: falls back to ip2
		{At: 500 * time.Millisecond, IP: ip2, Path: "/api/z"},                                                // limited under ip-fallback:ip2
		{At: 600 * time.Millisecond, IP: ip2, Path: "/strict"},                                               // 400
		{At: 700 * time.Millisecond, IP: ip2, Path: "/strict?token=t"},                                       // allowed; watch: 4th from ip2 → would limit
		{At: 800 * time.Millisecond, IP: ip2, Path: "/other"},                                                // watch only
		{At: 2 * time.Second, IP: ip1, Path: "/login"},                                                       // released
	}
	var got []string
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs, CheckPrefix: "/check",
		OnDecision: func(d loadtest.OfflineDecision) {
			got = append(got, fmt.Sprintf("%d:%d:%s", d.Index, d.Status, d.Rule))
		}},
		sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	want := "[0:200:login 1:200:login 2:429:login 3:429:login 4:200:by-key 5:429:by-key 6:200:by-key 7:429:by-key 8:400:deny-keyless 9:200:deny-keyless 10:200:watch 11:200:login]"
	if fmt.Sprint(got) != want {
		t.Errorf("decisions:\ngot  %v\nwant %s", got, want)
	}
	byName := map[string]loadtest.RuleReport{}
	for _, r := range rep.Rules {
		byName[r.Rule] = r
	}
	checks := []struct {
		rule                                      string
		matched, allowed, limited, cache, keysLim int64
		top                                       string
	}{
		{"login", 5, 3, 2, 1, 1, "192.0.2.1"},
		{"by-key", 4, 2, 2, 0, 2, "k1"},
		{"deny-keyless", 1, 1, 0, 0, 0, ""},
		{"watch", 7, 6, 1, 0, 1, "2001:db8::"}, // a refusal by login stops the request before watch; IPv6 keys are /64s
	}
	for _, c := range checks {
		r := byName[c.rule]
		top := ""
		if len(r.TopKeys) > 0 {
			top = r.TopKeys[0].Key
		}
		if r.Matched != c.matched || r.Allowed != c.allowed || r.Limited != c.limited || r.FromBlockCache != c.cache || r.KeysLimited != c.keysLim || top != c.top {
			t.Errorf("%s: got matched %d allowed %d limited %d cache %d keys %d top %q; want %d %d %d %d %d %q",
				c.rule, r.Matched, r.Allowed, r.Limited, r.FromBlockCache, r.KeysLimited, top, c.matched, c.allowed, c.limited, c.cache, c.keysLim, c.top)
		}
	}
	if k := byName["by-key"].TopKeys; len(k) != 2 || k[1].Key != "ip-fallback:2001:db8::" || k[1].FirstLimitedMillis != 500 {
		t.Errorf("by-key top keys %+v, want k1 then ip-fallback:2001:db8:: first limited at 500 ms", k)
	}
	if rep.Requests != 12 || rep.Denied != 1 || rep.Limited != 4 || rep.Absolute {
		t.Errorf("got %d requests, %d denied, %d limited, absolute %v; want 12, 1, 4, false", rep.Requests, rep.Denied, rep.Limited, rep.Absolute)
	}
}

func sliceTrace(reqs []loadtest.Request) loadtest.Trace {
	return func(yield func(loadtest.Request, error) bool) {
		for _, r := range reqs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

func TestOfflineKeysBounded(t *testing.T) {
	flood := must(t)(loadtest.Flood(loadtest.FloodConfig{Rate: 10000, Duration: time.Second}))
	twice := func(yield func(loadtest.Request, error) bool) {
		for r, err := range flood {
			r.Count = 2
			if !yield(r, err) {
				return
			}
		}
	}
	rs := parseRules(t, "rules: [{name: once, limit: 1, window: 1m, ipv6_prefix: 128}]") // every flood address a key
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs, MaxKeys: 100, TopKeys: 5}, twice)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rules[0]
	if !r.Approximate || r.KeysLimited != r.Limited || r.Limited < 9500 || len(r.TopKeys) != 5 {
		t.Errorf("got approximate %v, %d keys limited, %d limited, %d top keys; want approximate, one limit per key, about 10,000, 5",
			r.Approximate, r.KeysLimited, r.Limited, len(r.TopKeys))
	}
}

// TestOfflineAgreesWithLiveEdge replays one trace through a real edge
// (in-process, on loopback, in-memory store; a sync rule, an async rule
// and a header-keyed rule) and runs Offline over the same trace: they must
// agree decision for decision, except where a request's real arrival, a
// little after its schedule, crossed a window edge or its key's release
// time, and on the same key's requests after such a difference (their
// counts differ by it). The trace keeps those few: no request is due in
// the last 40 ms of a window or within 10 ms before its key's release time
// (loopback latency is far below both), and every key's requests are at
// least 17 ms apart (none overtakes another). So a request can differ only
// if it took longer than that to arrive ("at risk", counted from its real
// timing), or follows such a one on its key.
func TestOfflineAgreesWithLiveEdge(t *testing.T) {
	const rulesYAML = `
rules:
  - name: login
    path_prefix: /login
    mode: sync
    limit: 5
    window: 1s
    ipv6_prefix: 128 # the trace's clients share a /64: each address a key
  - name: api
    path_prefix: /api
    key: ["header:X-API-Key"]
    missing_key: deny
    limit: 10
    window: 1s
  - name: site
    limit: 20
    window: 1s
    ipv6_prefix: 128
`
	const W = time.Second
	addr := startEdge(t, rulesYAML)

	var parts []loadtest.Trace
	add := func(ip string, rate float64, path string, hdr map[string]string) {
		a := must(t)(loadtest.Abuser(loadtest.AbuserConfig{Seed: uint64(len(parts)), IP: netip.MustParseAddr(ip), Rate: rate,
			Duration: 4 * W, Jitter: 0.3, Endpoint: loadtest.Endpoint{Path: path}}))
		parts = append(parts, func(yield func(loadtest.Request, error) bool) {
			for r, err := range a {
				r.Headers = hdr
				if !yield(r, err) {
					return
				}
			}
		})
	}
	for i, rate := range []float64{8, 10, 13} {
		add(fmt.Sprintf("198.51.100.%d", i+1), rate, "/login", nil)
	}
	for i, rate := range []float64{6, 15, 25} {
		add(fmt.Sprintf("203.0.113.%d", i+1), rate, "/api/v1", map[string]string{"X-API-Key": fmt.Sprintf("key-%d", i)})
	}
	add("203.0.113.99", 1, "/api/nokey", nil)
	for i, rate := range []float64{5, 15, 25, 40} {
		add(fmt.Sprintf("2001:db8::%d", i+1), rate, "/", nil)
	}
	var reqs []loadtest.Request
	for r, err := range loadtest.Mix(parts...) {
		if err != nil {
			t.Fatal(err)
		}
		if r.At%W < W-40*time.Millisecond {
			reqs = append(reqs, r)
		}
	}
	// Drop the requests due within margin before their key's release time,
	// as the offline run finds them, until there are none (dropping one
	// moves later releases).
	const margin = 10 * time.Millisecond
	rs := parseRules(t, rulesYAML)
	for round := 0; ; round++ {
		drop := map[int64]bool{}
		if _, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs, OnDecision: func(d loadtest.OfflineDecision) {
			if !d.ReleaseAt.IsZero() && d.ReleaseAt.Sub(time.Unix(0, 0)) <= d.At+margin {
				drop[d.Index] = true
			}
		}}, sliceTrace(reqs)); err != nil {
			t.Fatal(err)
		}
		if len(drop) == 0 {
			break
		}
		if round == 20 {
			t.Fatalf("%d requests still due within %v of their release after 20 rounds", len(drop), margin)
		}
		kept := reqs[:0]
		for i, r := range reqs {
			if !drop[int64(i)] {
				kept = append(kept, r)
			}
		}
		reqs = kept
	}

	var mu sync.Mutex
	live := make([]loadtest.Result, len(reqs))
	rep, err := loadtest.Replay(context.Background(), loadtest.ReplayConfig{Targets: []string{addr}, Align: W,
		OnResult: func(r loadtest.Result) { mu.Lock(); live[r.Index] = r; mu.Unlock() }}, sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != int64(len(reqs)) {
		t.Fatalf("live: %d of %d completed (errors %v)", rep.Completed, len(reqs), rep.Errors)
	}
	var offline []loadtest.OfflineDecision
	orep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: parseRules(t, rulesYAML), Origin: rep.Start,
		OnDecision: func(d loadtest.OfflineDecision) { offline = append(offline, d) }}, sliceTrace(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if len(offline) != len(reqs) {
		t.Fatalf("offline decided %d of %d", len(offline), len(reqs))
	}

	keyOf := func(i int) string {
		r := reqs[i]
		if k := r.Headers["X-API-Key"]; k != "" {
			return k
		}
		return r.IP.String()
	}
	var atRisk, atBoundary, edgeCross, releaseCross, reordered, cascades, unexplained, agree int
	lastDiff := map[string]time.Time{}
	lastDone := map[string]time.Time{}
	var maxDelay time.Duration
	for i, d := range offline {
		l := live[i]
		sched, done := l.Scheduled, l.Done
		maxDelay = max(maxDelay, done.Sub(sched))
		crossEdge := sched.Sub(rep.Start)/W != done.Sub(rep.Start)/W
		crossRelease := !d.ReleaseAt.IsZero() && d.ReleaseAt.After(sched) && !d.ReleaseAt.After(done)
		// Open-loop requests of one key may overtake each other on the way:
		// if the key's previous request was still unanswered when this one
		// was scheduled, the live edge may have decided them in either order.
		k := keyOf(i)
		prevDone, seenKey := lastDone[k]
		reorder := seenKey && prevDone.After(sched)
		lastDone[k] = done
		if crossEdge || crossRelease {
			atBoundary++
		}
		if crossEdge || crossRelease || reorder {
			atRisk++
		}
		if l.Status == d.Status && (l.Rule == d.Rule || d.Status == 400) { // a 400 names no rule
			agree++
			continue
		}
		switch prev, ok := lastDiff[k]; {
		case crossEdge:
			edgeCross++
		case reorder:
			reordered++
		case crossRelease:
			releaseCross++
		case ok && sched.Sub(prev) <= 2*W:
			cascades++
		default:
			unexplained++
			t.Errorf("request %d (%s %s at %v): live %d %q, offline %d %q, arrived %v after schedule, release %v",
				i, k, reqs[i].Path, reqs[i].At, l.Status, l.Rule, d.Status, d.Rule, done.Sub(sched), d.ReleaseAt.Sub(rep.Start))
		}
		lastDiff[k] = sched
	}
	n := len(reqs)
	t.Logf("%d requests (offline: %d allowed, %d limited, %d denied): %d agree (%.2f%%); %d differ: %d across a window edge, %d across a release time, %d overtaken by the key's next request, %d after those on the same key, %d unexplained; %d at risk (a boundary between schedule and response, or a possible overtaking); slowest response %v after its schedule",
		n, orep.Allowed, orep.Limited, orep.Denied, agree, 100*float64(agree)/float64(n), n-agree, edgeCross, releaseCross, reordered, cascades, unexplained, atRisk, maxDelay)
	// The bound the trace states: few requests are at risk, and only they
	// (and what follows them on their key) may differ.
	if atBoundary > n/50 {
		t.Errorf("%d of %d requests at a window edge or release time, want at most 2%%", atBoundary, n)
	}
	if n-agree > atRisk+cascades || agree < n*95/100 {
		t.Errorf("%d of %d differ with %d at risk, want at most the requests at risk and their cascades, and 95%% agreement", n-agree, n, atRisk)
	}
	if orep.Limited < 50 || orep.Denied != 4 {
		t.Errorf("offline limited %d and denied %d: the trace should exercise refusals (≥ 50) and the keyless denials (4)", orep.Limited, orep.Denied)
	}
}

// startEdge starts an edge in decision mode on loopback, trusting loopback
// as a proxy so the replayer's X-Forwarded-For names the clients.
func startEdge(t *testing.T, rulesYAML string) string {
	t.Helper()
	rs := parseRules(t, rulesYAML)
	lim, err := window.New(window.Config{FlushInterval: 2 * time.Millisecond}, window.NewMemStore(nil))
	if err != nil {
		t.Fatal(err)
	}
	lim.Start()
	blocks, err := blockcache.New(blockcache.Config{MaxEntries: 1 << 14}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(blocks.Close)
	trusted, _ := edge.ParsePrefixes("127.0.0.0/8")
	srv, err := edge.New(edge.Config{TrustedProxies: trusted, RetryJitter: time.Nanosecond}, rs, edge.Deps{Limiter: lim, Blocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String()
}

func BenchmarkOffline(b *testing.B) {
	rs := parseRules(b, "rules: [{name: api, limit: 10, window: 1s}, {name: all, limit: 100, window: 1m}]")
	tr, _ := loadtest.Zipf(loadtest.ZipfConfig{Clients: 10_000, Rate: 1e5, Duration: 1000 * time.Hour})
	bounded := func(yield func(loadtest.Request, error) bool) {
		n := 0
		for r, err := range tr {
			if n++; n > b.N || !yield(r, err) {
				return
			}
		}
	}
	b.ReportAllocs()
	if _, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs}, bounded); err != nil {
		b.Fatal(err)
	}
}

func ExampleOffline() {
	rules, _ := window.ParseRules([]byte(`
rules:
  - name: login
    path_prefix: /login
    limit: 5
    window: 1m
`))
	stuffer, _ := loadtest.Abuser(loadtest.AbuserConfig{Rate: 1, Duration: 10 * time.Second, Endpoint: loadtest.Endpoint{Method: "POST", Path: "/login"}})
	user, _ := loadtest.Abuser(loadtest.AbuserConfig{IP: netip.MustParseAddr("198.51.100.4"), Rate: 0.5, Duration: 10 * time.Second, Endpoint: loadtest.Endpoint{Path: "/login"}})
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rules}, loadtest.Mix(stuffer, user))
	if err != nil {
		fmt.Println(err)
		return
	}
	rep.WriteText(os.Stdout)
	// Output:
	// offline: 15 requests over 9s: allowed 10, limited 5 (33.33%), denied 0, no rule 0, bad trace lines 0
	//
	// rule login (async sliding_window throttle, 5 per 1m0s)
	//   matched 15  allowed 10  limited 5 (33.33%, 4 from the block cache)  keys limited 1
	//   top key    limited  first limited
	//   192.0.2.1  5        +5s
}

// TestOfflineSyncDecidesAsAsync: on one edge, sync mode (one store round
// trip a request) and async mode (the local view) see the same counts, so
// they must decide every request alike: Zipf clients near their limit, an
// abuser at twice it and a double burst at a window edge, in simulated
// time. A refused sync request once left its taken-back increment in the
// edge's count and made the two differ on thousands of decisions.
func TestOfflineSyncDecidesAsAsync(t *testing.T) {
	zipf, err := loadtest.Zipf(loadtest.ZipfConfig{Seed: 3, Clients: 50, Rate: 200, Duration: 40 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	abuser, err := loadtest.Abuser(loadtest.AbuserConfig{Seed: 4, Rate: 20, Duration: 40 * time.Second, Jitter: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	burst, err := loadtest.Burst(loadtest.BurstConfig{Limit: 100, Window: 10 * time.Second, Bursts: 2})
	if err != nil {
		t.Fatal(err)
	}
	var reqs []loadtest.Request
	for r, err := range loadtest.Mix(zipf, abuser, burst) {
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	run := func(mode string) []loadtest.OfflineDecision {
		rs := parseRules(t, "rules: [{name: std, limit: 100, window: 10s, mode: "+mode+"}]")
		var out []loadtest.OfflineDecision
		_, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs,
			OnDecision: func(d loadtest.OfflineDecision) { out = append(out, d) }},
			func(yield func(loadtest.Request, error) bool) {
				for _, r := range reqs {
					if !yield(r, nil) {
						return
					}
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	async, sync := run("async"), run("sync")
	if len(async) != len(sync) || len(async) == 0 {
		t.Fatalf("%d async decisions, %d sync", len(async), len(sync))
	}
	differ, refused := 0, 0
	for i := range async {
		if async[i].Status != sync[i].Status || async[i].FromCache != sync[i].FromCache {
			if differ++; differ <= 5 {
				t.Errorf("request %d at %v: async %d (cache %v), sync %d (cache %v)", i, async[i].At,
					async[i].Status, async[i].FromCache, sync[i].Status, sync[i].FromCache)
			}
		}
		if async[i].Status == 429 {
			refused++
		}
	}
	t.Logf("%d requests, %d refused, %d decided differently", len(async), refused, differ)
	if refused == 0 {
		t.Error("nothing refused: the trace does not test the limit")
	}
}
