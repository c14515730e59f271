package deploytest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Flag is one command-line flag as the command itself lists it.
type Flag struct {
	Name string
	// Default is the default value as -h prints it, unquoted (e.g.
	// "127.0.0.1:7071", "100ms", "1048576"); empty for a zero default.
	Default string
}

var (
	flagsMu    sync.Mutex
	flagsCache = map[string]map[string]Flag{}
)

// Flags returns the flags of the command whose main package is in dir, by
// name, read from the program: it builds the command once per process and
// parses what its -h prints (the flag package's usage).
func Flags(dir string) (map[string]Flag, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if fs, ok := flagsCache[abs]; ok {
		return fs, nil
	}
	tmp, err := os.MkdirTemp("", "deploytest-flags-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, filepath.Base(abs))
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = abs
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("deploytest: go build %s: %v\n%s", dir, err, out)
	}
	out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 2 with the usage
	fs, err := parseUsage(out)
	if err != nil {
		return nil, fmt.Errorf("deploytest: %s -h: %w", dir, err)
	}
	flagsCache[abs] = fs
	return fs, nil
}

var (
	flagLine    = regexp.MustCompile(`^  -([\w-]+)(?: \S+)?$`)
	defaultText = regexp.MustCompile(`\(default (.*)\)$`)
)

// parseUsage parses the flag package's PrintDefaults output: a line
// "  -name type" per flag, then its usage lines, the last ending with
// "(default X)" when the default is not the zero value.
func parseUsage(out []byte) (map[string]Flag, error) {
	flags := map[string]Flag{}
	var cur *Flag
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flags[m[1]] = Flag{Name: m[1]}
			f := flags[m[1]]
			cur = &f
			continue
		}
		if cur == nil || !strings.HasPrefix(line, "    \t") {
			continue
		}
		if m := defaultText.FindStringSubmatch(line); m != nil {
			d := m[1]
			if u, err := strconv.Unquote(d); err == nil {
				d = u
			}
			cur.Default = d
			flags[cur.Name] = *cur
		}
	}
	if len(flags) == 0 {
		return nil, fmt.Errorf("no flags in its usage:\n%s", out)
	}
	return flags, nil
}
