package decision

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/rules"
)

// bodyFields are Fields over a body and its header fields.
type bodyFields struct {
	header map[string][]string
	hb     map[string][][]byte // header as bytes, built on first use
	body   []byte
	whole  bool
}

func formBody(body string) *bodyFields {
	return &bodyFields{header: map[string][]string{"Content-Type": {"application/x-www-form-urlencoded"}}, body: []byte(body), whole: true}
}

func jsonBody(body string) *bodyFields {
	return &bodyFields{header: map[string][]string{"Content-Type": {"application/json; charset=utf-8"}}, body: []byte(body), whole: true}
}

func (f *bodyFields) Header(name string) ([]byte, []byte, int) {
	if f.hb == nil {
		f.hb = map[string][][]byte{}
		for k, vs := range f.header {
			for _, v := range vs {
				f.hb[k] = append(f.hb[k], []byte(v))
			}
		}
	}
	vs := f.hb[name]
	if len(vs) == 0 {
		return nil, nil, 0
	}
	return vs[0], vs[len(vs)-1], len(vs)
}
func (f *bodyFields) Query(string) ([]byte, []byte, int)  { return nil, nil, 0 }
func (f *bodyFields) Cookie(string) ([]byte, []byte, int) { return nil, nil, 0 }
func (f *bodyFields) Body() ([]byte, bool)                { return f.body, f.whole }

