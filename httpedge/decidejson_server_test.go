package httpedge_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// FuzzDecideBody: whatever the body, the JSON endpoint answers with one of
// its statuses and a body, and never panics; a body over MaxDecisionBody
// is answered 413; a key or rule that does not decode exactly (bytes that
// are not UTF-8, half a surrogate pair) is refused 400 naming the field,
// never decided as the U+FFFD that encoding/json would make of it; rule,
// key or cost given twice or in another case, or cost 0, is refused 400
// naming the field.
func FuzzDecideBody(f *testing.F) {
	for _, s := range []string{`{"rule":"api","key":"k","cost":2}`, `{"rule":"api","key":""}`, `{"rule":"nope","key":"k"}`,
		`{"rule":"uploads","key":"k"}`, `{"rule":"api","key":"k","cost":-1}`, `{"rule":"api","key":"k","cost":1e99}`, `[`, `null`, ``,
		"{\"rule\":\"api\",\"key\":\"\xff\"}", `{"rule":"api","key":"\ud800"}`, `{"rule":"api","key":"\udfff\ud800"}`,
		`{"rule":"api","key":"\ud83d\ude00"}`, `{"rule":"api","key":"\ufffd"}`, `{"rule":"api","key":"\\ud800"}`,
		`{"rule":"api","key":"\ud800\u0041"}`, `{"rule":"api","key":12}`, `{"rule":"\ud800","key":"k"}`, `{"rule":"api","key":null}`,
		`{"rule":"api","key":"k","KEY":"\udc00"}`, `{"rule":"api","key":"\ufffd\ud800"}`, `{"rule":"api","key":"k","pad":"` + strings.Repeat("p", fuzzBound) + `"}`,
		`{"rule":"api","key":"k","RULE":"uploads"}`, `{"rule":"api","rule":"nope","key":"k"}`, `{"key":"a","key":"b","rule":"api"}`,
		"{\"rule\":\"api\",\"\u212aey\":\"k\"}", `{"rule":"api","key":"k","cost":0}`, `{"rule":"api","key":"k","cost":1,"Cost":1}`,
		`{"rule":"api","key":"k","x":1,"x":1}`, `{"\u0072ule":"api","rule":"api","key":"k"}`} {
		f.Add([]byte(s))
	}
	e := newEdge(f, edgeOpts{cfg: httpedge.Config{DecideToken: "fuzz-token-of-16-bytes", MaxDecisionBody: fuzzBound}, rules: `
rules:
  - {name: api, limit: 3, window: 1m}
  - {name: uploads, kind: concurrency, limit: 1}
`})
	h := e.srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		var ctx fasthttp.RequestCtx
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://x/_poplimit/decide")
		req.Header.Set("Authorization", "Bearer fuzz-token-of-16-bytes")
		req.SetBody(body)
		ctx.Init(&req, nil, nil)
		h(&ctx)
		status := ctx.Response.StatusCode()
		switch status {
		case 200, 400, 404, 413, 422, 429:
		default:
			t.Fatalf("body %q: status %d", body, status)
		}
		if len(ctx.Response.Body()) == 0 {
			t.Fatalf("body %q: an empty answer", body)
		}
		if n := testenv.MetricSum(t, e.reg, "poplimit_edge_panics_total"); n != 0 {
			t.Fatalf("body %q: %v panics", body, n)
		}
		if (len(body) > fuzzBound) != (status == 413) {
			t.Fatalf("body of %d bytes: status %d, want 413 exactly when over %d", len(body), status, fuzzBound)
		}
		if status == 413 {
			return
		}
		if fields := refusedFields(body); len(fields) > 0 {
			named := false
			for _, f := range fields {
				named = named || bytes.Contains(ctx.Response.Body(), []byte(`"detail":"`+f+` `))
			}
			if status != 400 || !named {
				t.Fatalf("body %q: %v given twice, in another case or not exactly, answered %d %s, want 400 naming one", body, fields, status, ctx.Response.Body())
			}
		}
	})
}

