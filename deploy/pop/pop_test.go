package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
)

// fakeSystem is a machine with the programs in have; apt-get install adds
// the packages' programs when installs is set.
type fakeSystem struct {
	have     map[string]bool
	root     bool
	installs bool
	ran      []string
}

func (f *fakeSystem) system() system {
	return system{
		lookPath: func(bin string) (string, error) {
			if f.have[bin] {
				return "/usr/bin/" + bin, nil
			}
			return "", fs.ErrNotExist
		},
		euid: func() int {
			if f.root {
				return 0
			}
			return 1000
		},
		run: func(_ context.Context, _, _ io.Writer, env []string, name string, args ...string) error {
			f.ran = append(f.ran, strings.Join(env, " ")+" "+name+" "+strings.Join(args, " "))
			if len(args) > 0 && args[0] == "install" {
				if !f.installs {
					return errors.New("exit status 100")
				}
				for _, p := range args[1:] {
					if !strings.HasPrefix(p, "-") {
						f.have[p] = true // each package brings its program of the same name
					}
				}
			}
			return nil
		},
	}
}

func TestEnsureTools(t *testing.T) {
	tests := []struct {
		name      string
		sys       fakeSystem
		install   bool
		wantFound []string
		wantRan   []string
		wantOut   []string
		notOut    []string
	}{
		{"all there", fakeSystem{have: map[string]bool{"memcached": true, "prometheus": true}}, true,
			[]string{"memcached", "prometheus"}, nil, nil, []string{"WARNING", "install"}},
		{"root on Debian: installed", fakeSystem{have: map[string]bool{"apt-get": true}, root: true, installs: true}, true,
			[]string{"memcached", "prometheus"},
			[]string{"DEBIAN_FRONTEND=noninteractive apt-get update -qq",
				"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends memcached prometheus"},
			[]string{"installing memcached prometheus with apt-get", "installed memcached (/usr/bin/memcached)"}, []string{"WARNING"}},
		{"root, prometheus only missing", fakeSystem{have: map[string]bool{"apt-get": true, "memcached": true}, root: true, installs: true}, true,
			[]string{"memcached", "prometheus"},
			[]string{"DEBIAN_FRONTEND=noninteractive apt-get update -qq",
				"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus"},
			nil, []string{"WARNING"}},
		{"not root: says what to install and what it falls back to", fakeSystem{have: map[string]bool{"apt-get": true}}, true,
			nil, nil,
			[]string{"not root", "sudo apt-get install memcached", "sudo apt-get install prometheus",
				"limits do NOT hold across the two edges", "no Prometheus and no dashboards"}, nil},
		{"apt-get fails", fakeSystem{have: map[string]bool{"apt-get": true}, root: true}, true,
			nil, []string{"DEBIAN_FRONTEND=noninteractive apt-get update -qq",
				"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends memcached prometheus"},
			[]string{"apt-get install memcached prometheus failed", "sudo apt-get install memcached"}, nil},
		{"no apt-get", fakeSystem{have: map[string]bool{}, root: true}, true,
			nil, nil, []string{"no apt-get", "sudo apt-get install memcached"}, nil},
		{"-install=false", fakeSystem{have: map[string]bool{"apt-get": true, "prometheus": true}, root: true, installs: true}, false,
			[]string{"prometheus"}, nil, []string{"-install=false", "sudo apt-get install memcached"}, []string{"prometheus is not installed"}},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		found := ensureTools(context.Background(), tt.sys.system(), tt.install, &out, &out)
		for _, bin := range []string{"memcached", "prometheus"} {
			want := false
			for _, w := range tt.wantFound {
				want = want || w == bin
			}
			if (found[bin] != "") != want {
				t.Errorf("%s: %s found %q, want found %v", tt.name, bin, found[bin], want)
			}
		}
		if strings.Join(tt.sys.ran, "\n") != strings.Join(tt.wantRan, "\n") {
			t.Errorf("%s: ran\n%s\nwant\n%s", tt.name, strings.Join(tt.sys.ran, "\n"), strings.Join(tt.wantRan, "\n"))
		}
		for _, s := range tt.wantOut {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%s: output lacks %q:\n%s", tt.name, s, out.String())
			}
		}
		for _, s := range tt.notOut {
			if strings.Contains(out.String(), s) {
				t.Errorf("%s: output has %q:\n%s", tt.name, s, out.String())
			}
		}
	}
}

