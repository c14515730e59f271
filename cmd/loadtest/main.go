// Command loadtest makes, imports, replays and simulates traces for a
// poplimit PoP (package loadtest):
//
//	loadtest gen -kind zipf -rate 1000 -duration 1m > trace.jsonl
//	loadtest import access.log > trace.jsonl
//	loadtest replay -targets 127.0.0.1:7070,127.0.0.1:7080 -trace trace.jsonl [-aggregator http://127.0.0.1:7072/report] [-json]
//	loadtest replay -trace trace.jsonl -align 10s -phase 2.5s -results results.tsv
//	loadtest offline -rules rules.yaml -trace trace.jsonl
//	loadtest replay -trace trace.jsonl -results results.tsv -html replay.html
//	loadtest report -results results.tsv [-replay-json report.json] -html replay.html
//
// replay -align W -phase D starts the trace's offset 0 at D past a
// wall-clock multiple of W (a rule's window), so a live replay is measured
// at a known phase of the window grid, as offline -phase D simulates it;
// the report says which. replay -results FILE writes one tab-separated line
// per request (loadtest/RESULTS.md): scheduled, sent and answered times in
// Unix ns, edge, client, method, host and target, status, outcome, and the
// deciding rule's limit, remaining, reset, window and Retry-After from the
// response headers.
//
// replay -html FILE writes the replay as one self-contained HTML page of
// charts (loadtest.WritePage): requests per second by outcome, latency over
// time, and per rule the judged decisions and the worst keys' admitted
// count in every trailing window against the limit. report -html draws the
// same page later from a -results file (and the replay's -json report, for
// its settings and the aggregator's judgment).
//
// Every flag has a working default: `loadtest gen | loadtest replay` drives
// an edge started with no flags (127.0.0.1:7070) with a mix of traffic, and
// `loadtest gen | loadtest offline` shows what the edge's built-in rule
// would do with it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/window"

	"github.com/poplimit/poplimit/loadtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
}

