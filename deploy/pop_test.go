package deploy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// promQuery runs an instant query and returns how many series it gave.
func promQuery(base, expr string) (int, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Data   struct{ Result []json.RawMessage }
		Error  string
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, &promError{r.Error}
	}
	return len(r.Data.Result), nil
}

type promError struct{ msg string }

func (e *promError) Error() string { return e.msg }

// TestPoPDataReachesEveryRuleAndDashboard starts the whole local PoP
// (deploy/pop: memcached shards, the aggregator and its embedded broker,
// two edges, Prometheus with the project's config), lets its replay run, and
// checks that every recording rule and every console and Grafana query of
// the shipped dashboards returns data from it.
func TestPoPDataReachesEveryRuleAndDashboard(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole PoP")
	}
	lookTool(t, "prometheus", "prometheus")
	lookTool(t, "memcached", "memcached")
	port := func() string { return strconv.Itoa(testenv.FreePort(t)) }
	// Edges take their port and the next for admin: both must be free.
	edgePorts := strconv.Itoa(testenv.FreePortPair(t)) + "," + strconv.Itoa(testenv.FreePortPair(t))
	prom := "127.0.0.1:" + port()
	cmd := exec.Command("go", "run", "./deploy/pop",
		"-memcache-ports", port()+","+port()+","+port(),
		"-edge-ports", edgePorts, "-origin", "127.0.0.1:"+port(),
		"-aggregator", "127.0.0.1:"+port(), "-broker", "127.0.0.1:"+port(),
		"-prometheus", prom, "-rate", "400", "-duration", "75s", "-dir", t.TempDir())
	cmd.Dir = ".."
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	replaying, serving := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var log strings.Builder
	logText := func() string { mu.Lock(); defer mu.Unlock(); return log.String() }
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			switch {
			case strings.Contains(sc.Text(), "pop: replaying"):
				close(replaying)
			case strings.Contains(sc.Text(), "serving until Ctrl-C"):
				close(serving)
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}()
	select {
	case <-replaying:
	case <-exited:
		t.Fatalf("pop exited:\n%s", logText())
	case <-time.After(3 * time.Minute):
		t.Fatalf("pop did not start its replay in 3 minutes:\n%s", logText())
	}

	// What must return data while traffic flows: every recording rule,
	// every dashboard query (rendered for the demo rule "per-client"; ratio
	// rules guard their denominators with > 0 and go quiet when traffic
	// stops, so the checks run during the replay).
	type check struct{ where, expr string }
	var checks []check
	for path, f := range ruleFiles(t) {
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					checks = append(checks, check{filepath.Base(path) + " " + r.Record, r.Record})
				}
			}
		}
	}
	for _, e := range consoleExprsFor(t, []map[string]string{{"rule": "per-client"}}) {
		// The offline renderer lists rules from a stubbed query that names
		// "api"; the live consoles list the PoP's own rules (checked below).
		if strings.Contains(e.expr, "'api'") {
			continue
		}
		checks = append(checks, check(e))
	}
	for _, e := range grafanaExprsFor(t, "per-client") {
		checks = append(checks, check(e))
	}
	base := "http://" + prom
	// Rates over [1m] need two scrapes inside the range and the recording
	// rules an evaluation after them: poll until every check has returned
	// data once, or the replay is over.
	answered := make([]bool, len(checks))
	for done := false; !done; {
		select {
		case <-serving:
			done = true // one last round
		case <-exited:
			t.Fatalf("pop exited:\n%s", logText())
		case <-time.After(5 * time.Second):
		}
		left := 0
		for i, c := range checks {
			if answered[i] {
				continue
			}
			n, err := promQuery(base, c.expr)
			if err != nil {
				t.Fatalf("%s: %q: %v", c.where, c.expr, err)
			}
			answered[i] = n > 0
			if !answered[i] {
				left++
			}
		}
		if left == 0 {
			break
		}
	}
	// The overshoot's mean averages the wrongly allowed decisions' excess:
	// where none was (an accurate run, or a rule with no key over), it has
	// nothing to average and its queries are rightly empty, which the
	// judge's count of them, exported and zero, shows: for the whole PoP,
	// or for the one rule a query selects.
	noneFor := func(expr string) bool {
		sel := ""
		if m := ruleSelector.FindStringSubmatch(expr); m != nil {
			sel = "{rule='" + m[1] + "'}"
		}
		n, err := promQuery(base, "(sum(poplimit_aggregator_overshoot_ratio_count"+sel+") or vector(0)) == 0")
		return err == nil && n > 0
	}
	var empty []check
	for i, c := range checks {
		if answered[i] {
			continue
		}
		if strings.Contains(c.expr, "overshoot") && noneFor(c.expr) {
			t.Logf("no decision was wrongly allowed: %s has nothing to average (%s)", c.where, c.expr)
			continue
		}
		empty = append(empty, c)
	}
	for _, c := range empty {
		t.Errorf("no data from a running PoP: %s: %s", c.where, c.expr)
	}
	// The consoles themselves, served by this Prometheus with live data.
	for _, page := range consolePages(t) {
		for _, q := range []string{"", "?rule=per-client"} {
			resp, err := http.Get(base + "/consoles/" + page + q)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.Contains(string(body), "error executing template") {
				t.Errorf("console %s%s: status %d: %.300s", page, q, resp.StatusCode, body)
			}
		}
	}
	t.Logf("%d recording rules and dashboard queries checked against a running PoP", len(checks))
}

// ruleSelector finds the rule a dashboard query selects.
var ruleSelector = regexp.MustCompile(`rule='([^']*)'`)