func TestSummaryPerRule(t *testing.T) {
	jr := judge.Report{
		Enforced: judge.DecisionTally{Decisions: 100_000, WronglyAllowed: 4, WronglyLimited: 1, WrongRatio: 5.0 / 100_000},
		ByRule: []judge.Breakdown{
			{Name: "abuse-block", Enforced: judge.DecisionTally{Decisions: 50_000, WronglyAllowed: 3, WrongRatio: 3.0 / 50_000}},
			{Name: "login", Enforced: judge.DecisionTally{Decisions: 300}},
			{Name: "per-client", Enforced: judge.DecisionTally{Decisions: 49_700, WronglyAllowed: 1, WronglyLimited: 1, WrongRatio: 2.0 / 49_700}},
		},
		FalseNegativeKeys: 2,
		TopFalseNegatives: []judge.Key{{Rule: "per-client", Ratio: 1.04}, {Rule: "abuse-block", Ratio: 1.0033}},
	}
	raw, err := json.Marshal(jr)
	if err != nil {
		t.Fatal(err)
	}
	rep := &loadtest.ReplayReport{Start: time.Unix(1000, 2500*int64(time.Millisecond)), Aggregator: raw}
	var out bytes.Buffer
	if err := writeSummary(&out, rep, map[string]time.Duration{"abuse-block": 10 * time.Second, "login": time.Minute, "per-client": 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		"phase 2.5s into the 10s windows, 42.5s into the 1m0s windows",
		`"How we built rate limiting capable of scaling to millions of domains"`,
		"0.003% of 400 million requests wrongly allowed or blocked",
		"under 15% over their limit",
		"this PoP: 0.0050% wrong over 100000 decisions, above Cloudflare's 0.003%; the worst wrongly allowed key reached 1.040× its limit (within Cloudflare's 15% over)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q", want)
		}
	}

	rowsWant := map[string]string{
		"abuse-block": "50000 3 0 0.0060% 1.003×",
		"login":       "300 0 0 0.0000% -",
		"per-client":  "49700 1 1 0.0040% 1.040×",
		"all":         "rules 100000 4 1 0.0050% 1.040×",
		"Cloudflare,": "2017 400,000,000 0.0030% < 1.150×",
	}
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		if len(f) > 1 {
			if want, ok := rowsWant[f[0]]; ok && strings.Join(f[1:], " ") == want {
				delete(rowsWant, f[0])
			}
		}
	}
	for name, want := range rowsWant {
		t.Errorf("summary lacks the row %s %s", name, want)
	}

	// A rule with wrongly allowed keys beyond a full list gets a bound.
	jr.FalseNegativeKeys = 5
	jr.TopFalseNegatives = jr.TopFalseNegatives[:1]
	rows, _ := accuracyByRule(&jr)
	if rows[0].rule != "abuse-block" || !rows[0].worstBounded || rows[0].worstKey != 1.04 || worstText(rows[0]) != "≤ 1.040×" {
		t.Errorf("abuse-block beyond the list: got %+v (%s), want ≤ 1.040×", rows[0], worstText(rows[0]))
	}

	out.Reset()
	writeSummary(&out, &loadtest.ReplayReport{AggregatorError: "GET http://127.0.0.1:7080/report: connection refused"}, nil)
	if !strings.Contains(out.String(), "no accuracy report: GET") {
		t.Errorf("without a report: %q", out.String())
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-phase", "1s"}, {"-align", "10s", "-phase", "10s"}, {"extra"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	o, err := parseFlags([]string{"-align", "10s", "-phase", "2.5s", "-exit"}, io.Discard)
	if err != nil || o.align != 10*time.Second || o.phase != 2500*time.Millisecond || !o.exit || !o.install {
		t.Errorf("got %+v, %v", o, err)
	}
}
