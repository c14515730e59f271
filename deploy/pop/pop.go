package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/poplimit/poplimit/aggregator"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/rules"
	"github.com/valyala/fasthttp"
)

// demoRules are the PoP's rules unless -rules names a file: a block rule
// that only the abuser and the heaviest clients trip, two rules that count
// failed logins (the origin's 401) and block for their window, per account
// (the form's username, in any letter case) and per address, and a
// per-client throttle. Every matching rule applies, in order; the first
// refusal answers, so the block rule comes first to count every attempt.
// The login rules hold 5 failures per account per 15 minutes and 20 per
// address per hour, scaled down 15 times (5 a minute, 20 in 4 minutes)
// so that the demo shows them within its run; a successful login costs
// nothing. With several PoPs (-pops 2) the block and the per-client
// throttle hold across PoPs (%[1]s is "global"), the login rules in each
// (a rule that counts by response holds within its PoP).
const demoRules = `
match: all
rules:
  - name: abuse-block
    limit: 300
    window: 10s
    action: block
    timeout: 30s
    scope: %[1]s
  - name: failed-logins-account
    path_prefix: /login
    methods: [POST]
    key: ["form:username"]
    key_case: insensitive
    count: {status: [401]}
    limit: 5
    window: 1m
    action: block
    mode: sync
  - name: failed-logins-ip
    path_prefix: /login
    methods: [POST]
    count: {status: [401]}
    limit: 20
    window: 4m
    action: block
  - name: per-client
    limit: 100
    window: 10s
    scope: %[1]s
`

// demoAccountLimit is the failed logins per account the demo rules allow.
const demoAccountLimit = 5

type options struct {
	pops       int
	shards     string
	edges      string
	origin     string
	aggregator string
	broker     string
	prometheus string
	rules      string
	rate       float64
	duration   time.Duration
	exit       bool
	dir        string
	install    bool
	align      time.Duration
	phase      time.Duration

	// timeline records the built-in replay for its page (replay.html in
	// dir); set by run.
	timeline *loadtest.TimelineRecorder
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("pop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.pops, "pops", 1, "PoPs to run, each with its memcached shards and edges (PoP k's ports are PoP 1's plus 100×(k−1)); with 2 or more, the demo rules hold across PoPs (scope: global) and the replay deals each client over every edge of every PoP")
	fs.StringVar(&o.shards, "memcache-ports", "11311,11312,11313", "loopback ports of the memcached shards")
	fs.StringVar(&o.edges, "edge-ports", "7070,7072", "loopback ports of the edges (each admin listener on the next port)")
	fs.StringVar(&o.origin, "origin", "127.0.0.1:7060", "address of the tiny origin behind the edges")
	fs.StringVar(&o.aggregator, "aggregator", aggregator.DefaultListen, "address of the aggregator's /report and /metrics")
	fs.StringVar(&o.broker, "broker", aggregator.DefaultEmbedded, "address of the aggregator's embedded Kafka broker")
	fs.StringVar(&o.prometheus, "prometheus", "127.0.0.1:9390", "address of Prometheus, when installed")
	fs.StringVar(&o.rules, "rules", "", "rules file for the edges (default: built-in demo rules)")
	fs.Float64Var(&o.rate, "rate", 2000, "requests per second of the built-in replay")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "length of the built-in replay")
	fs.BoolVar(&o.exit, "exit", false, "stop after the replay instead of serving until Ctrl-C")
	fs.StringVar(&o.dir, "dir", "", "working directory for binaries, configs and logs (default: a new temporary one)")
	fs.BoolVar(&o.install, "install", true, "install memcached and prometheus with apt-get when they are missing and pop runs as root (as scripts/test.sh does)")
	fs.DurationVar(&o.align, "align", 0, "start the replay at a wall-clock multiple of this (a rule's window), as loadtest replay -align (default: at once)")
	fs.DurationVar(&o.phase, "phase", 0, "with -align W: start this far past a multiple of W, as loadtest replay -phase")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.phase < 0 || o.phase > 0 && o.phase >= o.align {
		return nil, errors.New("-phase D needs -align W and 0 ≤ D < W")
	}
	return o, nil
}

