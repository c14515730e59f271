package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	f()
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc - before
}

// TestReadFileBound: a file over the bound is refused with its name, size
// and the bound, without being read (a 100 MiB file allocates next to
// nothing); a file of the bound's size is read whole.
func TestReadFileBound(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(100 << 20) // sparse
	f.Close()
	var got error
	if n := allocated(func() { _, got = ReadFile(big, 0) }); n > 1<<20 {
		t.Errorf("refusing a 100 MiB file allocated %d bytes", n)
	}
	want := fmt.Sprintf("%s: %d bytes, over the limit of %d bytes a rules file may hold", big, 100<<20, DefaultMaxFileBytes)
	var se *SizeError
	if !errors.Is(got, ErrTooLarge) || !errors.As(got, &se) || !strings.Contains(got.Error(), want) {
		t.Errorf("ReadFile(100 MiB) = %v, want %q", got, want)
	}
	small := filepath.Join(dir, "small.yaml")
	os.WriteFile(small, []byte("0123456789"), 0o644)
	if b, err := ReadFile(small, 10); err != nil || string(b) != "0123456789" {
		t.Errorf("ReadFile(10 bytes, bound 10) = %q, %v", b, err)
	}
	if _, err := ReadFile(small, 9); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile(10 bytes, bound 9) = %v, want ErrTooLarge", err)
	}
	if _, err := ReadFile(dir, 0); err == nil {
		t.Error("ReadFile(a directory) read it")
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFile(missing) = %v, want ErrNotExist", err)
	}
}

// TestTooManyRulesRefusedEarly: a file of far more than MaxRules rules is
// refused from its YAML nodes alone, before its rules are decoded and
// checked: it costs about what reading its YAML costs, not half again.
func TestTooManyRulesRefusedEarly(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	const n = 20_000
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {name: r%d, limit: 1, window: 1m}\n", i)
	}
	data := []byte(b.String())
	var err error
	parse := allocated(func() { _, err = ParseRules(data) })
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("rules: at most %d rules (got %d)", MaxRules, n)) {
		t.Fatalf("ParseRules(%d rules) = %v", n, err)
	}
	nodes := allocated(func() {
		var doc yaml.Node
		yaml.Unmarshal(data, &doc)
	})
	if parse > nodes*5/4 {
		t.Errorf("refusing %d rules (%d bytes) allocated %d bytes; the file's YAML nodes alone take %d", n, len(data), parse, nodes)
	}
	// A file under the size the count starts from still lists the count.
	lines := strings.SplitAfterN(string(data), "\n", 1502)
	small := strings.Join(lines[:1501], "")
	if len(small) >= countRulesFrom {
		t.Fatalf("%d bytes: not a small file", len(small))
	}
	if _, err := ParseRules([]byte(small)); err == nil || !strings.Contains(err.Error(), "at most 1024 rules (got 1500)") {
		t.Errorf("a small file of too many rules: %v", err)
	}
}