const usage = `usage: loadtest COMMAND [flags]

commands:
  gen       write a generated trace (zipf, abuser, burst, flood, stuffing, mix)
  import    convert Common/Combined Log Format access logs to a trace
  replay    send a trace to edges, open-loop, and report
  offline   run rules over a trace with no server: what would they limit?
  report    rebuild a replay's report (and its -html page) from a -results file

"loadtest COMMAND -h" lists a command's flags.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("loadtest: no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "gen":
		return runGen(rest, stdout, stderr)
	case "import":
		return runImport(rest, stdin, stdout, stderr)
	case "replay":
		return runReplay(ctx, rest, stdin, stdout, stderr)
	case "offline":
		return runOffline(ctx, rest, stdin, stdout, stderr)
	case "report":
		return runReport(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("loadtest: unknown command %q", cmd)
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("loadtest "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func parse(fs *flag.FlagSet, args []string, maxArgs int) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > maxArgs {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args()[maxArgs:])
	}
	return nil
}

// output opens path for writing ("-" is stdout); close flushes it.
func output(path string, stdout io.Writer) (io.Writer, func() error, error) {
	if path == "" || path == "-" {
		return stdout, func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("loadtest: %w", err)
	}
	return f, f.Close, nil
}

// traceFrom returns the trace at path ("-" is stdin), read as JSON lines,
// or as an access log when asLog.
func traceFrom(path string, asLog bool, stdin io.Reader) (loadtest.Trace, error) {
	if !asLog {
		if path == "-" {
			return loadtest.NewReader(stdin).All(), nil
		}
		return loadtest.ReadFile(path), nil
	}
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
		r = f // closed at exit: one file per command
	}
	return loadtest.NewImporter(r, loadtest.ImportConfig{}).All(), nil
}

func runGen(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("gen", stderr)
	kind := fs.String("kind", "mix", "zipf, abuser, burst, flood, stuffing, mix (all of those at once) or nearlimit (clients at and over one per-client limit)")
	seed := fs.Uint64("seed", 1, "random seed: one seed, one trace")
	dur := fs.Duration("duration", time.Minute, "trace length (zipf, abuser, flood, mix)")
	rate := fs.Float64("rate", 100, "requests per second (zipf, flood; abuser's is -abuser-rate)")
	clients := fs.Int("clients", 1000, "zipf and nearlimit: clients")
	s := fs.Float64("zipf-s", 1.1, "zipf: exponent, above 1")
	abRate := fs.Float64("abuser-rate", 0, "abuser: requests per second (default twice -limit per -window)")
	ip := fs.String("ip", "", "abuser and burst: client address (default 192.0.2.1, burst 198.51.100.1)")
	limit := fs.Int("limit", 100, "burst: requests in each half; the rule limit the abuser exceeds; nearlimit: the per-client limit")
	win := fs.Duration("window", time.Minute, "burst and nearlimit: the rule's window")
	bursts := fs.Int("bursts", 1, "burst: double bursts, three windows apart")
	ips := fs.Int("ips", 1000, "stuffing: addresses")
	attempts := fs.Int("attempts", 3, "stuffing: attempts per address")
	userHeader := fs.String("user-header", "", "stuffing: header carrying a user name per attempt")
	accounts := fs.Int("accounts", 0, "stuffing: accounts the addresses attack together, each attempt one at random with a wrong password (0: a fresh user name per attempt)")
	body := fs.String("body", "", "stuffing: put the user name and password in the body: form (username=, password=) or json ({\"user\":{\"email\"},\"password\"}); default none")
	honestUsers := fs.Int("honest-users", 0, "stuffing: honest users, each on its own address logging in to its own account with its password")
	honestRate := fs.Float64("honest-rate", 2, "stuffing: the honest users' logins per second, all together")
	mistype := fs.Float64("mistype", 0.1, "stuffing: probability that an honest login has a wrong password (retried 1 to 3 s later)")
	method := fs.String("method", "", "HTTP method (default GET; stuffing POST)")
	host := fs.String("host", "", "Host header (default: the replay target's)")
	path := fs.String("path", "", `path (default "/"; stuffing "/login")`)
	out := fs.String("o", "-", "output file")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	ep := loadtest.Endpoint{Method: *method, Host: *host, Path: *path}
	var addr netip.Addr
	if *ip != "" {
		var err error
		if addr, err = netip.ParseAddr(*ip); err != nil {
			return fmt.Errorf("loadtest gen: -ip: %w", err)
		}
	}
	if *abRate == 0 {
		*abRate = 2 * float64(*limit) / win.Seconds()
	}
	gens := map[string]func() (loadtest.Trace, error){
		"zipf": func() (loadtest.Trace, error) {
			return loadtest.Zipf(loadtest.ZipfConfig{Seed: *seed, Clients: *clients, S: *s, Rate: *rate, Duration: *dur, Endpoint: ep})
		},
		"abuser": func() (loadtest.Trace, error) {
			return loadtest.Abuser(loadtest.AbuserConfig{Seed: *seed, IP: addr, Rate: *abRate, Duration: *dur, Endpoint: ep})
		},
		"burst": func() (loadtest.Trace, error) {
			return loadtest.Burst(loadtest.BurstConfig{IP: addr, Limit: *limit, Window: *win, Bursts: *bursts, Endpoint: ep})
		},
		"flood": func() (loadtest.Trace, error) {
			return loadtest.Flood(loadtest.FloodConfig{Seed: *seed, Rate: *rate, Duration: *dur, Endpoint: ep})
		},
		"nearlimit": func() (loadtest.Trace, error) {
			return loadtest.NearLimit(loadtest.NearLimitConfig{Seed: *seed, Clients: *clients, Limit: *limit, Window: *win, Duration: *dur, Endpoint: ep})
		},
		"stuffing": func() (loadtest.Trace, error) {
			return loadtest.Stuffing(loadtest.StuffingConfig{Seed: *seed, IPs: *ips, Attempts: *attempts, UserHeader: *userHeader, Endpoint: ep,
				Accounts: *accounts, Body: *body, HonestUsers: *honestUsers, HonestRate: *honestRate, Mistype: *mistype})
		},
	}
	var tr loadtest.Trace
	if *kind == "mix" {
		var parts []loadtest.Trace
		for _, k := range []string{"zipf", "abuser", "burst", "flood", "stuffing"} {
			p, err := gens[k]()
			if err != nil {
				return err
			}
			parts = append(parts, p)
		}
		tr = loadtest.Mix(parts...)
	} else if mk, ok := gens[*kind]; ok {
		var err error
		if tr, err = mk(); err != nil {
			return err
		}
	} else {
		return fmt.Errorf("loadtest gen: -kind %q: want zipf, abuser, burst, flood, stuffing, mix or nearlimit", *kind)
	}
	w, closeOut, err := output(*out, stdout)
	if err != nil {
		return err
	}
	if _, _, err := loadtest.WriteTrace(w, tr); err != nil {
		closeOut()
		return err
	}
	return closeOut()
}

func runImport(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("import", stderr)
	var cfg loadtest.ImportConfig
	fs.StringVar(&cfg.Host, "host", "", "Host of requests whose line names none (default: the replay target's)")
	fs.BoolVar(&cfg.Agents, "agents", false, "keep User-Agent and Referer as headers")
	fs.BoolVar(&cfg.Spread, "spread", true, "spread the lines of one logged second over that second")
	fs.IntVar(&cfg.MaxBuffered, "max-lines", loadtest.DefaultImportLines, "good lines held to put in time order: a log of at most this many is sorted whole (about 250 bytes each); past them, lines are sorted within a window (-reorder)")
	fs.DurationVar(&cfg.Reorder, "reorder", 10*time.Second, "past -max-lines lines: put lines this far out of time order back in order (the window grows to the largest disorder seen)")
	out := fs.String("o", "-", "output trace file")
	showBad := fs.Int("show-bad", 20, "print at most this many bad lines (all are counted)")
	jsonSum := fs.Bool("json", false, "print the summary as JSON")
	if err := parse(fs, args, 1); err != nil {
		return err
	}
	if cfg.MaxBuffered < 1 || cfg.Reorder <= 0 {
		return errors.New("loadtest import: -max-lines must be at least 1 and -reorder above 0")
	}
	in := stdin
	if p := fs.Arg(0); p != "" && p != "-" {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("loadtest import: %w", err)
		}
		defer f.Close()
		in = f
	}
	w, closeOut, err := output(*out, stdout)
	if err != nil {
		return err
	}
	shown := 0
	sum, err := loadtest.Import(in, w, cfg, func(le *loadtest.LineError) {
		if shown++; shown <= *showBad {
			fmt.Fprintln(stderr, "bad", le)
		}
	})
	if cerr := closeOut(); err == nil {
		err = cerr
	}
	if *jsonSum {
		enc := json.NewEncoder(stderr)
		enc.SetIndent("", "  ")
		enc.Encode(sum)
	} else {
		sum.WriteText(stderr)
	}
	return err
}

func runReplay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("replay", stderr)
	var cfg loadtest.ReplayConfig
	targets := fs.String("targets", "127.0.0.1:7070", "edges, host:port,...")
	tracePath := fs.String("trace", "-", `trace file ("-": standard input)`)
	asLog := fs.Bool("log", false, "the trace is an access log (Common/Combined Log Format)")
	spread := fs.String("spread", "by-client", `"by-client" (a client's hash picks its edge, like anycast) or "round-robin"`)
	fs.Float64Var(&cfg.Speed, "speed", 1, "speed-up: 2 replays twice as fast")
	fs.IntVar(&cfg.ConnsPerTarget, "conns", 64, "connections per target")
	fs.IntVar(&cfg.MaxOutstanding, "max-outstanding", 10_000, "requests unanswered at most; more due are not sent, and counted")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "per request")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop sending after this long (0: the whole trace)")
	fs.Int64Var(&cfg.MaxRequests, "requests", 0, "stop after this many requests (0: no bound)")
	fs.DurationVar(&cfg.Align, "align", 0, "start at the next wall-clock multiple of this since the Unix epoch (a rule's window): the trace's offset 0 on the window grid")
	fs.DurationVar(&cfg.Phase, "phase", 0, "with -align W: start this far past a multiple of W instead (0 ≤ phase < W), e.g. -align 10s -phase 2.5s")
	resultsPath := fs.String("results", "", "write one tab-separated line per request to this file: times, client, request, status, rule and quota (see loadtest/RESULTS.md)")
	fs.StringVar(&cfg.ClientIPHeader, "ip-header", "X-Forwarded-For", "header carrying each request's client address")
	fs.BoolVar(&cfg.OmitClientIP, "no-ip", false, "send no client address header")
	fs.StringVar(&cfg.PathPrefix, "path-prefix", "", `put before every path (e.g. "/check")`)
	fs.StringVar(&cfg.AggregatorURL, "aggregator", "", "aggregator report URL, fetched at the end (e.g. http://127.0.0.1:7072/report)")
	fs.DurationVar(&cfg.AggregatorWait, "aggregator-wait", time.Second, "wait before fetching the aggregator's report (its allowed lateness)")
	progress := fs.String("progress", "auto", `"auto" (when stderr is a terminal), "on" or "off"`)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	htmlPath := fs.String("html", "", "write the replay as one self-contained HTML page of charts to this file")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *htmlPath != "" {
		cfg.Timeline = loadtest.NewTimelineRecorder(time.Time{})
	}
	cfg.Targets = splitList(*targets)
	switch *spread {
	case "by-client":
		cfg.Spread = loadtest.ByClient
	case "round-robin":
		cfg.Spread = loadtest.RoundRobin
	default:
		return fmt.Errorf("loadtest replay: -spread %q: want by-client or round-robin", *spread)
	}
	switch *progress {
	case "on":
		cfg.Progress = stderr
	case "auto":
		if isTerminal(stderr) {
			cfg.Progress = stderr
		}
	case "off":
	default:
		return fmt.Errorf("loadtest replay: -progress %q: want auto, on or off", *progress)
	}
	if cfg.Phase != 0 && cfg.Align == 0 {
		return errors.New("loadtest replay: -phase needs -align (the window grid it is a phase of)")
	}
	tr, err := traceFrom(*tracePath, *asLog, stdin)
	if err != nil {
		return err
	}
	cfg.OnStart = func(start time.Time) {
		if cfg.Align > 0 {
			fmt.Fprintf(stderr, "loadtest replay: starting at %s (in %s): phase %s against a %s window grid\n",
				start.UTC().Format(time.RFC3339Nano), time.Until(start).Round(time.Millisecond), cfg.Phase, cfg.Align)
		}
	}
	var results *os.File
	if *resultsPath != "" {
		if results, err = os.Create(*resultsPath); err != nil {
			return fmt.Errorf("loadtest replay: -results: %w", err)
		}
		cfg.Results = results
	}
	rep, err := loadtest.Replay(ctx, cfg, tr)
	if results != nil {
		if cerr := results.Close(); cerr != nil && rep != nil && rep.ResultsError == "" {
			rep.ResultsError = cerr.Error()
		}
	}
	if rep == nil {
		return err
	}
	if werr := writeReport(stdout, *asJSON, rep, rep.WriteText); err == nil {
		err = werr
	}
	if err == nil && rep.ResultsError != "" {
		err = fmt.Errorf("loadtest replay: -results %s: %s", *resultsPath, rep.ResultsError)
	}
	if *htmlPath != "" {
		if herr := writePage(*htmlPath, rep, cfg.Timeline.Timeline, stderr); err == nil {
			err = herr
		}
	}
	return err
}