// fuzzBound is FuzzDecideBody's MaxDecisionBody.
const fuzzBound = 2048

// refusedFields returns the fields of a JSON decide body that must get
// it refused, any of which the refusal may name: "rule", "key" or "cost"
// given twice or under a name that folds to it (as encoding/json would
// match it) without being it; "rule" or "key" whose string value
// encoding/json would not decode exactly; "cost" given as 0. It reads the
// top-level object's members; a body that is not one object gives none.
func refusedFields(body []byte) []string {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil
		}
		name := t.(string)
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil
		}
		for _, f := range []string{"rule", "key", "cost"} {
			switch {
			case name == f && seen[f], name != f && strings.EqualFold(name, f):
				out = append(out, f)
			case name == f && (f != "cost" && len(v) > 0 && v[0] == '"' && !spellsExactly(v) || f == "cost" && string(v) == "0"):
				out = append(out, f)
			}
		}
		seen[name] = true
	}
	if t, err := d.Token(); err != nil || t != json.Delim('}') {
		return nil
	}
	if _, err := d.Token(); err != io.EOF {
		return nil // trailing data: refused as not JSON
	}
	return out
}

// spellsExactly reports whether the JSON string token s spells its text
// exactly: s is UTF-8, and its \u escapes, taken as UTF-16 code units in
// runs, decode without a replacement character that they did not spell.
func spellsExactly(s []byte) bool {
	if !utf8.Valid(s) {
		return false
	}
	var units []uint16
	flush := func() bool { // as many U+FFFD decoded as spelled
		spelled := 0
		for _, u := range units {
			if u == utf8.RuneError {
				spelled++
			}
		}
		decoded := strings.Count(string(utf16.Decode(units)), string(utf8.RuneError))
		units = units[:0]
		return decoded == spelled
	}
	for i := 1; i < len(s)-1; i++ {
		if s[i] == '\\' && s[i+1] == 'u' {
			var u uint16
			for _, c := range s[i+2 : i+6] {
				u = u<<4 | uint16(strings.IndexByte("0123456789abcdef", c|0x20))
			}
			units = append(units, u)
			i += 5
			continue
		}
		if !flush() {
			return false
		}
		if s[i] == '\\' {
			i++ // an escaped character other than u
		}
	}
	return flush()
}

