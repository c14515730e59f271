package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/deploy/internal/deploytest"
	"sigs.k8s.io/yaml"
)

const systemdDir = "systemd"

type unitFile struct {
	path string
	unit deploytest.SystemdUnit
}

func units(t *testing.T) []unitFile {
	t.Helper()
	var us []unitFile
	for _, p := range glob(t, filepath.Join(systemdDir, "*.service")) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		u, err := deploytest.ParseUnit(string(b))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		us = append(us, unitFile{p, u})
	}
	return us
}

// commandFlags returns the flags a command accepts, by the basename of its
// executable in a unit: the poplimit commands' from their -h output, the
// others' from their -h output (or nil when they are not installed).
func commandFlags(t *testing.T, exe string) (map[string]bool, bool) {
	t.Helper()
	flags := map[string]bool{}
	switch filepath.Base(exe) {
	case "poplimit-edge", "poplimit-aggregator":
		fs, err := deploytest.Flags(filepath.Join("..", "cmd", strings.TrimPrefix(filepath.Base(exe), "poplimit-")))
		if err != nil {
			t.Fatal(err)
		}
		for name := range fs {
			flags[name] = true
		}
		return flags, true
	case "memcached", "nutcracker":
		path, err := exec.LookPath(exe)
		if err != nil {
			t.Logf("%s is not installed: its flags are not checked (apt-get install %s)", exe, filepath.Base(exe))
			return nil, false
		}
		out, _ := exec.Command(path, "-h").CombinedOutput() // nutcracker -h exits 0, memcached -h too; the text is what matters
		for _, m := range regexp.MustCompile(`(?m)^\s*-(\w), --([\w-]+)`).FindAllStringSubmatch(string(out), -1) {
			flags[m[1]], flags[m[2]] = true, true
		}
		if len(flags) == 0 {
			t.Fatalf("%s -h lists no flags:\n%s", path, out)
		}
		return flags, true
	case "kill":
		return nil, false
	}
	t.Fatalf("unit runs %s: the test knows no flag set for it", exe)
	return nil, false
}

// envFile reads a KEY=VALUE file as systemd's EnvironmentFile= does (the
// simple cases: comments, blank lines, unquoted values).
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(k) {
			t.Errorf("%s:%d: not KEY=VALUE: %q", path, n, line)
			continue
		}
		env[k] = v
	}
	return env
}

var envRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

// TestUnitsHardened checks the service settings every unit must have.
func TestUnitsHardened(t *testing.T) {
	required := map[string]string{
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"NoNewPrivileges":         "yes",
		"CapabilityBoundingSet":   "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"SystemCallArchitectures": "native",
	}
	for _, uf := range units(t) {
		for key, want := range required {
			if got, ok := uf.unit.Value("Service", key); !ok || got != want {
				t.Errorf("%s: %s=%q (set: %v), want %q", uf.path, key, got, ok, want)
			}
		}
		if v, _ := uf.unit.Value("Service", "DynamicUser"); v != "yes" {
			if u, _ := uf.unit.Value("Service", "User"); u == "" || u == "root" {
				t.Errorf("%s: neither DynamicUser=yes nor a dedicated User=", uf.path)
			}
		}
		if v, _ := uf.unit.Value("Service", "Restart"); v != "on-failure" && v != "always" {
			t.Errorf("%s: Restart=%q, want on-failure or always", uf.path, v)
		}
		if v, _ := uf.unit.Value("Service", "MemoryMax"); !regexp.MustCompile(`^\d+[KMG]$`).MatchString(v) {
			t.Errorf("%s: MemoryMax=%q, want a size", uf.path, v)
		}
		if len(uf.unit.Values("Service", "EnvironmentFile")) == 0 {
			t.Errorf("%s: no EnvironmentFile=", uf.path)
		}
		if _, ok := uf.unit.Value("Install", "WantedBy"); !ok {
			t.Errorf("%s: no [Install] WantedBy=", uf.path)
		}
	}
}

// TestUnitCommands checks every Exec line: its flags exist in the command
// it runs, and every variable it uses is set in the example environment
// file, which sets nothing it does not use.
func TestUnitCommands(t *testing.T) {
	for _, uf := range units(t) {
		env := map[string]string{}
		for _, ef := range uf.unit.Values("Service", "EnvironmentFile") {
			optional := strings.HasPrefix(ef, "-")
			example := filepath.Join(systemdDir, filepath.Base(strings.TrimPrefix(ef, "-")))
			if optional {
				continue // a per-instance override; the common file sets everything
			}
			if !strings.HasPrefix(strings.TrimPrefix(ef, "-"), "/etc/poplimit/") {
				t.Errorf("%s: EnvironmentFile=%s: want it under /etc/poplimit", uf.path, ef)
			}
			for k, v := range envFile(t, example) {
				env[k] = v
			}
		}
		used := map[string]bool{}
		for _, key := range []string{"ExecStartPre", "ExecStart", "ExecReload"} {
			for _, line := range uf.unit.Values("Service", key) {
				words, err := deploytest.CommandWords(line)
				if err != nil || len(words) == 0 {
					t.Errorf("%s: %s=%s: %v", uf.path, key, line, err)
					continue
				}
				if !filepath.IsAbs(words[0]) {
					t.Errorf("%s: %s runs %q: want an absolute path", uf.path, key, words[0])
				}
				flags, check := commandFlags(t, words[0])
				for _, w := range words[1:] {
					for _, m := range envRef.FindAllStringSubmatch(w, -1) {
						name := m[1] + m[2]
						if name == "MAINPID" {
							continue
						}
						used[name] = true
						if _, ok := env[name]; !ok {
							t.Errorf("%s: %s uses $%s, which the example environment file does not set", uf.path, key, name)
						}
					}
					if !check || !strings.HasPrefix(w, "-") || w == "-" {
						continue
					}
					name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
					if _, err := strconv.Atoi(name); err == nil {
						continue // a negative number, or kill's -HUP-style signal
					}
					if !flags[name] {
						t.Errorf("%s: %s passes %s, which %s does not define", uf.path, key, w, filepath.Base(words[0]))
					}
				}
			}
		}
		for k := range env {
			if !used[k] {
				t.Errorf("%s: the example environment file sets %s, which no Exec line uses", uf.path, k)
			}
		}
	}
}

