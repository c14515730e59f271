// Package edgetest builds edges for tests exactly as cmd/edge does: through
// edge.Build, from edge.Options, so a new setting is added once.
package edgetest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
)

// Discard is a logger that writes nothing.
var Discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// New builds an edge deciding by the rules file rulesYAML (empty: the
// built-in rule), without listening; it is closed at the test's cleanup.
// Unset options take the test defaults: no Retry-After jitter, a silent
// logger.
func New(tb testing.TB, rulesYAML string, o edge.Options) *edge.Edge {
	tb.Helper()
	if rulesYAML != "" {
		f := filepath.Join(tb.TempDir(), "rules.yaml")
		if err := os.WriteFile(f, []byte(rulesYAML), 0o644); err != nil {
			tb.Fatal(err)
		}
		o.RulesFile = f
	}
	if o.RetryJitter == 0 {
		o.RetryJitter = -1 // none
	}
	if o.Logger == nil {
		o.Logger = Discard
	}
	e, err := edge.Build(o)
	if err != nil {
		tb.Fatalf("edge.Build: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Close(ctx)
	})
	return e
}

// Start builds an edge as New does and serves it on free loopback ports
// until the test's cleanup, which stops it and waits.
func Start(tb testing.TB, rulesYAML string, o edge.Options) *edge.Edge {
	tb.Helper()
	o.Listen, o.Admin = "127.0.0.1:0", "127.0.0.1:0"
	e := New(tb, rulesYAML, o)
	if err := e.Listen(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			tb.Error("edgetest: the edge did not stop within 10 s")
		}
	})
	return e
}
