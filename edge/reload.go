package edge

import (
	"context"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// reloader swaps in the rules files' new versions for every front end: the
// core decides by them, and each front end is told (the fasthttp server
// logs what it will not apply). Its metrics say how the last one went.
type reloader struct {
	reloads *prometheus.CounterVec
	ok      prometheus.Gauge
	// loaded and loadedTLS stamp the files as of the edge's building, so
	// a change made before the watch starts is not missed.
	loaded, loadedTLS string
}

func newReloader(reg prometheus.Registerer) (*reloader, error) {
	r := &reloader{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "rule_reloads_total", Help: "Rule reloads, by result (applied, rejected)."}, []string{"result"}),
		ok: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "poplimit", Subsystem: "edge",
			Name: "rules_last_reload_ok", Help: "1 if the last rule reload was applied, 0 if it was rejected."}),
	}
	r.reloads.WithLabelValues("applied")
	r.reloads.WithLabelValues("rejected")
	r.ok.Set(1)
	if reg != nil {
		for _, c := range []prometheus.Collector{r.reloads, r.ok} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// rulesStamp identifies the rules and overrides files' versions (every
// file of a rules directory).
func (e *Edge) rulesStamp() string {
	var b []byte
	for _, f := range []string{e.Options.RulesFile, e.Options.OverridesFile} {
		if f != "" {
			b = append(b, envoyconf.Stamp(f)...)
		}
	}
	return string(b)
}

// Reload reads the rules and overrides files again and swaps them in for
// every front end. A bad file is rejected with every error listed, the
// running rules stay, and the failure is logged and counted. Reloads are
// serialized.
func (e *Edge) Reload() error {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	o := &e.Options
	rs, err := decision.LoadFiles(o.RulesFile, o.OverridesFile)
	if err == nil {
		err = e.Core.SetRules(rs)
	}
	if err != nil {
		e.reload.reloads.WithLabelValues("rejected").Inc()
		e.reload.ok.Set(0)
		o.Logger.Error("edge: reload rejected; the running rules stay", "err", err)
		return err
	}
	e.Server.CheckRules(rs)
	e.reload.reloads.WithLabelValues("applied").Inc()
	e.reload.ok.Set(1)
	o.Logger.Info("edge: rules reloaded", "rules", len(rs.Rules), "file", o.RulesFile)
	return nil
}

// watchFiles reloads the rules when the rules or overrides file changes
// (polled every ReloadPoll) or when hup receives, and the fasthttp
// server's certificate likewise, until ctx ends.
func (e *Edge) watchFiles(ctx context.Context, hup <-chan os.Signal) {
	e.reloadMu.Lock()
	last, lastTLS := e.reload.loaded, e.reload.loadedTLS
	e.reloadMu.Unlock()
	t := time.NewTicker(e.Options.ReloadPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last, lastTLS = e.rulesStamp(), e.Server.TLSStamp()
			e.Reload()
			e.Server.ReloadTLS()
		case <-t.C:
			if cur := e.rulesStamp(); cur != last {
				last = cur
				e.Reload()
			}
			if cur := e.Server.TLSStamp(); cur != lastTLS {
				lastTLS = cur
				e.Server.ReloadTLS()
			}
		}
	}
}