// TestUnitsVerify runs systemd-analyze verify and security on the units,
// with the poplimit binaries (not installed here) replaced by a stub and the
// memcached template instantiated.
func TestUnitsVerify(t *testing.T) {
	analyze := lookTool(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, uf := range units(t) {
		b, err := os.ReadFile(uf.path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, key := range []string{"ExecStartPre", "ExecStart", "ExecReload"} {
			for _, line := range uf.unit.Values("Service", key) {
				words, _ := deploytest.CommandWords(line)
				if len(words) > 0 {
					if _, err := os.Stat(words[0]); err != nil {
						text = strings.ReplaceAll(text, words[0], stub)
					}
				}
			}
		}
		name := filepath.Base(uf.path)
		if strings.HasSuffix(name, "@.service") {
			name = strings.TrimSuffix(name, "@.service") + "@11311.service"
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", path).CombinedOutput()
		if err != nil || strings.Contains(string(out), name) {
			t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(uf.path), err, out)
		}
		// Exposure 0-10 in tenths: 20 is 2.0, "OK" in systemd's words.
		out, err = exec.Command(analyze, "security", "--offline=yes", "--threshold=20", path).CombinedOutput()
		if err != nil {
			t.Errorf("systemd-analyze security %s: exposure above 2.0 (%v):\n%s", filepath.Base(uf.path), err, out)
		}
	}
}

// goDuration parses a default as -h prints it (e.g. "100ms").
func goDuration(t *testing.T, text string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(text)
	if err != nil {
		t.Fatalf("default %q: not a duration", text)
	}
	return d
}

// TestNutcrackerConfig checks that the example pool places keys as the
// edges do, lists the same shards as the example edge, and ejects as they
// do; and that nutcracker accepts it.
func TestNutcrackerConfig(t *testing.T) {
	path := filepath.Join(systemdDir, "nutcracker.yml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pools map[string]struct {
		Listen             string   `json:"listen"`
		Hash               string   `json:"hash"`
		HashTag            string   `json:"hash_tag"`
		Distribution       string   `json:"distribution"`
		Timeout            int      `json:"timeout"`
		Preconnect         bool     `json:"preconnect"`
		AutoEjectHosts     bool     `json:"auto_eject_hosts"`
		ServerFailureLimit int      `json:"server_failure_limit"`
		ServerRetryTimeout int      `json:"server_retry_timeout"`
		Servers            []string `json:"servers"`
	}
	if err := yaml.UnmarshalStrict(b, &pools); err != nil {
		t.Fatal(err)
	}
	flags, err := deploytest.Flags(filepath.Join("..", "cmd", "edge"))
	if err != nil {
		t.Fatal(err)
	}
	edgeEnv := envFile(t, filepath.Join(systemdDir, "edge.env"))
	var want []string
	for _, s := range strings.Split(edgeEnv["MEMCACHE"], ",") {
		if strings.Count(s, ":") == 1 {
			s += ":1"
		}
		want = append(want, s)
	}
	for name, p := range pools {
		if p.Hash != flags["hash"].Default {
			t.Errorf("pool %s: hash %s, the edges' -hash default %s", name, p.Hash, flags["hash"].Default)
		}
		if p.Distribution != "ketama" || p.HashTag != "{}" {
			t.Errorf("pool %s: distribution %q hash_tag %q, want ketama and {} as the edges", name, p.Distribution, p.HashTag)
		}
		if d := time.Duration(p.Timeout) * time.Millisecond; d != goDuration(t, flags["store-timeout"].Default) {
			t.Errorf("pool %s: timeout %v, the edges' -store-timeout default %s", name, d, flags["store-timeout"].Default)
		}
		if !p.AutoEjectHosts || p.ServerFailureLimit != 3 || p.ServerRetryTimeout != 5000 {
			t.Errorf("pool %s: ejection %v/%d/%dms, want the edges' own: after 3 failures, for 5000ms", name, p.AutoEjectHosts, p.ServerFailureLimit, p.ServerRetryTimeout)
		}
		if !slices.Equal(p.Servers, want) {
			t.Errorf("pool %s: servers %q, want edge.env's MEMCACHE as host:port:weight, unnamed: %q", name, p.Servers, want)
		}
	}
	nutcracker := lookTool(t, "nutcracker", "nutcracker")
	run(t, ".", nutcracker, "-t", "-c", path)
}
