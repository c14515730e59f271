package edge_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
)

const loginRules = `rules:
  - name: api
    path_prefix: /api
    limit: 100
    window: 1m
  - name: login
    path_prefix: /login
    limit: 1
    window: 1h
`

// TestHalfWrittenRulesNeverApply: the rules file is truncated and written
// back in two steps, 300 ms apart (less than the settle time); the first
// half, a valid file without the /login rule, never applies: every /login
// request meanwhile is refused, as the spent quota says. The whole file
// applies once settled.
func TestHalfWrittenRulesNeverApply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(path, []byte(loginRules), 0o644)
	e := startEdge(t, edgeOpts{rulesFile: path, reloadPoll: 20 * time.Millisecond})
	if s := get(t, e.addr, "/login").StatusCode; s != 200 {
		t.Fatalf("first /login: %d", s)
	}
	if s := get(t, e.addr, "/login").StatusCode; s != 429 {
		t.Fatalf("second /login of 1 per hour: %d", s)
	}
	whole := loginRules + "  - name: extra\n    path_prefix: /extra\n    limit: 5\n    window: 1m\n"
	half := whole[:strings.Index(whole, "  - name: login")]
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(half)
	passed := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if get(t, e.addr, "/login").StatusCode != 429 {
			passed++
		}
	}
	f.WriteString(whole[len(half):])
	f.Close()
	testenv.WaitFor(t, 10*time.Second, "the whole file applied", func() bool {
		if get(t, e.addr, "/login").StatusCode != 429 {
			passed++
		}
		return len(e.Rules().Rules) == 3 && metricSum(t, e, "poplimit_edge_rule_reloads_total", "result", "applied") > 0
	})
	if passed > 0 {
		t.Errorf("%d /login requests passed while the file was half written, want none (the half applied)", passed)
	}
	if n := metricSum(t, e, "poplimit_edge_rule_reloads_total", "result", "applied"); n != 1 {
		t.Errorf("applied reloads %v, want 1 (the whole file only)", n)
	}
	if n := metricSum(t, e, "poplimit_edge_rule_changes_unsettled_total"); n < 1 {
		t.Errorf("unsettled changes counted %v, want at least 1 (the half)", n)
	}
}

// configMap lays out dir as the kubelet does a ConfigMap volume: the data
// in a timestamped directory "..2026_…", "..data" a symlink to it, and
// each file a symlink "name -> ..data/name". A new version is written to
// a new timestamped directory, "..data" swapped to it by renaming a new
// symlink over it, and the old directory removed.
type configMap struct {
	t       *testing.T
	dir     string
	version int
	mtime   time.Time
}

