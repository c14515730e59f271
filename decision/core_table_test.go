package decision

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// tableFields are the Fields of one request in these tests: each of
// header "h:name" (lower case), query "q:name" and cookie "c:name" maps
// to its values in order.
type tableFields map[string][]string

func (f tableFields) get(k string) (first, last []byte, n int) {
	v := f[k]
	if len(v) == 0 {
		return nil, nil, 0
	}
	return []byte(v[0]), []byte(v[len(v)-1]), len(v)
}

func (f tableFields) Header(name string) ([]byte, []byte, int) {
	return f.get("h:" + strings.ToLower(name))
}
func (f tableFields) Query(name string) ([]byte, []byte, int)  { return f.get("q:" + name) }
func (f tableFields) Cookie(name string) ([]byte, []byte, int) { return f.get("c:" + name) }

// errStoreDown is what failingStore answers.
var errStoreDown = errors.New("store down (test)")

// failingStore is a store.Store whose every operation fails, as a
// store that cannot be reached does: the core's failure policy answers.
type failingStore struct{}

func (failingStore) Do(_ context.Context, ops []store.Op) {
	for i := range ops {
		ops[i].Err = errStoreDown
	}
}

func (failingStore) DoState(_ context.Context, ops []store.StateOp) {
	for i := range ops {
		ops[i].Err = errStoreDown
	}
}

func (failingStore) Healthy() bool    { return false }
func (failingStore) Whole() bool      { return true }
func (failingStore) Parts() int       { return 1 }
func (failingStore) Place(uint64) int { return 0 }

// tableCore returns a core deciding by doc over store (a MemStore on clk
// when nil), with Slots for concurrency rules, its limiter and store on
// clk, its metrics in a registry of their own.
func tableCore(t *testing.T, doc string, backend store.Store, clk *steppedClock) *Core {
	t.Helper()
	return tableCoreConfig(t, CoreConfig{}, doc, backend, clk)
}

