package rules

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestBodyKeySources parses form: and json: key parts and key_case, and
// refuses bad ones naming the field and the reason.
func TestBodyKeySources(t *testing.T) {
	rs, err := ParseRules([]byte(`
rules:
  - {name: form, path_prefix: /login, key: ["form:username"], key_case: insensitive, limit: 5, window: 15m}
  - {name: json, path_prefix: /api/login, key: ["json:/user/email", "ip"], limit: 5, window: 15m}
  - {name: esc, path_prefix: /esc, key: ["json:/a~1b/m~0n/0"], limit: 5, window: 15m}
  - {name: hdr, path_prefix: /h, key: ["header:X-User"], key_case: sensitive, limit: 5, window: 15m}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := rs.Lookup("form")
	if f.Key[0].Source != KeyForm || f.Key[0].Name != "username" || f.KeyCase != KeyCaseInsensitive || !f.BodyKey() {
		t.Errorf("form rule: %+v, case %v", f.Key, f.KeyCase)
	}
	j := rs.Lookup("json")
	if j.Key[0].Source != KeyJSON || !slices.Equal(j.Key[0].PointerTokens(), []string{"user", "email"}) || j.KeyCase != KeyCaseSensitive || !j.BodyKey() {
		t.Errorf("json rule: %+v", j.Key)
	}
	if e := rs.Lookup("esc"); !slices.Equal(e.Key[0].PointerTokens(), []string{"a/b", "m~n", "0"}) {
		t.Errorf("escaped pointer: %q", e.Key[0].PointerTokens())
	}
	if rs.Lookup("hdr").BodyKey() {
		t.Error("a header rule has no body key")
	}
	if KeyForm.String() != "form" || KeyJSON.String() != "json" {
		t.Errorf("names %q %q", KeyForm, KeyJSON)
	}

	for _, tt := range []struct{ rule, want string }{
		{`key: ["form:"]`, `rules[0].key[0]: needs a name, as in "form:NAME"`},
		{`key: ["form:a\u0001b"]`, `rules[0].key[0]: a form field name is 1 to 256 bytes of UTF-8 without control characters`},
		{`key: ["json:user"]`, `rules[0].key[0]: a JSON Pointer (RFC 6901) starts with "/"`},
		{`key: ["json:"]`, `rules[0].key[0]: needs a JSON Pointer (RFC 6901), as in "json:/user/email"`},
		{`key: ["json:/a~2"]`, `rules[0].key[0]: a JSON Pointer writes "~" only as "~0" or "~1" (RFC 6901)`},
		{`key: ["json:` + strings.Repeat("/a", 33) + `"]`, `rules[0].key[0]: a JSON Pointer of at most 32 reference tokens`},
		{`key: ["form:u"], key_case: lower`, `rules[0].key_case: must be one of sensitive, insensitive`},
		{`key_case: insensitive`, `rules[0].key_case: applies only to rules keyed by a header, query parameter, cookie, form field or JSON member`},
		{`key: ["body:x"]`, `must be "ip", "header:NAME", "query:NAME", "cookie:NAME", "form:NAME" or "json:/POINTER"`},
		{`key: ["json:/u"], query_semicolon: split`, `rules[0].query_semicolon: applies only to rules keyed by a query parameter`},
	} {
		_, err := ParseRules([]byte("rules:\n  - {name: r, limit: 1, window: 1m, " + tt.rule + "}\n"))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to hold %q", tt.rule, err, tt.want)
		}
	}
	// A shed rule takes no key_case.
	if _, err := ParseRules([]byte("rules:\n  - {name: s, kind: shed, priority: low, key_case: insensitive}\n")); err == nil {
		t.Error("a shed rule with key_case parsed")
	}
}
