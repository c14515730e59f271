package edge

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/rls/xds"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// startXDS starts the subscription to Options.XDS's management server,
// stopped at Close. Each configuration it receives applies as a reload of
// envoyproxy/ratelimit files does (swapLocked), or is NACKed with the
// error that rejected it.
func (e *Edge) startXDS(reg prometheus.Registerer) error {
	o := &e.Options
	if o.RulesFile != "" || o.OverridesFile != "" {
		return fmt.Errorf("edge: XDS.Server %q and RulesFile/OverridesFile: the rules come from one source, xDS or files", o.XDS.Server)
	}
	sub, err := xds.New(o.XDS, e.applyXDS, o.Logger, reg)
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sub.Run(ctx); err != nil {
			o.Logger.Error("edge: xDS subscription stopped", "err", err)
		}
	}()
	e.closers = append(e.closers, func(context.Context) error { cancel(); <-done; return nil })
	e.xds = sub
	return nil
}

// applyXDS loads the files of an xDS configuration as envoyproxy/ratelimit
// files are loaded (envoyconf, within RulesMaxBytes each) and swaps them
// in for every front end; the error is the NACK's detail.
func (e *Edge) applyXDS(version string, files map[string][]byte) error {
	rs, err := envoyconf.Loader{MaxFileBytes: int(e.Options.RulesMaxBytes)}.RulesOf(files)
	if err != nil {
		err = fmt.Errorf("edge: xDS configuration %q: %w", version, err)
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	return e.swapLocked(rs, err, "xds_version", version)
}

// WaitConfig returns once the first configuration from the xDS management
// server is in force, or at once without XDS.Server or with
// XDS.ForceStart; cmd/edge calls it before Listen, so that nothing is
// served before there is a configuration to serve. The error is ctx's.
func (e *Edge) WaitConfig(ctx context.Context) error {
	if e.xds == nil || e.Options.XDS.ForceStart {
		return nil
	}
	select {
	case <-e.xds.Applied():
		return nil
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("edge: no configuration from the xDS management server %s yet", e.Options.XDS.Server), ctx.Err())
	}
}

// XDSVersion is the version_info of the xDS configuration in force, ""
// before the first or without XDS.Server.
func (e *Edge) XDSVersion() string {
	if e.xds == nil {
		return ""
	}
	return e.xds.Version()
}