func (c *configMap) write(files map[string]string) {
	c.t.Helper()
	c.version++
	ts := fmt.Sprintf("..2026_12_06_04_00_%02d.%09d", c.version, c.version)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		c.t.Fatal(err)
	}
	for name, data := range files {
		p := filepath.Join(c.dir, ts, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			c.t.Fatal(err)
		}
		// Same time for every version: only the contents tell them apart.
		if err := os.Chtimes(p, c.mtime, c.mtime); err != nil {
			c.t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(c.dir, "..data"))
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(c.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	if old != "" {
		os.RemoveAll(filepath.Join(c.dir, old))
	}
}

// TestConfigMapSwapApplies: a rules file in a Kubernetes ConfigMap volume
// is updated by the "..data" symlink swap to a file of the same size and
// modification time; the edge applies it without SIGHUP.
func TestConfigMapSwapApplies(t *testing.T) {
	cm := &configMap{t: t, dir: t.TempDir(), mtime: time.Now().Add(-time.Hour).Truncate(time.Second)}
	cm.write(map[string]string{"rules.yaml": loginRules})
	e := startEdge(t, edgeOpts{rulesFile: filepath.Join(cm.dir, "rules.yaml"), reloadPoll: 20 * time.Millisecond})
	get(t, e.addr, "/login")
	if s := get(t, e.addr, "/login").StatusCode; s != 429 {
		t.Fatalf("second /login of 1 per hour: %d", s)
	}
	five := strings.Replace(loginRules, "limit: 1\n", "limit: 5\n", 1)
	if len(five) != len(loginRules) {
		t.Fatal("the new version must have the same size")
	}
	cm.write(map[string]string{"rules.yaml": five})
	testenv.WaitFor(t, 10*time.Second, "the swapped-in limit of 5 applied", func() bool {
		return e.Rules().Lookup("login").Limit == 5
	})
	if s := get(t, e.addr, "/login").StatusCode; s != 200 {
		t.Errorf("/login under the new limit of 5: %d", s)
	}
}

// TestConfigMapDirSwapApplies: the same through a directory of
// envoyproxy/ratelimit files (-rules DIR), whose files are the
// ConfigMap's symlinks.
func TestConfigMapDirSwapApplies(t *testing.T) {
	cm := &configMap{t: t, dir: t.TempDir(), mtime: time.Now().Add(-time.Hour).Truncate(time.Second)}
	doc := "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n"
	cm.write(map[string]string{"shop.yaml": fmt.Sprintf(doc, 2)})
	e := edgetest.Start(t, "", edge.Options{RulesFile: cm.dir, ReloadPoll: 20 * time.Millisecond})
	cm.write(map[string]string{"shop.yaml": fmt.Sprintf(doc, 7)})
	testenv.WaitFor(t, 10*time.Second, "the swapped-in limit of 7 applied", func() bool {
		return e.Rules().Rules[0].Limit == 7
	})
}

// TestOversizedRulesFileRefused: a rules file over -rules-max-bytes is
// refused at start and on reload with its name, size and the bound,
// without being read (the heap does not grow by its size), and the
// running rules stay.
func TestOversizedRulesFileRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	big := func(size int64) {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("rules: [{name: one, limit: 1, window: 1m}]\n")
		f.Truncate(size) // sparse
		f.Close()
	}
	big(50 << 20)
	if _, err := edge.Build(edge.Options{RulesFile: path, Logger: edgetest.Discard}); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("%s: %d bytes, over the limit of %d bytes", path, 50<<20, 4<<20)) {
		t.Errorf("Build with a 50 MiB rules file: %v, want it refused naming the file, its size and the bound", err)
	}
	os.WriteFile(path, []byte(loginRules), 0o644)
	e := startEdge(t, edgeOpts{rulesFile: path, reloadPoll: time.Hour})
	big(100 << 20)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	err := e.Reload()
	runtime.ReadMemStats(&ms)
	if grew := ms.TotalAlloc - before; grew > 8<<20 {
		t.Errorf("refusing a 100 MiB rules file allocated %d bytes", grew)
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, over the limit of %d bytes", 100<<20, 4<<20)) {
		t.Errorf("reload of a 100 MiB rules file: %v", err)
	}
	if e.Rules().Lookup("login") == nil {
		t.Error("the running rules did not stay")
	}
	if n := metricSum(t, e, "poplimit_edge_rule_reloads_total", "result", "rejected"); n != 1 {
		t.Errorf("rejected reloads %v, want 1", n)
	}
}

// TestOversizedEnvoyFileRefused: a 100 MiB file in a directory of
// envoyproxy/ratelimit files is refused on reload without being read,
// naming that file, its size and the bound; the running rules stay.
func TestOversizedEnvoyFileRefused(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o644)
	e := edgetest.Start(t, "", edge.Options{RulesFile: dir, ReloadPoll: time.Hour})
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("domain: big\n")
	f.Truncate(100 << 20) // sparse
	f.Close()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	err = e.Reload()
	runtime.ReadMemStats(&ms)
	if grew := ms.TotalAlloc - before; grew > 8<<20 {
		t.Errorf("refusing a 100 MiB file allocated %d bytes", grew)
	}
	if want := fmt.Sprintf("%s: %d bytes, over the limit of %d bytes", big, 100<<20, 4<<20); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("reload with a 100 MiB file: %v, want %q", err, want)
	}
	if e.Rules().Rules[0].Limit != 2 {
		t.Error("the running rules did not stay")
	}
}