func ports(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("bad port %q in %q", f, list)
		}
		out = append(out, p)
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	shardPorts, err := ports(o.shards)
	if err != nil {
		return fmt.Errorf("-memcache-ports: %w", err)
	}
	edgePorts, err := ports(o.edges)
	if err != nil {
		return fmt.Errorf("-edge-ports: %w", err)
	}
	if o.pops < 1 || o.pops > 9 {
		return fmt.Errorf("-pops %d: between 1 and 9", o.pops)
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "poplimit-pop-"); err != nil {
			return err
		}
	}
	say := func(format string, a ...any) { fmt.Fprintf(stdout, "pop: "+format+"\n", a...) }
	say("working directory %s (binaries, configs, logs)", o.dir)

	root, err := moduleRoot()
	if err != nil {
		return err
	}
	say("building edge, aggregator")
	for _, c := range []string{"edge", "aggregator"} {
		b := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(o.dir, c), "./cmd/"+c)
		b.Dir, b.Stdout, b.Stderr = root, stderr, stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/%s: %w", c, err)
		}
	}
	rulesPath := o.rules
	if rulesPath == "" {
		rulesPath = filepath.Join(o.dir, "rules.yaml")
		scope := "pop"
		if o.pops > 1 {
			scope = "global"
		}
		if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(demoRules, scope)), 0o644); err != nil {
			return err
		}
	}
	windows, err := ruleWindows(rulesPath)
	if err != nil { // the edges will say more; the summary goes without phases
		fmt.Fprintf(stderr, "pop: WARNING: reading the rules' windows: %v\n", err)
	}

	// memcached and prometheus: installed with apt-get when missing and
	// root, else named with what the PoP does without them.
	found := ensureTools(ctx, realSystem, o.install, stdout, stderr)

	var procs procSet
	defer procs.stop(stdout)

	// Memcached shards of each PoP, or a loud fallback (said by
	// ensureTools).
	memcache := make([][]string, o.pops)
	if bin := found["memcached"]; bin != "" {
		for k := range o.pops {
			for _, p := range shardPorts {
				p += 100 * k
				addr := "127.0.0.1:" + strconv.Itoa(p)
				args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(p), "-U", "0", "-m", "256", "-t", "2"}
				if os.Geteuid() == 0 {
					args = append(args, "-u", "root")
				}
				if err := procs.start(ctx, o.dir, "memcached-"+strconv.Itoa(p), bin, args...); err != nil {
					return err
				}
				if err := waitTCP(ctx, addr); err != nil {
					return fmt.Errorf("memcached on %s: %w (is the port taken? see -memcache-ports)", addr, err)
				}
				memcache[k] = append(memcache[k], addr)
			}
			say("%smemcached shards on %s", popName(o.pops, k, ": "), strings.Join(memcache[k], ", "))
		}
	}

	// The keys the decision events and the counts across PoPs are signed
	// with, as production runs them (deploy/KAFKA.md): forged messages on
	// either topic are refused.
	eventsKey, globalKey := filepath.Join(o.dir, "events.key"), filepath.Join(o.dir, "global.key")
	for _, f := range []string{eventsKey, globalKey} {
		if err := os.WriteFile(f, []byte(rand.Text()+rand.Text()+"\n"), 0o600); err != nil {
			return err
		}
	}
	keys := []string{"-events-key-file", eventsKey, "-global-key-file", globalKey}

	// The aggregator and its embedded broker.
	if err := procs.start(ctx, o.dir, "aggregator", filepath.Join(o.dir, "aggregator"), append([]string{
		"-listen", o.aggregator, "-embedded-broker", o.broker, "-partitions", "4", "-lateness", "2s",
		"-settle-lateness", "5s", // the demo's origin answers at once: requests settle within milliseconds
		"-top-keys", "1000"}, keys...)...); err != nil { // enough wrongly allowed keys listed for each rule's worst
		return err
	}
	if err := waitHTTP(ctx, "http://"+o.aggregator+"/healthz", procs.exited("aggregator")); err != nil {
		return fmt.Errorf("aggregator: %w (log: %s)%s", err, procs.log("aggregator"), procs.tail("aggregator"))
	}
	say("aggregator on http://%s (report: /report), embedded Kafka broker on %s", o.aggregator, o.broker)

	// The origin.
	origin := &fasthttp.Server{Handler: originHandler, NoDefaultServerHeader: true} // logins.go
	oln, err := net.Listen("tcp", o.origin)
	if err != nil {
		return fmt.Errorf("origin: %w", err)
	}
	go origin.Serve(oln)
	defer origin.Shutdown()

	// The edges of each PoP.
	var targets, admins []string
	for k := range o.pops {
		for i, p := range edgePorts {
			p += 100 * k
			id := k*len(edgePorts) + i + 1
			addr, admin := "127.0.0.1:"+strconv.Itoa(p), "127.0.0.1:"+strconv.Itoa(p+1)
			args := []string{"-listen", addr, "-admin", admin, "-mode", "proxy", "-upstream", o.origin,
				"-rules", rulesPath, "-edge-id", strconv.Itoa(id), "-brokers", o.broker,
				"-trusted-proxies", "127.0.0.0/8", "-log-level", "warn"}
			args = append(args, keys...)
			if o.pops > 1 {
				args = append(args, "-pop", popName(o.pops, k, ""))
			}
			if len(memcache[k]) > 0 {
				args = append(args, "-memcache", strings.Join(memcache[k], ","))
			}
			name := "edge-" + strconv.Itoa(id)
			if err := procs.start(ctx, o.dir, name, filepath.Join(o.dir, "edge"), args...); err != nil {
				return err
			}
			if err := waitHTTP(ctx, "http://"+admin+"/healthz", procs.exited(name)); err != nil {
				return fmt.Errorf("%s: %w (log: %s)%s", name, err, procs.log(name), procs.tail(name))
			}
			targets, admins = append(targets, addr), append(admins, admin)
		}
	}
	say("edges on %s (proxy mode, origin %s)", strings.Join(targets, ", "), o.origin)

	// Prometheus, when installed.
	promURL := ""
	if bin := found["prometheus"]; bin != "" {
		cfg, err := preparePrometheus(o.dir, root, admins, o.aggregator)
		if err != nil {
			return err
		}
		args := []string{"--config.file", cfg, "--storage.tsdb.path", filepath.Join(o.dir, "prometheus-data"),
			"--web.listen-address", o.prometheus, "--web.enable-lifecycle"}
		args = append(args, consoleArgs(cfg)...)
		if err := procs.start(ctx, o.dir, "prometheus", bin, args...); err != nil {
			return err
		}
		if err := waitHTTP(ctx, "http://"+o.prometheus+"/-/ready", procs.exited("prometheus")); err != nil {
			return fmt.Errorf("prometheus: %w (log: %s)", err, procs.log("prometheus"))
		}
		promURL = "http://" + o.prometheus
		say("prometheus on %s", promURL)
	} else {
		say("prometheus is not installed (sudo apt-get install prometheus): no dashboards this time")
	}

	// The built-in replay through both edges.
	if o.pops > 1 {
		say("replaying %v of traffic at %.0f requests/s, each client dealt over every edge of the %d PoPs: Zipf clients, an abuser, credential stuffing", o.duration, o.rate, o.pops)
	} else {
		say("replaying %v of traffic at %.0f requests/s through both edges: Zipf clients, an abuser, credential stuffing", o.duration, o.rate)
	}
	o.timeline = loadtest.NewTimelineRecorder(time.Time{})
	logins := newLoginTally()
	rep, err := replay(ctx, o, targets, stdout, logins)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := rep.WriteText(stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := writeSummary(stdout, rep, windows); err != nil {
		return err
	}
	accountLimit := 0
	if o.rules == "" {
		accountLimit = demoAccountLimit
	}
	if err := writeLogins(stdout, logins, rep, countingRules(rulesPath), accountLimit); err != nil {
		return err
	}
	if len(memcache[0]) == 0 {
		say("WARNING: without memcached each edge counted alone: the figures above are not a shared PoP's")
	}
	fmt.Fprintln(stdout)
	say("look at:")
	for i, a := range admins {
		say("  edge-%d metrics   http://%s/metrics", i+1, a) // edge ids run on across PoPs
	}
	say("  accuracy report  http://%s/report", o.aggregator)
	if page, err := writePage(o, rep); err != nil {
		say("WARNING: the replay's page: %v", err)
	} else {
		say("  replay page      file://%s", page)
	}
	if promURL != "" {
		say("  dashboards       %s/consoles/poplimit-overview.html", promURL)
	}
	if o.exit {
		return nil
	}
	say("serving until Ctrl-C")
	<-ctx.Done()
	return nil
}

