// Package fasthttpmw puts poplimit's decision core in front of a fasthttp
// handler: the fasthttp counterpart of package middleware, answering
// exactly as the edge server does (it runs the edge server's request path,
// package httpedge, in front of the wrapped handler instead of an
// upstream). It is a package of its own so that net/http programs do not
// import fasthttp.
//
//	core, err := decision.New(rs, store.NewMemStore(nil), decision.Options{})
//	...
//	wrap, err := fasthttpmw.New(core, middleware.Config{})
//	...
//	fasthttp.ListenAndServe(addr, wrap(handler))
//
// Concurrency rules hold their slot while the wrapped handler runs; load
// shedding does not apply (it needs an upstream's latency).
//
// A program that runs a whole edge (package edge) wraps with its server:
// edge.Edge.Server.Wrap.
package fasthttpmw

import (
	"errors"
	"log/slog"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/middleware"
)

// New returns a wrapper deciding every request by core's rules before the
// wrapped handler sees it, finding the client and answering refusals as
// cfg says (the settings package middleware takes). It reports a nil core
// or an invalid cfg.
func New(core *decision.Core, cfg middleware.Config) (func(fasthttp.RequestHandler) fasthttp.RequestHandler, error) {
	if core == nil {
		return nil, errors.New("fasthttpmw: New: core is nil (decision.New builds one)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := httpedge.NewServer(httpedge.Config{TrustedProxies: cfg.TrustedProxies, Forwarding: cfg.Forwarding,
		ClientIPHeader: cfg.ClientIPHeader}, core,
		httpedge.Deps{Logger: slog.New(slog.DiscardHandler)}) // its warnings are the edge server's, not a wrapper's

	if err != nil {
		return nil, err
	}
	return s.Wrap, nil
}
