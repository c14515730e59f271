// Package poplimit is the entry point of a Go program that embeds the
// poplimit rate limiter: New builds a decision core from a rules file over
// a store, and package middleware (net/http) or middleware/fasthttpmw
// (fasthttp) puts it in front of the program's handlers.
//
//	core, err := poplimit.New(rulesYAML, store.NewMemStore(nil), decision.Options{})
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer core.Close(context.Background())
//	mw, err := middleware.New(core, middleware.Config{})
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.ListenAndServe(":8080", mw(mux))
//
// The rules file is the edge's (docs/CONFIGURATION.md). The store decides
// who shares the limits: store.NewMemStore counts in this process alone,
// memcachestore and redisstore share them with every process counting in
// the same memcached or Redis (import them only if used: they bring their
// clients). docs/EMBEDDING.md walks through each.
//
// This package imports no transport, store client or front end; the edge
// server (cmd/edge, package edge) runs the same core.
package poplimit

import (
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
)

// New returns a decision core deciding by the rules file rulesYAML over
// store, its limiter started: decision.New of the parsed rules. An invalid
// file is reported with every bad field named (rules.ParseRules). Close
// the core when done, after the server that calls it (decision.Core.Close).
func New(rulesYAML []byte, store store.Store, o decision.Options) (*decision.Core, error) {
	rs, err := rules.ParseRules(rulesYAML)
	if err != nil {
		return nil, err
	}
	return decision.New(rs, store, o)
}