// writePage writes the replay's HTML page to path and says on stderr how
// big it is and how long it took (the timeline's summing included).
func writePage(path string, rep *loadtest.ReplayReport, timeline func() *loadtest.Timeline, stderr io.Writer) error {
	t0 := time.Now()
	tl := timeline()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loadtest: -html: %w", err)
	}
	if err := loadtest.WritePage(f, rep, tl); err != nil {
		f.Close()
		return fmt.Errorf("loadtest: -html %s: %w", path, err)
	}
	st, err := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("loadtest: -html: %w", err)
	}
	fmt.Fprintf(stderr, "loadtest: wrote %s (%d bytes) in %s\n", path, st.Size(), time.Since(t0).Round(time.Millisecond))
	return nil
}

func runReport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("report", stderr)
	resultsPath := fs.String("results", "", "the results file a replay wrote (replay -results)")
	basePath := fs.String("replay-json", "", "the replay's JSON report (replay -json), for its settings and the aggregator's report (optional)")
	htmlPath := fs.String("html", "", "write the replay's HTML page to this file")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *resultsPath == "" {
		return errors.New("loadtest report: -results FILE is required")
	}
	var base *loadtest.ReplayReport
	if *basePath != "" {
		data, err := os.ReadFile(*basePath)
		if err != nil {
			return fmt.Errorf("loadtest report: -replay-json: %w", err)
		}
		base = &loadtest.ReplayReport{}
		if err := json.Unmarshal(data, base); err != nil {
			return fmt.Errorf("loadtest report: -replay-json %s: not a replay's JSON report: %w", *basePath, err)
		}
	}
	rep, tl, err := loadtest.ReadResults(*resultsPath, base)
	if err != nil {
		return err
	}
	if err := writeReport(stdout, *asJSON, rep, rep.WriteText); err != nil {
		return err
	}
	if *htmlPath != "" {
		return writePage(*htmlPath, rep, func() *loadtest.Timeline { return tl }, stderr)
	}
	return nil
}