// TestDecideJSONKeysAreExact: keys (and rules) that are not UTF-8 text,
// raw bytes or half a surrogate pair, are refused 400 problem+json naming
// the field, not decided as U+FFFD, where four different keys would share
// one counter; a key that spells U+FFFD, or a character as an escaped
// surrogate pair, is decided as exactly that text.
func TestDecideJSONKeysAreExact(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: "rules: [{name: api, limit: 1, window: 1m}]", cfg: httpedge.Config{DecideToken: decideToken}})
	post := func(body string) (int, string, string) {
		resp := postDecide(t, e.addr, decideToken, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	for _, tc := range []struct{ body, field string }{
		{"{\"rule\":\"api\",\"key\":\"\xff\"}", "key"},
		{"{\"rule\":\"api\",\"key\":\"\xfe\"}", "key"},
		{`{"rule":"api","key":"\ud800"}`, "key"},
		{`{"rule":"api","key":"\udfff"}`, "key"},
		{`{"rule":"api","key":"a\ud800\u0041"}`, "key"},
		{"{\"rule\":\"api\",\"key\":\"\xed\xa0\x80\"}", "key"}, // a surrogate encoded in UTF-8
		{"{\"rule\":\"ap\xffi\",\"key\":\"k\"}", "rule"},
		{`{"rule":"api","key":7}`, "key"},
	} {
		status, ct, body := post(tc.body)
		if status != 400 || ct != "application/problem+json" || !strings.Contains(body, `"detail":"`+tc.field+" ") {
			t.Errorf("body %q: %d %s %s, want 400 problem+json naming %s", tc.body, status, ct, body, tc.field)
		}
	}
	// Each exact key has its own counter (limit 1): its first decision is
	// allowed, its second refused.
	for _, tc := range []struct{ name, first, second string }{
		{"U+FFFD spelled raw and escaped", "\"\uFFFD\"", `"\ufffd"`},
		{"an emoji raw and as an escaped surrogate pair", "\"\U0001F600\"", `"\ud83d\ude00"`},
		{"an escaped backslash before u", `"\\ud800"`, `"\\ud800"`},
	} {
		for i, k := range []string{tc.first, tc.second} {
			want := []int{200, 429}[i]
			if status, _, body := post(`{"rule":"api","key":` + k + `}`); status != want {
				t.Errorf("%s: key %s: %d %s, want %d", tc.name, k, status, body, want)
			}
		}
	}
}

// TestDecideJSONFieldsOnceAndExact: a field given twice, or under a name
// that differs from it only in case (encoding/json would take the last,
// and match RULE, Rule or a Kelvin-sign "Key" to the field), is refused
// 400 problem+json naming the field, and nothing is spent; cost 0 is
// refused naming cost rather than spending the rule's cost, and a cost
// that is not a whole number names cost too.
func TestDecideJSONFieldsOnceAndExact(t *testing.T) {
	e := startEdge(t, edgeOpts{rules: `
rules:
  - {name: api, limit: 2, window: 1m}
  - {name: big, limit: 1000, window: 1m}
`, cfg: httpedge.Config{DecideToken: decideToken}})
	post := func(body string) (int, string) {
		resp := postDecide(t, e.addr, decideToken, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("body %s: 400 as %s, want problem+json", body, resp.Header.Get("Content-Type"))
		}
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"rule":"api","key":"k","RULE":"big"}`, "rule"},
		{`{"RULE":"big","rule":"api","key":"k"}`, "rule"},
		{`{"rule":"api","key":"k","rule":"big"}`, "rule"},
		{`{"Rule":"api","key":"k"}`, "rule"},
		{`{"rule":"api","key":"k","key":"k2"}`, "key"},
		{`{"rule":"api","KEY":"k"}`, "key"},
		{"{\"rule\":\"api\",\"key\":\"k\",\"\u212aey\":\"k2\"}", "key"}, // KELVIN SIGN folds to k
		{`{"rule":"api","key":"k","\u212aey":"k2"}`, "key"},
		{`{"rule":"api","key":"k","cost":1,"cost":2}`, "cost"},
		{`{"rule":"api","key":"k","Cost":2}`, "cost"},
		{"{\"rule\":\"api\",\"key\":\"k\",\"co\u017ft\":2}", "cost"}, // LATIN SMALL LETTER LONG S folds to s
		{`{"rule":"api","key":"k","cost":0}`, "cost"},
		{`{"rule":"api","key":"k","cost":-1}`, "cost"},
		{`{"rule":"api","key":"k","cost":1.5}`, "cost"},
		{`{"rule":"api","key":"k","cost":"2"}`, "cost"},
		{`{"rule":"api","key":"k","pad":1,"pad":2}`, "pad"},
	} {
		status, body := post(tc.body)
		if status != 400 || !strings.Contains(body, `"detail":"`+tc.field+" ") {
			t.Errorf("body %s: %d %s, want 400 naming %s", tc.body, status, body, tc.field)
		}
	}
	// Nothing was spent: k has its 2 under api, then is refused.
	for i, want := range []int{200, 200, 429} {
		if status, body := post(`{"rule":"api","key":"k"}`); status != want {
			t.Errorf("decision %d of k after the refusals: %d %s, want %d", i+1, status, body, want)
		}
	}
	// A name encoding/json would not fold stays an unknown member, ignored.
	if status, body := post(`{"rule":"api","key":"k3","rules":"big","cost":1}`); status != 200 {
		t.Errorf("an unknown member: %d %s, want 200", status, body)
	}
}
