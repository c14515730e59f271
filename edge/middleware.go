package edge

import (
	"net/http"

	"github.com/poplimit/poplimit/middleware"
)

// NetHTTP returns net/http middleware deciding every request by e's core,
// finding the client as e's server does (Options.Server's trusted
// proxies, forwarding header and client IP header) and jittering
// Retry-After as it does: the edge's rules, store and decision events in
// front of a Go program's own handlers. fasthttp handlers are wrapped by
// e.Server.Wrap.
func (e *Edge) NetHTTP() func(http.Handler) http.Handler {
	o := &e.Options.Server
	mw, err := middleware.New(e.Core, middleware.Config{TrustedProxies: o.TrustedProxies, Forwarding: o.Forwarding,
		ClientIPHeader: o.ClientIPHeader})
	if err != nil {
		panic("edge: NetHTTP: " + err.Error()) // unreachable: Build validated the same settings
	}
	return mw
}