func bodyRule(t *testing.T, y string) *rules.Rule {
	t.Helper()
	rs, err := rules.ParseRules([]byte("rules:\n  - {name: r, limit: 5, window: 15m, " + y + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return rs.Rules[0]
}

var clientIP = netip.MustParseAddr("192.0.2.7")

// Case and Unicode variants of one account share its key under key_case:
// insensitive, in a form field and in a JSON member alike; without it
// they are apart.
func TestBodyKeyCaseVariantsShareKey(t *testing.T) {
	variants := []string{
		"alice@example.com",
		"ALICE@example.com",
		"alice@Example.com",
		"  Alice@EXAMPLE.COM\u00a0",
		"ＡＬＩＣＥ＠ｅｘａｍｐｌｅ．ｃｏｍ",       // full-width
		"\u3000alice@example.com", // an ideographic space
	}
	for _, src := range []string{"form", "json"} {
		t.Run(src, func(t *testing.T) {
			for _, kc := range []string{"insensitive", "sensitive"} {
				y := `key: ["form:username"]`
				if src == "json" {
					y = `key: ["json:/user/email"]`
				}
				r := bodyRule(t, y+", key_case: "+kc)
				keys := map[string]bool{}
				for _, v := range variants {
					var f *bodyFields
					if src == "form" {
						f = formBody("password=x&username=" + strings.ReplaceAll(formEscape(v), " ", "+"))
					} else {
						f = jsonBody(`{"user": {"name": "A", "email": "` + jsonEscape(v) + `"}, "password": "x"}`)
					}
					k, st, why := AppendKeyBody(nil, f, r, clientIP, DefaultBodyKeyBytes)
					if st != KeyBuilt || why != BodyRead {
						t.Fatalf("%s %q: status %d, reason %v", kc, v, st, why)
					}
					keys[string(k)] = true
				}
				switch {
				case kc == "insensitive" && len(keys) != 1:
					t.Errorf("key_case: insensitive: %d keys for one account: %v", len(keys), keys)
				case kc == "insensitive" && !keys["alice@example.com"]:
					t.Errorf("key_case: insensitive: keys %v, want alice@example.com", keys)
				case kc == "sensitive" && len(keys) != len(variants):
					t.Errorf("key_case: sensitive: %d keys, want %d", len(keys), len(variants))
				}
			}
		})
	}
}

// formEscape percent-encodes what a form must: '&', '=', '%', '+' and
// non-ASCII bytes.
func formEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || strings.IndexByte("&=%+", c) >= 0 {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// jsonEscape writes s with every non-ASCII rune of the BMP as \uXXXX,
// as some clients do.
func jsonEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 {
			b.WriteRune(r)
			continue
		}
		fmt.Fprintf(&b, `\u%04X`, r)
	}
	return b.String()
}

func TestBodyKeyValues(t *testing.T) {
	for _, tt := range []struct {
		name, rule string
		f          *bodyFields
		st         KeyStatus
		why        BodyReason
		key        string
	}{
		{"form", `key: ["form:username"]`, formBody("username=bob%40x.io&password=a"), KeyBuilt, BodyRead, "bob@x.io"},
		{"form plus", `key: ["form:user name"]`, formBody("user+name=a+b"), KeyBuilt, BodyRead, "a b"},
		{"form absent", `key: ["form:username"]`, formBody("user=bob"), KeyMissing, BodyAbsent, ""},
		{"form empty", `key: ["form:username"]`, formBody("username=&a=b"), KeyMissing, BodyAbsent, ""},
		{"form blanks", `key: ["form:username"], key_case: insensitive`, formBody("username=+%E3%80%80+"), KeyMissing, BodyAbsent, ""},
		{"form twice", `key: ["form:username"]`, formBody("username=a&username=b"), KeyDuplicate, BodyRead, ""},
		{"form twice first", `key: ["form:username"], duplicate_key: first`, formBody("username=a&username=b"), KeyBuilt, BodyRead, "a"},
		{"form twice last", `key: ["form:username"], duplicate_key: last`, formBody("username=a&username=b"), KeyBuilt, BodyRead, "b"},
		{"form escaped name twice", `key: ["form:username"]`, formBody("username=a&user%6Eame=b"), KeyDuplicate, BodyRead, ""},
		{"form as json", `key: ["form:username"]`, jsonBody(`{"username":"a"}`), KeyMissing, BodyContentType, ""},
		{"json", `key: ["json:/user/email"]`, jsonBody(`{"user":{"email":"a@b"}}`), KeyBuilt, BodyRead, "a@b"},
		{"json escapes", `key: ["json:/us~1er/e~0m"]`, jsonBody(`{"us/er":{"e~m":"\u0041\n\ud83d\ude00"}}`), KeyBuilt, BodyRead, "A\n\U0001F600"},
		{"json escaped name", `key: ["json:/user"]`, jsonBody(`{"\u0075ser":"x"}`), KeyBuilt, BodyRead, "x"},
		{"json index", `key: ["json:/accounts/1/id"]`, jsonBody(`{"accounts":[{"id":"a"},{"id":"b"}]}`), KeyBuilt, BodyRead, "b"},
		{"json number", `key: ["json:/id"]`, jsonBody(`{"id": 12345}`), KeyBuilt, BodyRead, "12345"},
		{"json null", `key: ["json:/id"]`, jsonBody(`{"id": null}`), KeyMissing, BodyAbsent, ""},
		{"json object", `key: ["json:/id"]`, jsonBody(`{"id": {"a": 1}}`), KeyMissing, BodyAbsent, ""},
		{"json absent", `key: ["json:/user/email"]`, jsonBody(`{"user":{"name":"a"}}`), KeyMissing, BodyAbsent, ""},
		{"json twice", `key: ["json:/user/email"]`, jsonBody(`{"user":{"email":"a","email":"b"}}`), KeyDuplicate, BodyRead, ""},
		{"json twice apart", `key: ["json:/user/email"]`, jsonBody(`{"user":{"email":"a"},"user":{"email":"b"}}`), KeyDuplicate, BodyRead, ""},
		{"json twice last", `key: ["json:/user/email"], duplicate_key: last`, jsonBody(`{"user":{"email":"a","email":"b"}}`), KeyBuilt, BodyRead, "b"},
		{"json malformed", `key: ["json:/user"]`, jsonBody(`{"user":"a",}`), KeyMissing, BodyMalformed, ""},
		{"json trailing", `key: ["json:/user"]`, jsonBody(`{"user":"a"} {"user":"b"}`), KeyMissing, BodyMalformed, ""},
		{"json bad escape", `key: ["json:/user"]`, jsonBody(`{"user":"\x"}`), KeyMissing, BodyMalformed, ""},
		{"json cut", `key: ["json:/user"]`, jsonBody(`{"user":"a"`), KeyMissing, BodyMalformed, ""},
		{"json plus type", `key: ["json:/user"]`, &bodyFields{header: map[string][]string{"Content-Type": {"application/vnd.api+json"}}, body: []byte(`{"user":"a"}`), whole: true}, KeyBuilt, BodyRead, "a"},
		{"json as text", `key: ["json:/user"]`, &bodyFields{header: map[string][]string{"Content-Type": {"text/plain"}}, body: []byte(`{"user":"a"}`), whole: true}, KeyMissing, BodyContentType, ""},
		{"json two content types", `key: ["json:/user"]`, &bodyFields{header: map[string][]string{"Content-Type": {"application/json", "application/json"}}, body: []byte(`{"user":"a"}`), whole: true}, KeyMissing, BodyContentType, ""},
		{"json gzip", `key: ["json:/user"]`, &bodyFields{header: map[string][]string{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}, body: []byte(`{"user":"a"}`), whole: true}, KeyMissing, BodyContentType, ""},
		{"not whole", `key: ["json:/user"]`, &bodyFields{header: map[string][]string{"Content-Type": {"application/json"}}, body: []byte(`{"user":"a"}`)}, KeyMissing, BodyTooLarge, ""},
		{"with ip", `key: ["json:/user", "ip"]`, jsonBody(`{"user":"a"}`), KeyBuilt, BodyRead, "\x01a\x09192.0.2.7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := bodyRule(t, tt.rule)
			k, st, why := AppendKeyBody(nil, tt.f, r, clientIP, DefaultBodyKeyBytes)
			if st != tt.st || why != tt.why {
				t.Fatalf("status %d, reason %v; want %d, %v", st, why, tt.st, tt.why)
			}
			if st == KeyBuilt && string(k) != tt.key {
				t.Errorf("key %q, want %q", k, tt.key)
			}
		})
	}
	// Fields without a body, and no Fields: unread.
	r := bodyRule(t, `key: ["form:username"]`)
	if _, st, why := AppendKeyBody(nil, rawFields{}, r, clientIP, DefaultBodyKeyBytes); st != KeyMissing || why != BodyUnread {
		t.Errorf("Fields without Body: %d %v", st, why)
	}
	if _, st, why := AppendKeyBody(nil, nil, r, clientIP, DefaultBodyKeyBytes); st != KeyMissing || why != BodyUnread {
		t.Errorf("nil Fields: %d %v", st, why)
	}
}

