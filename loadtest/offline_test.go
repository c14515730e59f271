package loadtest_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/rules"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/loadtest"
)

func parseRules(t testing.TB, yaml string) *rules.Rules {
	t.Helper()
	rs, err := rules.ParseRules([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestOfflineBoundaryBurst is the fixed window's 2× problem: Limit requests just
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
	reqs := []loadtest.TraceRequest{
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

// A path the live edge refuses because origins read it differently (a
// backslash, %5C, a leading "//") is a 400 offline too, counting under no
// rule, as the live edge answers it.
func TestOfflineAmbiguousPaths(t *testing.T) {
	rs := parseRules(t, "rules:\n  - {name: login, path_prefix: /login, limit: 1, window: 1m}\n")
	ip := netip.MustParseAddr("192.0.2.1")
	var got []string
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: rs, CheckPrefix: "/check",
		OnDecision: func(d loadtest.OfflineDecision) { got = append(got, fmt.Sprintf("%d:%s", d.Status, d.Rule)) }},
		sliceTrace([]loadtest.TraceRequest{{IP: ip, Path: "/login"}, {IP: ip, Path: `/x/..\login`}, {IP: ip, Path: "/x/..%5Clogin"},
			{IP: ip, Path: "//evil/login"}, {IP: ip, Path: "/check//evil/login"}, {IP: ip, Path: `/other?q=\`}}))
	if err != nil {
		t.Fatal(err)
	}
	if want := "[200:login 400: 400: 400: 400: 200:]"; fmt.Sprint(got) != want || rep.Denied != 4 {
		t.Errorf("decisions %v, %d denied; want %s, 4", got, rep.Denied, want)
	}
}

func sliceTrace(reqs []loadtest.TraceRequest) loadtest.Trace {
	return func(yield func(loadtest.TraceRequest, error) bool) {
		for _, r := range reqs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

func TestOfflineKeysBounded(t *testing.T) {
	flood := must(t)(loadtest.Flood(loadtest.FloodConfig{Rate: 10000, Duration: time.Second}))
	twice := func(yield func(loadtest.TraceRequest, error) bool) {
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

// Offline runs the edge's own decision core (decision.Core, the one the
// fasthttp server calls), so it agrees with a live edge by construction.
// What it must add is what a trace can and cannot tell: concurrency rules
// are decided from the requests' durations when the trace has them, and
// reported as not simulated when it has none; shed rules depend on the
// live upstream and are reported so, never decided as rate rules.
func TestOfflineShedAndConcurrencyRules(t *testing.T) {
	const rulesYAML = `
shedding: {max_in_flight: 2}
rules:
  - {name: health, kind: shed, path_prefix: /health, priority: critical}
  - {name: uploads, kind: concurrency, path_prefix: /upload, limit: 1}
  - {name: per-client, limit: 100, window: 1m}
`
	ip := netip.MustParseAddr("192.0.2.9")
	ms := time.Millisecond
	trace := []loadtest.TraceRequest{
		{At: 0, IP: ip, Path: "/health"}, {At: 1 * ms, IP: ip, Path: "/health"}, {At: 2 * ms, IP: ip, Path: "/health"},
		{At: 10 * ms, IP: ip, Path: "/upload", Duration: 100 * ms}, // holds the one slot until 110 ms
		{At: 20 * ms, IP: ip, Path: "/upload", Duration: 100 * ms}, // refused: the slot is held
		{At: 30 * ms, IP: ip, Path: "/upload", Duration: 100 * ms}, // refused
		{At: 200 * ms, IP: ip, Path: "/upload", Duration: 10 * ms}, // the slot is free again
	}
	var got []string
	rep, err := loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: parseRules(t, rulesYAML),
		OnDecision: func(d loadtest.OfflineDecision) { got = append(got, fmt.Sprintf("%d:%s", d.Status, d.Rule)) }},
		sliceTrace(trace))
	if err != nil {
		t.Fatal(err)
	}
	want := "[200:per-client 200:per-client 200:per-client 200:uploads 429:uploads 429:uploads 200:uploads]"
	if fmt.Sprint(got) != want {
		t.Errorf("decisions:\ngot  %v\nwant %s", got, want)
	}
	byName := map[string]loadtest.RuleReport{}
	for _, r := range rep.Rules {
		byName[r.Rule] = r
	}
	if r := byName["health"]; r.NotSimulated == "" || r.Matched != 0 || r.Limited != 0 {
		t.Errorf("shed rule: %+v, want not simulated, nothing matched or limited", r)
	}
	if r := byName["uploads"]; r.NotSimulated != "" || r.Matched != 4 || r.Allowed != 2 || r.Limited != 2 || r.Kind != "concurrency" {
		t.Errorf("concurrency rule: %+v, want simulated, 4 matched, 2 allowed, 2 limited", r)
	}

	// Without durations the concurrency rule cannot be simulated: it is
	// said so, and the requests fall through to the next matching rule.
	for i := range trace {
		trace[i].Duration = 0
	}
	got = got[:0]
	rep, err = loadtest.Offline(context.Background(), loadtest.OfflineConfig{Rules: parseRules(t, rulesYAML),
		OnDecision: func(d loadtest.OfflineDecision) { got = append(got, fmt.Sprintf("%d:%s", d.Status, d.Rule)) }},
		sliceTrace(trace))
	if err != nil {
		t.Fatal(err)
	}
	if want := "[200:per-client 200:per-client 200:per-client 200:per-client 200:per-client 200:per-client 200:per-client]"; fmt.Sprint(got) != want {
		t.Errorf("decisions without durations:\ngot  %v\nwant %s", got, want)
	}
	for _, r := range rep.Rules {
		if r.Rule == "uploads" && (r.NotSimulated == "" || r.Matched != 0) {
			t.Errorf("concurrency rule without durations: %+v, want not simulated and nothing matched", r)
		}
	}
}

// startEdge starts an edge in decision mode on loopback, trusting loopback
// as a proxy so the replayer's X-Forwarded-For names the clients.
func startEdge(t *testing.T, rulesYAML string) string {
	t.Helper()
	var o edge.Options
	o.Server.TrustedProxies, _ = clientaddr.ParsePrefixes("127.0.0.0/8")
	o.Limiter.FlushInterval = 2 * time.Millisecond
	o.BlockCache.MaxEntries = 1 << 14
	return edgetest.Start(t, rulesYAML, o).Addr()
}

func BenchmarkOffline(b *testing.B) {
	rs := parseRules(b, "rules: [{name: api, limit: 10, window: 1s}, {name: all, limit: 100, window: 1m}]")
	tr, _ := loadtest.Zipf(loadtest.ZipfConfig{Clients: 10_000, Rate: 1e5, Duration: 1000 * time.Hour})
	bounded := func(yield func(loadtest.TraceRequest, error) bool) {
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
	rules, _ := rules.ParseRules([]byte(`
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
	var reqs []loadtest.TraceRequest
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
			func(yield func(loadtest.TraceRequest, error) bool) {
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