// tableCoreConfig is tableCore with cfg (its Wait a no-op: a delay
// rule's hold is not the tests' time).
func tableCoreConfig(t *testing.T, cfg CoreConfig, doc string, backend store.Store, clk *steppedClock) *Core {
	t.Helper()
	rs, err := rules.ParseRules([]byte(doc))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	if backend == nil {
		backend = store.NewMemStore(clk)
	}
	lim, err := window.New(window.Config{Clock: clk}, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	blocks, err := blockcache.New(blockcache.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(blocks.Close)
	sl := slots.New(slots.Config{}, backend)
	cfg.Wait = func(time.Duration) {}
	c, err := NewCore(cfg, rs,
		CoreDeps{Limiter: lim, Blocks: blocks, Slots: sl, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// step is one request of a table case, at the case's clock after it
// moved on by after.
type step struct {
	after   time.Duration
	path    string      // default "/"
	addr    string      // default 192.0.2.1
	fields  tableFields // nil: none
	tracked bool
	keep    bool // hold the Verdict (its concurrency slots) to the case's end, or until a later step's release
	release bool // Finish the Verdicts kept so far before deciding

	outcome Outcome
	status  int
	rule    string  // the answering rule's name, "-" for none; "": not checked
	reason  string  // a substring of Reason
	remain  *uint64 // Quota.Remaining; nil: not checked
	limit   uint64  // Quota.Limit; 0: not checked
	key     string  // Key(), when not ""
	cached  bool    // FromBlockCache
	fb      bool    // Fallback
	// releaseIn is ReleaseAt - Now, when not 0.
	releaseIn time.Duration
	// resetIn is ResetAt - Now, when not 0.
	resetIn time.Duration
}

// n is a Quota.Remaining a step wants.
func n(v uint64) *uint64 { return &v }

// The decision core over the in-memory store, stepped through requests at
// times the test chooses (Request.Now and the store's clock together):
// matching, keys, cost, shadow rules, the block cache, the failure
// policy, concurrency slots and the verdict's status and quota.
func TestCoreDecideTable(t *testing.T) {
	apiKey := func(k string) tableFields { return tableFields{"h:x-api-key": {k}} }
	for _, tt := range []struct {
		name  string
		rules string
		store store.Store // nil: a MemStore on the case's clock
		steps []step
	}{
		{name: "first match decides alone", rules: `
rules:
  - {name: tight, path_prefix: /api, limit: 1, window: 1m, mode: sync}
  - {name: roomy, limit: 5, window: 1m, mode: sync}`,
			steps: []step{
				{path: "/api/x", outcome: Allowed, status: 200, rule: "tight", remain: n(0), limit: 1},
				{path: "/api/x", outcome: Limited, status: 429, rule: "tight", remain: n(0)},
				// roomy counted none of them: it has all 5 for another path.
				{path: "/other", outcome: Allowed, status: 200, rule: "roomy", remain: n(4), limit: 5},
			}},
		{name: "match all: every rule counts, the least remaining answers", rules: `
match: all
rules:
  - {name: roomy, limit: 5, window: 1m, mode: sync}
  - {name: tight, path_prefix: /api, limit: 2, window: 1m, mode: sync}`,
			steps: []step{
				{path: "/api", outcome: Allowed, status: 200, rule: "tight", remain: n(1), limit: 2},
				{path: "/other", outcome: Allowed, status: 200, rule: "roomy", remain: n(3)},
				{path: "/api", outcome: Allowed, status: 200, rule: "tight", remain: n(0)},
				{path: "/api", outcome: Limited, status: 429, rule: "tight"},
				// roomy counted the refused request as well (it came first).
				{path: "/other", outcome: Allowed, status: 200, rule: "roomy", remain: n(0)},
				{path: "/other", outcome: Limited, status: 429, rule: "roomy"},
			}},
		{name: "header key: each key its own budget", rules: `
rules:
  - {name: k, key: ["header:X-API-Key"], limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{fields: apiKey("a"), outcome: Allowed, key: "a"},
				{fields: apiKey("a"), outcome: Limited, rule: "k", key: "a"},
				{fields: apiKey("b"), outcome: Allowed, key: "b"},
				// The same client without the key falls back to its address.
				{outcome: Allowed, key: FallbackKeyTag + "192.0.2.1"},
			}},
		{name: "two-part key", rules: `
rules:
  - {name: k, key: ["header:X-API-Key", "query:user"], limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{fields: tableFields{"h:x-api-key": {"a"}, "q:user": {"u1"}}, outcome: Allowed, key: "\x01a\x02u1"},
				{fields: tableFields{"h:x-api-key": {"a"}, "q:user": {"u2"}}, outcome: Allowed, key: "\x01a\x02u2"},
				{fields: tableFields{"h:x-api-key": {"a"}, "q:user": {"u1"}}, outcome: Limited},
			}},
		{name: "missing key: ip", rules: `
rules:
  - {name: k, key: ["cookie:sid"], missing_key: ip, limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{addr: "198.51.100.7", outcome: Allowed, rule: "k", key: FallbackKeyTag + "198.51.100.7"},
				{addr: "198.51.100.7", fields: tableFields{"c:sid": {""}}, outcome: Limited, rule: "k"}, // empty is missing
				{addr: "198.51.100.8", outcome: Allowed, rule: "k"},
				{addr: "198.51.100.7", fields: tableFields{"c:sid": {"s"}}, outcome: Allowed, key: "s"},
			}},
		{name: "missing key: skip", rules: `
rules:
  - {name: k, key: ["header:X-API-Key"], missing_key: skip, limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed, status: 200, rule: "-"},
				{outcome: Allowed, status: 200, rule: "-"},
				{fields: apiKey("a"), outcome: Allowed, rule: "k"},
				{fields: apiKey("a"), outcome: Limited, rule: "k"},
			}},
		{name: "missing key: skip falls through to the next rule", rules: `
rules:
  - {name: k, key: ["header:X-API-Key"], missing_key: skip, limit: 1, window: 1m, mode: sync}
  - {name: anon, limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed, rule: "anon"},
				{outcome: Limited, rule: "anon"},
			}},
		{name: "missing key: deny", rules: `
rules:
  - {name: k, key: ["header:X-API-Key"], missing_key: deny, limit: 5, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Denied, status: 400, rule: "k", reason: "lacks the key"},
				{fields: apiKey(""), outcome: Denied, status: 400, rule: "k", reason: "lacks the key"},
				{fields: apiKey("a"), outcome: Allowed, status: 200, rule: "k", remain: n(4)},
			}},
		{name: "duplicate key: refuse", rules: `
rules:
  - {name: k, key: ["query:key"], limit: 5, window: 1m, mode: sync}`,
			steps: []step{
				{fields: tableFields{"q:key": {"a", "b"}}, outcome: Denied, status: 400, rule: "k", reason: "more than once"},
				// A duplicated part outranks a missing one: no fallback to the address.
				{fields: tableFields{"q:key": {"", "b"}}, outcome: Denied, status: 400, reason: "more than once"},
				{fields: tableFields{"q:key": {"a"}}, outcome: Allowed, remain: n(4), key: "a"},
			}},
		{name: "duplicate key: first and last", rules: `
rules:
  - {name: first, path_prefix: /f, key: ["header:X-API-Key"], duplicate_key: first, limit: 1, window: 1m, mode: sync}
  - {name: last, path_prefix: /l, key: ["header:X-API-Key"], duplicate_key: last, limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{path: "/f", fields: tableFields{"h:x-api-key": {"a", "b"}}, outcome: Allowed, key: "a"},
				{path: "/f", fields: apiKey("a"), outcome: Limited, key: "a"},
				{path: "/f", fields: apiKey("b"), outcome: Allowed, key: "b"},
				{path: "/l", fields: tableFields{"h:x-api-key": {"a", "b"}}, outcome: Allowed, key: "b"},
				{path: "/l", fields: apiKey("b"), outcome: Limited, key: "b"},
			}},
		{name: "fixed cost", rules: `
rules:
  - {name: c, cost: 3, limit: 5, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed, remain: n(2), limit: 5},
				{outcome: Limited, status: 429},
			}},
		{name: "cost header within bounds and over max_cost", rules: `
rules:
  - {name: c, cost_header: X-Cost, max_cost: 4, limit: 10, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed, remain: n(9)}, // no header: the rule's cost, 1
				{fields: tableFields{"h:x-cost": {"4"}}, outcome: Allowed, remain: n(5)},
				{fields: tableFields{"h:x-cost": {"5"}}, outcome: Denied, status: 400, reason: "within the rule's bounds"},
				{fields: tableFields{"h:x-cost": {"0"}}, outcome: Denied, reason: "within the rule's bounds"},
				{fields: tableFields{"h:x-cost": {"2x"}}, outcome: Denied, reason: "within the rule's bounds"},
				{fields: tableFields{"h:x-cost": {"1", "1"}}, outcome: Denied, reason: "more than once"},
				// None of the refused costs counted.
				{fields: tableFields{"h:x-cost": {"4"}}, outcome: Allowed, remain: n(1)},
				{fields: tableFields{"h:x-cost": {"2"}}, outcome: Limited, status: 429},
			}},
		{name: "shadow rule counts and never refuses", rules: `
rules:
  - {name: s, shadow: true, limit: 1, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed, status: 200, rule: "s", remain: n(0)},
				{outcome: Allowed, status: 200, rule: "s", remain: n(0)},
				{outcome: Allowed, status: 200, rule: "s", remain: n(0)},
			}},
		{name: "shadow rule under match all: the enforcing rule still refuses", rules: `
match: all
rules:
  - {name: s, shadow: true, limit: 1, window: 1m, mode: sync}
  - {name: real, limit: 2, window: 1m, mode: sync}`,
			steps: []step{
				{outcome: Allowed},
				{outcome: Allowed},
				{outcome: Limited, rule: "real"},
			}},
		{name: "block: refused for the timeout, from the block cache", rules: `
rules:
  - {name: b, limit: 1, window: 1m, action: block, timeout: 10m, mode: sync}`,
			steps: []step{
				{outcome: Allowed},
				{after: time.Second, outcome: Limited, status: 429, rule: "b", releaseIn: 10 * time.Minute},
				{after: time.Minute, outcome: Limited, cached: true, releaseIn: 9 * time.Minute},
				// The cached refusals still count (a blocked client's rate
				// stays visible): one a minute before the release would
				// refuse again, so the next request comes at the release.
				{after: 9 * time.Minute, outcome: Allowed, rule: "b"},
			}},
		{name: "throttle: a refusal is cached until its release", rules: `
rules:
  - {name: f, algorithm: fixed_window, limit: 1, window: 1s, mode: sync}`,
			steps: []step{
				// The case's clock starts 100 ms into a second: the window
				// ends 900 ms on.
				{outcome: Allowed, remain: n(0), resetIn: 900 * time.Millisecond},
				{outcome: Limited, releaseIn: 900 * time.Millisecond},
				{after: 400 * time.Millisecond, outcome: Limited, cached: true, releaseIn: 500 * time.Millisecond},
				{after: 500 * time.Millisecond, outcome: Allowed, remain: n(0), resetIn: time.Second},
			}},
		{name: "fail open: the store down admits", store: failingStore{}, rules: `
rules:
  - {name: o, limit: 1, window: 1m, mode: sync, fail: open}`,
			steps: []step{
				{outcome: Allowed, status: 200, rule: "o", fb: true},
				{outcome: Allowed, status: 200, rule: "o", fb: true},
			}},
		{name: "fail closed: the store down refuses", store: failingStore{}, rules: `
rules:
  - {name: c, limit: 5, window: 1m, mode: sync, fail: closed}`,
			steps: []step{
				{outcome: Limited, status: 429, rule: "c", fb: true},
			}},
		{name: "concurrency slots", rules: `
rules:
  - {name: conc, kind: concurrency, limit: 2}`,
			steps: []step{
				{tracked: true, keep: true, outcome: Allowed, rule: "conc", limit: 2},
				{tracked: true, keep: true, outcome: Allowed, rule: "conc"},
				{tracked: true, outcome: Limited, status: 429, rule: "conc"},
				// An untracked request (decision mode) is not under the rule.
				{outcome: Allowed, rule: "-"},
				// Finishing the held requests gives their slots back.
				{release: true, tracked: true, outcome: Allowed, rule: "conc"},
			}},
		{name: "concurrency fail closed with the store down", store: failingStore{}, rules: `
rules:
  - {name: conc, kind: concurrency, limit: 2, fail: closed}`,
			steps: []step{
				{tracked: true, outcome: Limited, status: 429, fb: true},
			}},
		{name: "quota of a sliding window, stepped past it", rules: `
rules:
  - {name: w, limit: 2, window: 10s, mode: sync}`,
			steps: []step{
				{outcome: Allowed, remain: n(1), limit: 2},
				{outcome: Allowed, remain: n(0)},
				{after: time.Second, outcome: Limited, status: 429, remain: n(0)},
				// Two windows on, the old counts are gone.
				{after: 20 * time.Second, outcome: Allowed, remain: n(1)},
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newSteppedClock()
			c := tableCore(t, tt.rules, tt.store, clk)
			var kept []*Verdict
			defer func() {
				for _, d := range kept {
					c.Finish(d)
				}
			}()
			for i, s := range tt.steps {
				clk.t = clk.t.Add(s.after)
				if s.release {
					for _, d := range kept {
						c.Finish(d)
					}
					kept = nil
				}
				req := &Request{Host: []byte("api.example.com"), Method: []byte("GET"), Path: []byte(cmpOr(s.path, "/")),
					Addr: netip.MustParseAddr(cmpOr(s.addr, "192.0.2.1")), Now: clk.t, Tracked: s.tracked}
				if s.fields != nil {
					req.Fields = s.fields
				}
				d := c.Decide(req)
				checkVerdict(t, i, s, d, clk.t)
				if s.keep {
					kept = append(kept, d)
				} else {
					c.Finish(d)
				}
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// checkVerdict reports how d differs from what step i wants.
func checkVerdict(t *testing.T, i int, s step, d *Verdict, now time.Time) {
	t.Helper()
	if d.Outcome != s.outcome {
		t.Fatalf("step %d: outcome %v (reason %q), want %v", i, d.Outcome, d.Reason, s.outcome)
	}
	if s.status != 0 && d.Status() != s.status {
		t.Errorf("step %d: status %d, want %d", i, d.Status(), s.status)
	}
	rule := "-"
	if d.Quota.Rule != nil {
		rule = d.Quota.Rule.Name
	}
	if s.rule != "" && rule != s.rule {
		t.Errorf("step %d: answered by rule %q, want %q", i, rule, s.rule)
	}
	if s.reason != "" && !strings.Contains(d.Reason, s.reason) {
		t.Errorf("step %d: reason %q, want it to say %q", i, d.Reason, s.reason)
	}
	if s.remain != nil && d.Quota.Remaining != *s.remain {
		t.Errorf("step %d: remaining %d, want %d", i, d.Quota.Remaining, *s.remain)
	}
	if s.limit != 0 && d.Quota.Limit != s.limit {
		t.Errorf("step %d: limit %d, want %d", i, d.Quota.Limit, s.limit)
	}
	if s.key != "" && string(d.Key()) != s.key {
		t.Errorf("step %d: key %q, want %q", i, d.Key(), s.key)
	}
	if d.FromBlockCache != s.cached {
		t.Errorf("step %d: from the block cache %v, want %v", i, d.FromBlockCache, s.cached)
	}
	if d.Fallback != s.fb {
		t.Errorf("step %d: fallback %v, want %v", i, d.Fallback, s.fb)
	}
	at := now.UnixNano()
	if got := time.Duration(d.Quota.ReleaseAt - at); s.releaseIn != 0 && got != s.releaseIn {
		t.Errorf("step %d: released in %v, want %v", i, got, s.releaseIn)
	}
	if got := time.Duration(d.Quota.ResetAt - at); s.resetIn != 0 && got != s.resetIn {
		t.Errorf("step %d: resets in %v, want %v", i, got, s.resetIn)
	}
}

// DecideKey (the decide endpoint's and Envoy's entry) decides a key under
// a rule by index: what it cannot decide is Undecidable (404 for no such
// rule, 422 for one no key decides), a cost above the
// rule's bound Denied, and a request's own limit answers over the rule's
// count.
func TestCoreDecideKeyTable(t *testing.T) {
	clk := newSteppedClock()
	c := tableCore(t, `
rules:
  - {name: r, limit: 5, window: 1m, max_cost: 3, cost_header: X-Cost, mode: sync}
  - {name: conc, kind: concurrency, limit: 1}`, nil, clk)
	g := c.Current()
	for i, tt := range []struct {
		index       int
		key         string
		cost, limit uint64
		outcome     Outcome
		status      int
		reason      string
		remain      uint64
		quotaLimit  uint64
	}{
		{index: 2, key: "k", cost: 1, outcome: Undecidable, status: 404, reason: "no such rule"},
		{index: -1, key: "k", cost: 1, outcome: Undecidable, status: 404, reason: "no such rule"},
		{index: 1, key: "k", cost: 1, outcome: Undecidable, status: 422, reason: "live requests"},
		{index: 0, key: "k", cost: 4, outcome: Denied, status: 400, reason: "above the rule's bound"},
		{index: 0, key: "k", cost: 0, outcome: Allowed, status: 200, remain: 5, quotaLimit: 5}, // a check counts nothing
		{index: 0, key: "k", cost: 3, outcome: Allowed, status: 200, remain: 2, quotaLimit: 5},
		// The request's own limit of 4: the rule holds 3, 1 more fits.
		{index: 0, key: "k", cost: 1, limit: 4, outcome: Allowed, status: 200, remain: 0, quotaLimit: 4},
		{index: 0, key: "k", cost: 1, limit: 4, outcome: Limited, status: 429, remain: 0, quotaLimit: 4},
		{index: 0, key: "other", cost: 1, outcome: Allowed, remain: 4, quotaLimit: 5},
	} {
		d := c.DecideKey(g, clk.t, tt.index, []byte(tt.key), tt.cost, tt.limit)
		if d.Outcome != tt.outcome {
			t.Errorf("%d: DecideKey(%d, %q, cost %d, limit %d) = %v (%q), want %v", i, tt.index, tt.key, tt.cost, tt.limit, d.Outcome, d.Reason, tt.outcome)
		} else {
			if tt.status != 0 && d.Status() != tt.status {
				t.Errorf("%d: status %d, want %d", i, d.Status(), tt.status)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("%d: reason %q, want it to say %q", i, d.Reason, tt.reason)
			}
			if tt.quotaLimit != 0 && (d.Quota.Remaining != tt.remain || d.Quota.Limit != tt.quotaLimit) {
				t.Errorf("%d: remaining %d of %d, want %d of %d", i, d.Quota.Remaining, d.Quota.Limit, tt.remain, tt.quotaLimit)
			}
		}
		c.Finish(d)
	}
}

// Load shedding (a front end that proxies, Upstream) sheds by priority
// class as the upstream fills, 503 released a second on, and lets
// critical routes through until it is full.
func TestCoreShedTable(t *testing.T) {
	clk := newSteppedClock()
	c := tableCoreConfig(t, CoreConfig{Upstream: true}, `
shedding: {max_in_flight: 10, reserved: 0.1}
rules:
  - {name: low, kind: shed, path_prefix: /reports, priority: low}
  - {name: crit, kind: shed, path_prefix: /login, priority: critical}
  - {name: r, limit: 1000, window: 1m}`, nil, clk)
	for _, tt := range []struct {
		inflight int
		path     string
		outcome  Outcome
		status   int
	}{
		{0, "/reports", Allowed, 200},
		{5, "/reports", Allowed, 200}, // low sheds from 0.6 × 0.9 = 54 %
		{6, "/reports", Shed, 503},
		{6, "/", Allowed, 200}, // normal from 72 %
		{8, "/", Shed, 503},
		{9, "/login", Allowed, 200}, // critical only when full
		{10, "/login", Shed, 503},
	} {
		var begun []time.Time
		for range tt.inflight {
			begun = append(begun, c.BeginUpstream())
		}
		d := c.Decide(&Request{Host: []byte("h"), Method: []byte("GET"), Path: []byte(tt.path),
			Addr: netip.MustParseAddr("192.0.2.1"), Now: clk.t})
		if d.Outcome != tt.outcome || d.Status() != tt.status {
			t.Errorf("%d in flight, %s: %v (%d), want %v (%d)", tt.inflight, tt.path, d.Outcome, d.Status(), tt.outcome, tt.status)
		}
		if d.Outcome == Shed && d.Quota.ReleaseAt != clk.t.Add(time.Second).UnixNano() {
			t.Errorf("%d in flight, %s: shed until %d, want a second on (%d)", tt.inflight, tt.path, d.Quota.ReleaseAt, clk.t.Add(time.Second).UnixNano())
		}
		c.Finish(d)
		for _, b := range begun {
			c.EndUpstream(b)
		}
	}
}