// Hostile bodies: each has a clear outcome, and reading it costs no
// allocation and no work beyond the bound.
func TestBodyKeyHostile(t *testing.T) {
	huge := append([]byte("username=alice&pad="), bytes.Repeat([]byte("x"), 10<<20)...)
	bomb := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	objBomb := strings.Repeat(`{"a":`, 20000) + "1" + strings.Repeat("}", 20000)
	var many strings.Builder
	for i := range 10000 {
		many.WriteString("f")
		many.WriteString(string(rune('a' + i%26)))
		many.WriteString("=1&")
	}
	many.WriteString("username=alice")
	for _, tt := range []struct {
		name, rule string
		f          *bodyFields
		bound      int
		st         KeyStatus
		why        BodyReason
	}{
		{"10 MiB form", `key: ["form:username"]`, &bodyFields{header: formBody("").header, body: huge, whole: true}, DefaultBodyKeyBytes, KeyMissing, BodyTooLarge},
		{"JSON bomb arrays", `key: ["json:/a"]`, jsonBody(bomb), MaxBodyKeyBytes, KeyMissing, BodyTooDeep},
		{"JSON bomb objects", `key: ["json:/a/a/a"]`, jsonBody(objBomb), MaxBodyKeyBytes, KeyMissing, BodyTooDeep},
		{"JSON bomb, default bound", `key: ["json:/a"]`, jsonBody(bomb), DefaultBodyKeyBytes, KeyMissing, BodyTooLarge},
		{"10,000 fields", `key: ["form:username"]`, formBody(many.String()), MaxBodyKeyBytes, KeyMissing, BodyTooManyFields},
		{"10,000 fields, default bound", `key: ["form:username"]`, formBody(many.String()), DefaultBodyKeyBytes, KeyMissing, BodyTooLarge},
		{"field twice", `key: ["form:username"]`, formBody("username=alice&password=x&username=bob"), DefaultBodyKeyBytes, KeyDuplicate, BodyRead},
		{"member twice", `key: ["json:/username"]`, jsonBody(`{"username":"alice","username":"bob"}`), DefaultBodyKeyBytes, KeyDuplicate, BodyRead},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := bodyRule(t, tt.rule)
			dst := make([]byte, 0, 256)
			var st KeyStatus
			var why BodyReason
			allocs := testing.AllocsPerRun(5, func() {
				_, st, why = AppendKeyBody(dst[:0], tt.f, r, clientIP, tt.bound)
			})
			if st != tt.st || why != tt.why {
				t.Fatalf("status %d, reason %v; want %d, %v", st, why, tt.st, tt.why)
			}
			if allocs != 0 && !raceEnabled {
				t.Errorf("%v allocations reading it, want 0", allocs)
			}
		})
	}
}

