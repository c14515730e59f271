package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse feeds any bytes to Parse. It must not panic; a refusal must be a
// *LoadError of classified FieldErrors; an accepted file's every limit must
// be found again by the lookups its own keys make, as the oracle finds it.
// Its corpus is every testdata file: ratelimit's README examples and the
// shapes of ratelimit's own tests.
func FuzzParse(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*", "*.yaml"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no testdata: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(quirks))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, window: 1d12h, algorithm: token_bucket, burst: 3}\n"))
	f.Add([]byte("domain: d\ndescriptors: &x\n  - key: k\n    descriptors: *x\n"))
	f.Add([]byte("domain: d\nbase: &b {unit: second}\ndescriptors:\n  - key: k\n    rate_limit: {<<: *b, requests_per_unit: 2}\n"))

	sentinels := []error{ErrSyntax, ErrUnknownField, ErrType, ErrInvalid, ErrDuplicateDomain, ErrDuplicateDescriptor, ErrTooLarge}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Loader{MaxNodes: 20_000}.Load(map[string][]byte{"fuzz.yaml": data})
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || len(le.Errors) == 0 {
				t.Fatalf("error %T %v, want a *LoadError", err, err)
			}
			for _, fe := range le.Errors {
				classified := false
				for _, s := range sentinels {
					classified = classified || errors.Is(fe, s)
				}
				if !classified || fe.Reason == "" || fe.File != "fuzz.yaml" {
					t.Fatalf("unclassified or anonymous error %#v", fe)
				}
			}
			_ = err.Error()
			return
		}
		if len(c.Domains()) != 1 {
			t.Fatalf("accepted file with domains %v", c.Domains())
		}
		domain := c.Domains()[0]
		for _, l := range c.Limits() {
			if l.Domain != domain || !strings.HasPrefix(l.FullKey, domain+".") {
				t.Fatalf("limit %q of domain %q in a file of %q", l.FullKey, l.Domain, domain)
			}
			if !l.Unlimited && l.Window <= 0 {
				t.Fatalf("limit %q without a window", l.FullKey)
			}
			// Entries made of the limit's own path: each level's "key" and
			// "value" split at the first '_' (so not always the level's).
			var entries []Entry
			for _, part := range strings.Split(strings.TrimPrefix(l.FullKey, domain+"."), ".") {
				k, v, _ := strings.Cut(part, "_")
				entries = append(entries, Entry{Key: k, Value: v})
			}
			compare(t, c, domain, entries)
			compare(t, c, domain, append(entries, Entry{Key: "extra", Value: "x"}))
		}
	})
}