func runOffline(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("offline", stderr)
	var cfg loadtest.OfflineConfig
	rulesPath := fs.String("rules", "", "rules YAML file (default: the edge's built-in rule)")
	overrides := fs.String("overrides", "", "key → tier overrides YAML file")
	tracePath := fs.String("trace", "-", `trace file ("-": standard input)`)
	asLog := fs.Bool("log", false, "the trace is an access log (Common/Combined Log Format)")
	origin := fs.String("origin", "", "RFC 3339 time of the trace's offset 0 (default: the trace's own, else the Unix epoch)")
	fs.IntVar(&cfg.TopKeys, "top", 10, "most limited keys shown per rule")
	fs.IntVar(&cfg.MaxKeys, "tracked-keys", loadtest.DefaultTrackedKeys, "limited keys tracked per rule for the report")
	fs.IntVar(&cfg.MaxKeys, "max-keys", loadtest.DefaultTrackedKeys, "the same as -tracked-keys (the old spelling; not the edge's -max-keys)")
	flush := window.Config{}.WithDefaults().FlushInterval // the edge's
	fs.DurationVar(&cfg.FlushInterval, "flush-interval", flush, "the simulated edge's flush interval")
	fs.DurationVar(&cfg.FlushInterval, "flush", flush, "the same as -flush-interval")
	fs.IntVar(&cfg.Edges, "edges", 1, "edges of one simulated PoP, each with the edge's own core over one shared store in simulated time")
	spread := fs.String("spread", "by-client", `with -edges: "by-client" (each client on one edge, by the replay's hash of its address) or "round-robin" (every client's requests dealt over all edges)`)
	fs.BoolVar(&cfg.GuessPeers, "guess-peers", false, "the edges' -guess-peers (with -async-near-limit): count the units the others likely admitted since the last reply")
	fs.BoolVar(&cfg.AsyncNearLimit, "async-near-limit", false, "the edges' -async-near-limit: keep every decision local, even near the limit")
	fs.DurationVar(&cfg.MaxDefer, "max-defer", 0, "the edges' -max-defer: how long a key far from its limit may keep its units unsent (default the edge's; negative: every flush)")
	fs.DurationVar(&cfg.RTT, "rtt", 0, "with -edges: the round trip to the shared store (an edge reads the others' units this late)")
	fs.StringVar(&cfg.CheckPrefix, "check-prefix", httpedge.DefaultCheckPrefix, "path prefix stripped before matching, as the edge's")
	fs.DurationVar(&cfg.SettleDelay, "settle-delay", loadtest.DefaultSettleDelay, "how long after a request without duration_ms its response is known: a rule with count settles it then, with the line's status (a line without one keeps its units)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	judgeIt := fs.Bool("judge", false, "judge every decision with the aggregator's judge: the algorithm's own accuracy, undistributed")
	phase := fs.Duration("phase", 0, "the trace's offset 0 this far past a window boundary: origin = the Unix epoch (a multiple of every window) + phase, as replay -align W -phase D runs it live")
	phases := fs.Int("phases", 1, "with -judge: run the trace this many times, its start shifted by k/N of the longest window against the window grid, and report each phase's accuracy with the worst and the mean (a trace that starts on a window boundary flatters the sliding-window estimate)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	phaseSet := false
	fs.Visit(func(f *flag.Flag) { phaseSet = phaseSet || f.Name == "phase" })
	if *phases < 1 || *phases > 64 || *phases > 1 && (!*judgeIt || *tracePath == "-" || *origin != "" || phaseSet) {
		return errors.New("loadtest offline: -phases N: 1 to 64, with -judge, a -trace file and no -origin or -phase")
	}
	if *phase < 0 || phaseSet && *origin != "" {
		return errors.New("loadtest offline: -phase D: at least 0, and not with -origin (it sets the origin)")
	}
	rs, err := decision.LoadFiles(*rulesPath, *overrides) // the edge's own loader: same files, same built-in rule
	if err != nil {
		return fmt.Errorf("loadtest offline: %w", err)
	}
	cfg.Rules = rs
	if *origin != "" {
		if cfg.Origin, err = time.Parse(time.RFC3339Nano, *origin); err != nil {
			return fmt.Errorf("loadtest offline: -origin: %w", err)
		}
	}
	if phaseSet {
		cfg.Origin = time.Unix(0, 0).Add(*phase).UTC()
	}
	tr, err := traceFrom(*tracePath, *asLog, stdin)
	if err != nil {
		return err
	}
	switch *spread {
	case "by-client":
		cfg.Spread = loadtest.ByClient
	case "round-robin":
		cfg.Spread = loadtest.RoundRobin
	default:
		return fmt.Errorf("loadtest offline: -spread %q: want by-client or round-robin", *spread)
	}
	if *phases > 1 {
		return offlinePhases(ctx, cfg, *phases, func() (loadtest.Trace, error) { return traceFrom(*tracePath, *asLog, stdin) }, stdout, *asJSON)
	}
	var j *judge.Judge
	if *judgeIt {
		jc := judge.DefaultConfig()
		jc.Hold = 0 // simulated time: events arrive in order, at once
		if j, err = judge.New(jc, nil); err != nil {
			return err
		}
		cfg.OnEvent = func(e *event.Event) { j.Add(e.Time, *e) }
	}
	rep, err := loadtest.Offline(ctx, cfg, tr)
	if rep == nil {
		return err
	}
	if j != nil {
		j.Flush()
		if rep.Accuracy, err = json.Marshal(j.Report()); err != nil {
			return err
		}
	}
	if werr := writeReport(stdout, *asJSON, rep, rep.WriteText); err == nil {
		err = werr
	}
	return err
}

// phaseResult is the accuracy of one run of offlinePhases.
type phaseResult struct {
	PhaseMillis float64             `json:"phase_ms"` // the trace's start into the window grid
	Enforced    judge.DecisionTally `json:"enforced"`
	WorstRatio  float64             `json:"worst_key_ratio"` // the most over-admitted key's count ÷ its limit (0: none)
	// MeanRelativeError is the judge's mean |estimate − exact| / exact.
	MeanRelativeError float64 `json:"mean_relative_error"`
	// StoreOpsPerRequest is the operations the edges sent the store per request.
	StoreOpsPerRequest float64 `json:"store_ops_per_request"`
	// StoreOpsByKind is those operations by kind, over Requests.
	StoreOpsByKind loadtest.StoreOpsByKind `json:"store_ops_by_kind"`
	Requests       int64                   `json:"requests"`
}

// offlinePhases judges the trace at phases k/n of the longest window:
// origin = the Unix epoch (a multiple of every window) + k·W/n.
func offlinePhases(ctx context.Context, cfg loadtest.OfflineConfig, n int, open func() (loadtest.Trace, error), w io.Writer, asJSON bool) error {
	var longest time.Duration
	for _, r := range cfg.Rules.Rules {
		longest = max(longest, r.Window)
	}
	var res []phaseResult
	for k := 0; k < n; k++ {
		tr, err := open()
		if err != nil {
			return err
		}
		jc := judge.DefaultConfig()
		jc.Hold = 0
		j, err := judge.New(jc, nil)
		if err != nil {
			return err
		}
		c := cfg
		phase := longest * time.Duration(k) / time.Duration(n)
		c.Origin = time.Unix(0, 0).Add(phase)
		c.OnEvent = func(e *event.Event) { j.Add(e.Time, *e) }
		rep, err := loadtest.Offline(ctx, c, tr)
		if err != nil {
			return err
		}
		j.Flush()
		r := j.Report()
		pr := phaseResult{PhaseMillis: float64(phase) / 1e6, Enforced: r.Enforced, MeanRelativeError: r.MeanRelativeError,
			StoreOpsByKind: rep.StoreOpsByKind, Requests: rep.Requests}
		if rep.Requests > 0 {
			pr.StoreOpsPerRequest = float64(rep.StoreOps) / float64(rep.Requests)
		}
		for _, kk := range r.TopFalseNegatives {
			pr.WorstRatio = max(pr.WorstRatio, kk.Ratio)
		}
		res = append(res, pr)
	}
	worst, mean, worstKey, mre, ops := 0.0, 0.0, 0.0, 0.0, 0.0
	var kinds [5]float64 // per request, mean over the phases: increments, near-limit syncs, reads, decrements, states
	for _, r := range res {
		if req := float64(r.Requests); req > 0 {
			k := r.StoreOpsByKind
			for i, n := range [5]int64{k.Increments, k.NearLimitSyncs, k.Reads, k.Decrements, k.States} {
				kinds[i] += float64(n) / req / float64(len(res))
			}
		}
		worst = max(worst, r.Enforced.WrongRatio)
		mean += r.Enforced.WrongRatio / float64(len(res))
		worstKey = max(worstKey, r.WorstRatio)
		mre += r.MeanRelativeError / float64(len(res))
		ops += r.StoreOpsPerRequest / float64(len(res))
	}
	if asJSON {
		return writeReport(w, true, map[string]any{"phases": res, "worst_wrong_ratio": worst, "mean_wrong_ratio": mean, "worst_key_ratio": worstKey,
			"mean_relative_error": mre, "store_ops_per_request": ops}, nil)
	}
	fmt.Fprintf(w, "%-10s %10s %10s %10s %9s %10s %8s %8s\n", "phase", "decisions", "w.allowed", "w.limited", "wrong", "worst key", "rel.err", "ops/req")
	for _, r := range res {
		fmt.Fprintf(w, "%-10s %10d %10d %10d %8.3f%% %9.3f× %7.2f%% %8.3f\n", time.Duration(r.PhaseMillis*1e6).String(), r.Enforced.Decisions,
			r.Enforced.WronglyAllowed, r.Enforced.WronglyLimited, 100*r.Enforced.WrongRatio, r.WorstRatio, 100*r.MeanRelativeError, r.StoreOpsPerRequest)
	}
	if _, err := fmt.Fprintf(w, "store ops per request, by kind: increments %.3f (near-limit round trips %.3f), reads %.3f, decrements %.3f, bucket and log ops %.3f\n",
		kinds[0], kinds[1], kinds[2], kinds[3], kinds[4]); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "over %d phases: wrong %.3f%% worst, %.3f%% mean; worst key %.3f× its limit; mean relative error %.2f%%; %.3f store ops per request\n",
		n, 100*worst, 100*mean, worstKey, 100*mre, ops)
	return err
}

func writeReport(w io.Writer, asJSON bool, v any, text func(io.Writer) error) error {
	if !asJSON {
		return text(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