// replay runs the built-in mix through the edges and fetches the
// aggregator's report at the end.
func replay(ctx context.Context, o *options, targets []string, stdout io.Writer, logins *loginTally) (*loadtest.ReplayReport, error) {
	zipf, err := loadtest.Zipf(loadtest.ZipfConfig{Seed: 1, Clients: 2000, Rate: o.rate * 0.9, Duration: o.duration})
	if err != nil {
		return nil, err
	}
	abuser, err := loadtest.Abuser(loadtest.AbuserConfig{Seed: 2, Rate: max(60, o.rate*0.05), Duration: o.duration})
	if err != nil {
		return nil, err
	}
	// Credential stuffing: new addresses, 3 wrong passwords each, against
	// accounts tried about 20 times each over the run, beside honest users
	// who log in with their password and mistype it one time in ten.
	perIP := o.rate * 0.05 / 3 // new addresses per second
	ips := max(1, int(perIP*o.duration.Seconds()))
	stuffing, err := loadtest.Stuffing(loadtest.StuffingConfig{Seed: 3, Rate: perIP, Attempts: 3,
		Gap: time.Second, IPs: ips, Accounts: max(1, 3*ips/20), Body: "form",
		HonestUsers: 200, HonestRate: max(1, o.rate*0.005), Mistype: 0.1, HonestDuration: o.duration})
	if err != nil {
		return nil, err
	}
	// The report is fetched with flush=1: a rule that counts by response
	// is judged once its requests settled, which the aggregator otherwise
	// waits -settle-lateness for.
	cfg := loadtest.ReplayConfig{Targets: targets, AggregatorURL: "http://" + o.aggregator + "/report?flush=1",
		AggregatorWait: 4 * time.Second, Align: o.align, Phase: o.phase, OnResult: logins.result}
	cfg.Timeline = o.timeline
	if o.pops > 1 {
		cfg.Spread = loadtest.RoundRobin // each client reaches every PoP
	}
	if o.align > 0 {
		cfg.OnStart = func(start time.Time) {
			fmt.Fprintf(stdout, "pop: the replay starts at %s (in %s): phase %s against a %s window grid\n",
				start.UTC().Format(time.RFC3339Nano), time.Until(start).Round(time.Millisecond), o.phase, o.align)
		}
	}
	if isTerminal(os.Stderr) {
		cfg.Progress = os.Stderr
	}
	return loadtest.Replay(ctx, cfg, logins.trace(loadtest.Mix(zipf, abuser, stuffing)))
}

