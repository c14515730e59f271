package decision

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/poplimit/poplimit/rules"
)

// rawFields are Fields over a raw query and one header, for the key
// tests: Query reads the query split on '&' only, percent-decoded.
type rawFields struct {
	query  string
	rawq   []byte
	header []byte
}

func (f rawFields) Header(name string) (first, last []byte, n int) {
	if f.header == nil {
		return nil, nil, 0
	}
	return f.header, f.header, 1
}

func (f rawFields) Query(name string) (first, last []byte, n int) {
	var fv, lv string
	for _, kv := range strings.Split(f.query, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		if decode(k) != name {
			continue
		}
		if n == 0 {
			fv = v
		}
		lv, n = v, n+1
	}
	if n == 0 {
		return nil, nil, 0
	}
	return []byte(decode(fv)), []byte(decode(lv)), n
}

func (f rawFields) Cookie(string) ([]byte, []byte, int) { return nil, nil, 0 }
func (f rawFields) RawQuery() []byte                    { return f.rawq }

// decode percent- and plus-decodes s, an escape that is not one kept.
func decode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '+' {
			c = ' '
		} else if c == '%' && i+2 < len(s) {
			if v, err := url.PathUnescape(s[i : i+3]); err == nil {
				b.WriteString(v)
				i += 2
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

// FuzzKeySplitAndTrim: under query_semicolon: split a query is read as
// one split on both separators by a plain reader; under key_trim: unicode
// a key is its parts trimmed by strings.TrimFunc of IsKeyBlank; a value
// seen twice is a duplicate; the encoding stays injective in shape (one
// part: the value, 0x01 before a leading 0x00 or 0x01; two: uvarint
// lengths). Building a key allocates nothing once dst has room.
func FuzzKeySplitAndTrim(f *testing.F) {
	for _, s := range []string{"key=A;key=B", "x=1;key=A", "key=A%3Bkey=B", "key=k%C2%A0", "key=%E3%80%80k%EF%BB%BF", "key=%00", "key=%01x",
		"key=k+", "key=%", "key=%zz", "&&;;key=a", "key", "key=", "k%65y=v", "key=%C2%A0", "key=\xc2"} {
		f.Add(s, []byte("h\u00a0"), true, true)
		f.Add(s, []byte(" "), false, true)
	}
	f.Fuzz(func(t *testing.T, query string, header []byte, split, trim bool) {
		fl := &rawFields{query: query, rawq: []byte(query), header: header}
		for _, parts := range [][]rules.KeyPart{{{Source: rules.KeyQuery, Name: "key"}}, {{Source: rules.KeyHeader, Name: "h"}, {Source: rules.KeyQuery, Name: "key"}}} {
			r := &rules.Rule{Name: "r", Key: parts}
			if split {
				r.QuerySemicolon = rules.QuerySemicolonSplit
			}
			if trim {
				r.KeyTrim = rules.KeyTrimUnicode
			}
			got, st := AppendKeyStatus(make([]byte, 0, 4096), fl, r, netip.Addr{})
			// The model.
			q := query
			if split {
				q = strings.ReplaceAll(q, ";", "&")
			}
			var vals []string
			for _, kv := range strings.Split(q, "&") {
				if kv == "" {
					continue
				}
				k, v, _ := strings.Cut(kv, "=")
				if decode(k) == "key" {
					vals = append(vals, decode(v))
				}
			}
			clean := func(v string) string {
				if trim {
					v = strings.TrimFunc(v, func(r rune) bool { return r != utf8.RuneError && IsKeyBlank(r) })
				}
				return v
			}
			var want []byte
			wantSt := KeyBuilt
			hv := clean(string(header))
			switch {
			case len(vals) > 1:
				wantSt = KeyDuplicate
			case len(parts) == 2 && (hv == "" || len(vals) == 0 || clean(vals[0]) == ""):
				wantSt = KeyMissing
			case len(parts) == 1 && (len(vals) == 0 || clean(vals[0]) == ""):
				wantSt = KeyMissing
			case len(parts) == 1:
				v := clean(vals[0])
				if v[0] <= 0x01 {
					want = append(want, 0x01)
				}
				want = append(want, v...)
			default:
				want = binary.AppendUvarint(want, uint64(len(hv)))
				want = append(want, hv...)
				v := clean(vals[0])
				want = binary.AppendUvarint(want, uint64(len(v)))
				want = append(want, v...)
			}
			if st != wantSt || st == KeyBuilt && !bytes.Equal(got, want) {
				t.Fatalf("query %q header %q split %v trim %v parts %d: %q status %d, want %q status %d", query, header, split, trim, len(parts), got, st, want, wantSt)
			}
			dst := make([]byte, 0, 4096)
			if n := testing.AllocsPerRun(10, func() { AppendKeyStatus(dst[:0], fl, r, netip.Addr{}) }); n != 0 && split && !raceEnabled {
				t.Fatalf("query %q: %v allocs", query, n)
			}
		}
	})
}
