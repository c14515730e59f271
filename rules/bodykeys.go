package rules

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Keys from the request body: "form:NAME" reads a field of an
// application/x-www-form-urlencoded body (the WHATWG URL standard's
// application/x-www-form-urlencoded parser), "json:/POINTER" a member of
// a JSON body (RFC 8259) named by a JSON Pointer (RFC 6901). The front
// ends read a bounded prefix of the body, and only for requests that a
// rule with such a key matches (package decision).

// MaxPointerTokens bounds the reference tokens of a JSON Pointer key, and
// so how deep in a JSON body a key may sit.
const MaxPointerTokens = 32

// maxBodyKeyName bounds a form field name or a JSON Pointer as written.
const maxBodyKeyName = 256

// KeyCase is how a rule compares the field values of its key.
type KeyCase uint8

const (
	// KeyCaseSensitive keys by the values as sent (the default).
	KeyCaseSensitive KeyCase = iota
	// KeyCaseInsensitive keys by the values trimmed of Unicode blanks,
	// normalized to NFKC and case folded (Unicode full case folding), so
	// that "ALICE@example.com", " alice@Example.com" and its full-width
	// form are one key: accounts that one origin looks up without regard
	// to case share one counter.
	KeyCaseInsensitive
)

var keyCaseNames = []string{"sensitive", "insensitive"}

func (k KeyCase) String() string { return enumName(keyCaseNames, int(k)) }

// BodyKey reports whether a part of r's key is read from the request
// body (form: or json:).
func (r *Rule) BodyKey() bool {
	for _, p := range r.Key {
		if p.Source == KeyForm || p.Source == KeyJSON {
			return true
		}
	}
	return false
}

// parseBodyKeyPart parses the name of a form: or json: key part.
func parseBodyKeyPart(src, name string, hasName bool) (KeyPart, string) {
	if src == "form" {
		if !hasName || name == "" {
			return KeyPart{}, `needs a name, as in "form:NAME"`
		}
		if len(name) > maxBodyKeyName || !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0 {
			return KeyPart{}, "a form field name is 1 to " + strconv.Itoa(maxBodyKeyName) + " bytes of UTF-8 without control characters"
		}
		return KeyPart{Source: KeyForm, Name: name}, ""
	}
	switch {
	case !hasName || name == "":
		return KeyPart{}, `needs a JSON Pointer (RFC 6901), as in "json:/user/email"`
	case name[0] != '/':
		return KeyPart{}, `a JSON Pointer (RFC 6901) starts with "/"`
	case len(name) > maxBodyKeyName || !utf8.ValidString(name):
		return KeyPart{}, "a JSON Pointer of at most " + strconv.Itoa(maxBodyKeyName) + " bytes of UTF-8"
	}
	toks := strings.Split(name[1:], "/")
	if len(toks) > MaxPointerTokens {
		return KeyPart{}, "a JSON Pointer of at most " + strconv.Itoa(MaxPointerTokens) + " reference tokens"
	}
	for _, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || t[j+1] != '0' && t[j+1] != '1') {
				return KeyPart{}, `a JSON Pointer writes "~" only as "~0" or "~1" (RFC 6901)`
			}
		}
	}
	return KeyPart{Source: KeyJSON, Name: name}, ""
}

// PointerTokens returns the reference tokens of a KeyJSON part's
// pointer, ~1 and ~0 decoded: "/a~1b/0" is ["a/b", "0"]. The request
// path reads them from Name without allocating (package decision).
func (p KeyPart) PointerTokens() []string {
	if p.Source != KeyJSON || len(p.Name) == 0 {
		return nil
	}
	toks := strings.Split(p.Name[1:], "/")
	for i, t := range toks {
		// ~1 first, then ~0: "~01" is "~1", not "/" (RFC 6901 §4).
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks
}

// parseKeyCase parses key_case; fieldKey says the rule has a key part
// other than the client IP.
func parseKeyCase(f *fields, y ruleYAML, r *Rule, fieldKey bool) {
	var ok bool
	if r.KeyCase, ok = parseEnum[KeyCase](keyCaseNames, y.KeyCase); !ok {
		f.fail("key_case", strconv.Quote(y.KeyCase), "must be one of "+strings.Join(keyCaseNames, ", "))
		return
	}
	f.only(y.KeyCase != "", "key_case", strconv.Quote(y.KeyCase), fieldKey,
		"rules keyed by a header, query parameter, cookie, form field or JSON member")
}
