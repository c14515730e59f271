package decision

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonDepth is how deeply b's brackets nest, strings skipped (for a b
// that encoding/json takes).
func jsonDepth(b []byte) int {
	d, most, str, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case str && c == '\\':
			esc = true
		case c == '"':
			str = !str
		case !str && (c == '{' || c == '['):
			d++
			most = max(most, d)
		case !str && (c == '}' || c == ']'):
			d--
		}
	}
	return most
}

// FuzzScanJSON checks the streaming scan against encoding/json: it takes
// exactly the texts encoding/json takes (within MaxJSONDepth), and the
// value it finds at a pointer is the one encoding/json decodes there
// when the member is unique.
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{
		`{"user":{"email":"a@b"}}`, `{"user":{"email":"a","email":"b"}}`, `{"a":[1,{"b":"\u00e9\ud83d\ude00"}]}`,
		`[]`, `{}`, `"x"`, `{"a":null}`, `{"a":-0.5e+3}`, `{"a":tru}`, `{"a":"\x"}`, `{"a" "b"}`, `{"a":1,}`,
		`[[[[[[[[]]]]]]]]`, `{"\u0075":"v"}`, `{"a/b":{"m~n":"v"}}`, " \t\n{\"a\" : [ \"v\" ] } ",
	} {
		f.Add([]byte(s), "/user/email")
		f.Add([]byte(s), "/a")
		f.Add([]byte(s), "/a/1/b")
	}
	f.Fuzz(func(t *testing.T, b []byte, ptr string) {
		if ptr == "" || ptr[0] != '/' || strings.Contains(strings.ReplaceAll(strings.ReplaceAll(ptr, "~0", ""), "~1", ""), "~") {
			ptr = "/a"
		}
		first, last, n, why := ScanJSON(b, ptr, false)
		valid := json.Valid(b)
		switch {
		case why == BodyTooDeep:
			if jsonDepth(b) <= MaxJSONDepth {
				t.Fatalf("%q: too deep at depth %d", b, jsonDepth(b))
			}
			return
		case valid && jsonDepth(b) <= MaxJSONDepth && why != BodyRead:
			t.Fatalf("%q: encoding/json takes it, the scan says %v", b, why)
		case !valid && why == BodyRead:
			t.Fatalf("%q: encoding/json refuses it, the scan took it", b)
		case why != BodyRead:
			return
		}
		if n == 0 {
			return
		}
		if (first == nil) != (last == nil) && n == 1 {
			t.Fatalf("one match, first %q last %q", first, last)
		}
		// With one match, the scan's value is encoding/json's.
		if n != 1 || !bytes.Equal(first, last) {
			return
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		v, ok := walk(doc, ptr)
		if !ok {
			return // a duplicate name upstream of the target: encoding/json kept another
		}
		switch v := v.(type) {
		case string:
			if got := AppendJSONString(nil, first); utf8.Valid(got) && string(got) != v {
				t.Fatalf("%q at %s: scan %q, encoding/json %q", b, ptr, got, v)
			}
		case nil, map[string]any, []any:
			if first != nil {
				t.Fatalf("%q at %s: scan %q for a %T", b, ptr, first, v)
			}
		}
	})
}

// walk follows ptr in a decoded document.
func walk(doc any, ptr string) (any, bool) {
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch d := doc.(type) {
		case map[string]any:
			v, ok := d[tok]
			if !ok {
				return nil, false
			}
			doc = v
		case []any:
			i := pointerIndex(tok)
			if i < 0 || i >= len(d) {
				return nil, false
			}
			doc = d[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// FuzzScanForm checks the form scan against a plain split: the same
// count of fields called name, the same first and last values.
func FuzzScanForm(f *testing.F) {
	for _, s := range []string{"username=alice&password=x", "username=a&username=b", "user%6Eame=a", "a&&b=&=c",
		"username=%zz", "user+name=a+b", "=x&username", strings.Repeat("a=1&", 2000)} {
		f.Add([]byte(s), "username")
	}
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		first, last, n, why := ScanForm(b, name, false)
		want, wfirst, wlast, fieldsSeen := 0, "", "", 0
		for _, kv := range strings.Split(string(b), "&") {
			if kv == "" {
				continue
			}
			fieldsSeen++
			k, v, _ := strings.Cut(kv, "=")
			if decode(k) == name {
				if want == 0 {
					wfirst = v
				}
				wlast, want = v, want+1
			}
		}
		if fieldsSeen > MaxFormFields {
			if why != BodyTooManyFields {
				t.Fatalf("%d fields: %v", fieldsSeen, why)
			}
			return
		}
		if why != BodyRead || n != want || n > 0 && (string(first) != wfirst || string(last) != wlast) {
			t.Fatalf("%q, %q: scan %d %q %q %v; want %d %q %q", b, name, n, first, last, why, want, wfirst, wlast)
		}
	})
}

// FuzzKeyFold checks key_case: insensitive's folding: it is idempotent
// (a folded key folds to itself), keeps valid UTF-8 valid, and a case
// variant of ASCII text folds as its lower case.
func FuzzKeyFold(f *testing.F) {
	for _, s := range []string{"ALICE@example.com", "ＡＬＩＣＥ＠ｅｘａｍｐｌｅ．ｃｏｍ", "Straße", "ǅ", "ﬁ", "\u0130", "K", "\xff\xfe", "e\u0301"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		once := appendFolded(nil, []byte(s))
		twice := appendFolded(nil, once)
		if !bytes.Equal(once, twice) {
			t.Fatalf("%q folds to %q, then to %q", s, once, twice)
		}
		if utf8.ValidString(s) && !utf8.Valid(once) {
			t.Fatalf("%q folds to invalid UTF-8 %q", s, once)
		}
		ascii := true
		for i := 0; i < len(s); i++ {
			ascii = ascii && s[i] < 0x80
		}
		if ascii && string(once) != strings.ToLower(s) {
			t.Fatalf("ASCII %q folds to %q, want %q", s, once, strings.ToLower(s))
		}
		// A prefix in dst is kept.
		if got := appendFolded([]byte("pre"), []byte(s)); string(got) != "pre"+string(once) {
			t.Fatalf("with a prefix: %q", got)
		}
	})
}
