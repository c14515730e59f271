package edge

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/internal/certfile"
	"github.com/poplimit/poplimit/rules"
)

// reloader swaps in the rules files' new versions for every front end: the
// core decides by them, and each front end is told (the fasthttp server
// logs what it will not apply). Its metrics say how the last one went.
type reloader struct {
	reloads   *prometheus.CounterVec
	ok        prometheus.Gauge
	unsettled prometheus.Counter
	// loaded stamps the rules files' contents last applied or rejected
	// (under reloadMu), so the watcher neither misses a change made
	// before it starts nor applies again what Reload applied.
	loaded string
	// applying, when set, is called while a reload holds reloadMu, after
	// the new rules are swapped in: a test hook.
	applying func()
}

func newReloader(reg prometheus.Registerer) (*reloader, error) {
	r := &reloader{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "rule_reloads_total", Help: "Rule reloads, by result (applied, rejected)."}, []string{"result"}),
		ok: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "rules_last_reload_ok", Help: "1 if the last rule reload was applied, 0 if it was rejected."}),
		unsettled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "rule_changes_unsettled_total", Help: "Contents of the rules files seen and not applied because they changed again within -reload-settle (files written in place rather than replaced by a rename)."}),
	}
	r.reloads.WithLabelValues("applied")
	r.reloads.WithLabelValues("rejected")
	r.ok.Set(1)
	if reg != nil {
		for _, c := range []prometheus.Collector{r.reloads, r.ok, r.unsettled} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// readRules reads the rules and overrides files once, each within
// RulesMaxBytes, and stamps their contents; a read that fails is stamped
// with its error, so that a new failure is a change too.
func (e *Edge) readRules() (*decision.Sources, string, error) {
	o := &e.Options
	src, err := decision.ReadSources(o.RulesFile, o.OverridesFile, o.RulesMaxBytes)
	if err != nil {
		return nil, "error: " + err.Error(), err
	}
	return src, src.Stamp, nil
}

// Reload reads the rules and overrides files again and swaps them in for
// every front end, at once. A bad file (or one over RulesMaxBytes) is
// rejected with every error listed, the running rules stay, and the
// failure is logged and counted. Reloads are serialized.
func (e *Edge) Reload() error {
	src, stamp, err := e.readRules()
	return e.apply(src, stamp, err)
}

// apply swaps in the rules of src (read with readErr), whose contents
// stamp names: the watcher compares the files with it.
func (e *Edge) apply(src *decision.Sources, stamp string, readErr error) error {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	e.reload.loaded = stamp
	var rs *rules.Rules
	err := readErr
	if err == nil {
		rs, err = src.Rules()
	}
	return e.swapLocked(rs, err, "file", e.Options.RulesFile)
}

// swapLocked puts rs in force for every front end, or, when err (why rs
// could not be built) is set or the core refuses rs, keeps the running
// rules; either way it is counted and logged, naming the source (from:
// "file" or "xds", and which). reloadMu must be held.
func (e *Edge) swapLocked(rs *rules.Rules, err error, from, which string) error {
	o := &e.Options
	if err == nil {
		err = e.Core.SetRules(rs)
	}
	if err != nil {
		e.reload.reloads.WithLabelValues("rejected").Inc()
		e.reload.ok.Set(0)
		o.Logger.Error("edge: reload rejected; the running rules stay", "err", err)
		return err
	}
	if e.reload.applying != nil {
		e.reload.applying()
	}
	e.Server.CheckRules(rs)
	e.reload.reloads.WithLabelValues("applied").Inc()
	e.reload.ok.Set(1)
	o.Logger.Info("edge: rules reloaded", "rules", len(rs.Rules), from, which)
	return nil
}

// watchFiles reloads the rules when the rules or overrides files' contents
// change (read every ReloadPoll, symlinks followed) or when hup receives,
// until ctx ends. The TLS pairs have their own watcher (watchCerts).
//
// New contents apply only once two reads ReloadSettle apart found the
// same bytes, so a file truncated and written in steps never applies
// half-written; SIGHUP applies the files as they are then, once they are
// settled likewise, even when they have not changed. What is read is what
// applies: the bytes stamped are the bytes parsed.
func (e *Edge) watchFiles(ctx context.Context, hup <-chan os.Signal) {
	o := &e.Options
	var (
		pending string    // contents seen, not yet settled
		since   time.Time // when pending was first seen
		force   bool      // a SIGHUP: apply once settled even if unchanged
	)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	check := func() {
		src, cur, err := e.readRules()
		now := time.Now()
		e.reloadMu.Lock()
		applied := e.reload.loaded
		e.reloadMu.Unlock()
		switch {
		case cur == applied && !force:
			if pending != "" && pending != cur {
				e.reload.unsettled.Inc() // changed, then back to what is in force
			}
			pending = ""
			return
		case cur != pending:
			if pending != "" {
				e.reload.unsettled.Inc()
			}
			pending, since = cur, now
			if o.ReloadSettle > 0 {
				settle.Reset(o.ReloadSettle)
				return
			}
		case now.Sub(since) < o.ReloadSettle:
			return
		}
		e.apply(src, cur, err)
		pending, force = "", false
	}
	t := time.NewTicker(o.ReloadPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			force = true
			check()
		case <-settle.C:
			check()
		case <-t.C:
			check()
		}
	}
}

// tlsPairs are the certificate pairs read from files, which the edge
// reloads when they change: the traffic listener's and the rate limit
// service's.
func (e *Edge) tlsPairs() []*certfile.Pair {
	var ps []*certfile.Pair
	if p := e.Server.TLSPair(); p != nil {
		ps = append(ps, p)
	}
	if e.RLS != nil {
		if p := e.RLS.TLSPair(); p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// startWatchers starts the watchers of the rules files (watchFiles) and
// of the TLS pairs (certfile.Watch, every ReloadPoll and on SIGHUP), each
// with its own SIGHUP channel, until ctx ends or the edge closes: close
// stops them and waits for them before it closes anything else.
func (e *Edge) startWatchers(ctx context.Context) {
	o := &e.Options
	rules, pairs := o.RulesFile != "" || o.OverridesFile != "", e.tlsPairs()
	if !rules && len(pairs) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var hups []chan os.Signal
	watch := func(f func(hup <-chan os.Signal)) {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		hups = append(hups, hup)
		wg.Add(1)
		go func() { defer wg.Done(); f(hup) }()
	}
	if rules {
		watch(func(hup <-chan os.Signal) { e.watchFiles(ctx, hup) })
	}
	if len(pairs) > 0 {
		watch(func(hup <-chan os.Signal) { certfile.Watch(ctx, o.ReloadPoll, hup, pairs...) })
	}
	stop := func() {
		cancel()
		wg.Wait()
		for _, hup := range hups {
			signal.Stop(hup)
		}
	}
	e.watchMu.Lock()
	if e.watchStop != nil || e.closing {
		e.watchMu.Unlock()
		stop() // Serve called twice, or after Close: one set of watchers
		return
	}
	e.watchStop = stop
	e.watchMu.Unlock()
}

// stopWatchers stops the watchers startWatchers started, and waits for them.
func (e *Edge) stopWatchers() {
	e.watchMu.Lock()
	stop := e.watchStop
	e.watchStop, e.closing = nil, true
	e.watchMu.Unlock()
	if stop != nil {
		stop()
	}
}