// writePage writes the built-in replay's page, replay.html in the working
// directory (loadtest replay -html's page), and returns its absolute path.
func writePage(o *options, rep *loadtest.ReplayReport) (string, error) {
	path, err := filepath.Abs(filepath.Join(o.dir, "replay.html"))
	if err != nil {
		return "", err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := loadtest.WritePage(f, rep, o.timeline.Timeline()); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// popName is PoP k's name ("pop1", …) followed by sep, or "" with one PoP.
func popName(pops, k int, sep string) string {
	if pops == 1 {
		return ""
	}
	return "pop" + strconv.Itoa(k+1) + sep
}

// ruleWindows returns each rule's window, from the rules file the edges
// read.
func ruleWindows(path string) (map[string]time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rs, err := rules.ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]time.Duration{}
	for _, r := range rs.Rules {
		out[r.Name] = r.Window
	}
	return out, nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// moduleRoot returns the directory of the module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run pop from the poplimit module (go run ./deploy/pop)")
	}
	return filepath.Dir(gomod), nil
}

func waitTCP(ctx context.Context, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("not accepting after 10s")
}

// waitHTTP waits up to 20 s for url to answer 200, or until exited is
// closed (the process serving it has ended).
func waitHTTP(ctx context.Context, url string, exited <-chan struct{}) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := c.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("exited before %s answered", url)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not answering 200 after 20s", url)
}

// procSet is the processes pop started; stop ends them in reverse order.
type procSet struct {
	procs []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (ps *procSet) start(ctx context.Context, dir, name, bin string, args ...string) error {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches pop alone; pop stops them in order
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	ps.procs = append(ps.procs, p)
	return nil
}

func (ps *procSet) log(name string) string {
	for _, p := range ps.procs {
		if p.name == name {
			return p.log
		}
	}
	return ""
}

// exited returns a channel closed when the named process has ended (nil,
// which never is, for a name pop did not start).
func (ps *procSet) exited(name string) <-chan struct{} {
	for _, p := range ps.procs {
		if p.name == name {
			return p.done
		}
	}
	return nil
}

// tail returns the last lines of the named process's log, indented, for an
// error message.
func (ps *procSet) tail(name string) string {
	b, err := os.ReadFile(ps.log(name))
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(0, len(lines)-10):]
	return "\n    " + strings.Join(lines, "\n    ")
}

// stop sends SIGTERM to each process, newest first (edges flush their
// counters before the shards go), and SIGKILL to any still running after
// 10 seconds.
func (ps *procSet) stop(w io.Writer) {
	for i := len(ps.procs) - 1; i >= 0; i-- {
		p := ps.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if len(ps.procs) > 0 {
		fmt.Fprintf(w, "pop: stopped %d processes\n", len(ps.procs))
	}
}
