package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEventsKeyFlag: -events-key-file sets the key that signs the decision
// events, and refuses, naming the flag and the reason, a key shorter than
// 32 bytes or a file it cannot read.
func TestEventsKeyFlag(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	key := strings.Repeat("ab", 32)
	if err := os.WriteFile(good, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte(key[:31]), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := parseFlags([]string{"-events-key-file", good}, io.Discard)
	if err != nil || string(o.EventsKey) != key {
		t.Errorf("a 64-byte key: got %q, %v; want the key", o.EventsKey, err)
	}
	if o, _, _ := parseFlags(nil, io.Discard); o.EventsKey != nil {
		t.Errorf("default: got key %q, want none", o.EventsKey)
	}
	for _, tc := range []struct{ file, want string }{
		{short, "31 bytes: at least 32 required"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		_, _, err := parseFlags([]string{"-events-key-file", tc.file}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-events-key-file") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-events-key-file %s: got %v, want an error naming the flag and saying %q", tc.file, err, tc.want)
		}
	}
}
