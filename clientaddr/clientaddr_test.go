package clientaddr_test

import (
	"strings"
	"testing"

	"github.com/poplimit/poplimit/clientaddr"
)

// FuzzParsePrefixes: a trusted-proxy list is parsed or refused naming the
// bad entry, never a panic; every accepted prefix is masked, and a bare
// address is its own /32 or /128.
func FuzzParsePrefixes(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8, 192.0.2.1", "::ffff:10.0.0.1", "2001:db8::/33", "10.0.0.1/33", ",,", "x/8", "10.0.0.0/08", "fe80::1%eth0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := clientaddr.ParsePrefixes(s)
		if err != nil {
			if !strings.Contains(err.Error(), "trusted proxy") {
				t.Fatalf("error %q does not name the field", err)
			}
			return
		}
		for _, p := range ps {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("%q: accepted %v, not a masked prefix", s, p)
			}
		}
	})
}