// The core counts each fallback by reason, falls back to the client IP by
// default, and refuses under missing_key: deny; WantsBody names only
// requests a body-keyed rule matches.
func TestCoreBodyKeyFallbacks(t *testing.T) {
	clk := newSteppedClock()
	c := tableCore(t, `
rules:
  - {name: login, path_prefix: /login, methods: [POST], key: ["form:username"], key_case: insensitive, limit: 2, window: 15m}
  - {name: api, path_prefix: /api/login, key: ["json:/user/email"], missing_key: deny, limit: 2, window: 15m}
  - {name: rest, path_prefix: /, limit: 100, window: 1m}
`, nil, clk)
	for _, tt := range []struct {
		method, path string
		want         bool
	}{{"POST", "/login", true}, {"GET", "/login", false}, {"POST", "/api/login", true}, {"POST", "/other", false}} {
		if got := c.WantsBody(nil, []byte(tt.method), []byte(tt.path)); got != tt.want {
			t.Errorf("WantsBody(%s %s) = %v", tt.method, tt.path, got)
		}
	}
	decide := func(path string, f Fields, addr string) *Verdict {
		d := c.Decide(&Request{Method: []byte("POST"), Path: []byte(path), Addr: netip.MustParseAddr(addr), Fields: f, Now: clk.Now()})
		t.Cleanup(func() { c.Finish(d) })
		return d
	}
	// Two failures per account, whatever the case and the client IP.
	for i, u := range []string{"Alice", "ALICE", "alice"} {
		d := decide("/login", formBody("username="+u), "192.0.2."+string(rune('1'+i)))
		want := Allowed
		if i == 2 {
			want = Limited
		}
		if d.Outcome != want || string(d.Key()) != "alice" {
			t.Errorf("%s: %v key %q, want %v key alice", u, d.Outcome, d.Key(), want)
		}
	}
	// No field: keyed by the client IP, counted as absent.
	d := decide("/login", formBody("user=alice"), "192.0.2.9")
	if d.Outcome != Allowed || !bytes.HasPrefix(d.Key(), []byte(FallbackKeyTag)) {
		t.Errorf("absent: %v key %q, want the IP fallback", d.Outcome, d.Key())
	}
	decide("/login", &bodyFields{header: formBody("").header, body: []byte("username=a"), whole: false}, "192.0.2.9")
	decide("/login", jsonBody(`{"username":"a"}`), "192.0.2.9")
	if d := decide("/api/login", jsonBody(`{"user":`), "192.0.2.9"); d.Outcome != Denied {
		t.Errorf("malformed under missing_key: deny: %v", d.Outcome)
	}
	for why, want := range map[BodyReason]float64{BodyAbsent: 1, BodyTooLarge: 1, BodyContentType: 1, BodyMalformed: 1, BodyTooDeep: 0} {
		if got := testutil.ToFloat64(c.m.bodyKey[why]); got != want {
			t.Errorf("body_key_fallbacks_total{reason=%q} = %v, want %v", why, got, want)
		}
	}
}

// The decide endpoint's key meets the key a request's body gives for the
// same account under key_case: insensitive.
func TestDecideKeyFolds(t *testing.T) {
	clk := newSteppedClock()
	c := tableCore(t, `
rules:
  - {name: login, key: ["form:username"], key_case: insensitive, limit: 2, window: 15m}
`, nil, clk)
	g := c.Current()
	for i, k := range []string{" Walter ", "WALTER"} {
		d := c.DecideKey(g, clk.Now(), 0, []byte(k), 1, 0)
		if d.Outcome != Allowed || string(d.Key()) != "walter" {
			t.Fatalf("decide %d: %v key %q", i, d.Outcome, d.Key())
		}
		c.Finish(d)
	}
	d := c.Decide(&Request{Method: []byte("POST"), Path: []byte("/"), Addr: clientIP, Fields: formBody("username=walter"), Now: clk.Now()})
	defer c.Finish(d)
	if d.Outcome != Limited {
		t.Errorf("the request after two decides for the account: %v, want limited", d.Outcome)
	}
}

// TestBodyKeyAllocs: a decision keyed by a form field or a JSON member,
// folded or not, allocates nothing once warm, and WantsBody allocates
// nothing with or without body-keyed rules.
func TestBodyKeyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, y := range []string{`key: ["form:username"]`, `key: ["json:/user/email"], key_case: insensitive`, `key: ["header:X-User"]`} {
		clk := newSteppedClock()
		c := tableCore(t, "rules:\n  - {name: r, path_prefix: /login, limit: 1000000000, window: 1h, "+y+"}\n", nil, clk)
		f := Fields(formBody("username=Alice%40Example.com&password=x"))
		if strings.Contains(y, "json") {
			f = jsonBody(`{"user": {"email": "Alice@Example.com"}, "password": "x"}`)
		}
		req := &Request{Method: []byte("POST"), Path: []byte("/login"), Addr: clientIP, Fields: f, Now: clk.Now()}
		if n := testing.AllocsPerRun(100, func() { c.Finish(c.Decide(req)) }); n != 0 {
			t.Errorf("%s: Decide allocates %v times", y, n)
		}
		if n := testing.AllocsPerRun(100, func() { c.WantsBody(nil, req.Method, req.Path) }); n != 0 {
			t.Errorf("%s: WantsBody allocates %v times", y, n)
		}
	}
}
