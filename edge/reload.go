package edge

import (
	"context"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
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
	// before it starts nor applies again what Reload applied; loadedTLS
	// stamps the TLS files as of the edge's building.
	loaded, loadedTLS string
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
// and the fasthttp server's certificate likewise, until ctx ends.
//
// New contents apply only once two reads ReloadSettle apart found the
// same bytes, so a file truncated and written in steps never applies
// half-written; SIGHUP applies the files as they are then, once they are
// settled likewise, even when they have not changed. What is read is what
// applies: the bytes stamped are the bytes parsed.
func (e *Edge) watchFiles(ctx context.Context, hup <-chan os.Signal) {
	o := &e.Options
	e.reloadMu.Lock()
	lastTLS := e.reload.loadedTLS
	e.reloadMu.Unlock()
	watchRules := o.RulesFile != "" || o.OverridesFile != ""
	var (
		pending string    // contents seen, not yet settled
		since   time.Time // when pending was first seen
		force   bool      // a SIGHUP: apply once settled even if unchanged
	)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	check := func() {
		if !watchRules {
			return
		}
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
			lastTLS = e.Server.TLSStamp()
			e.Server.ReloadTLS()
		case <-settle.C:
			check()
		case <-t.C:
			check()
			if cur := e.Server.TLSStamp(); cur != lastTLS {
				lastTLS = cur
				e.Server.ReloadTLS()
			}
		}
	}
}
