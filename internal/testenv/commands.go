package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// built holds the commands Command built, once per test binary.
var built struct {
	mu   sync.Mutex
	dir  string
	path map[string]string
}

// Command returns the path of this module's cmd/<name>, built on first use
// once per test binary, without the race detector: processes are measured
// as they are deployed. Call RemoveCommands from TestMain.
func Command(t testing.TB, name string) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if p, ok := built.path[name]; ok {
		return p
	}
	if built.dir == "" {
		d, err := os.MkdirTemp("", "poplimit-cmds-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.path = d, map[string]string{}
	}
	out := filepath.Join(built.dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = ModuleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	built.path[name] = out
	return out
}

// RemoveCommands removes what Command built.
func RemoveCommands() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir, built.path = "", nil
	}
}

// ModuleRoot returns the directory of the module's go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		t.Fatal("go env GOMOD: not in a module")
	}
	return filepath.Dir(mod)
}

// LockedBuffer is a bytes.Buffer safe for concurrent use: a process's
// output, written by its pipes and read by the test.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
