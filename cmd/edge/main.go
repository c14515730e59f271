// Command edge is one poplimit edge server: it decides every request against
// the rate-limit rules, from a local view of counters shared through a
// sharded memcached pool, and streams its decisions to Kafka.
//
// With no flags it starts a working edge on 127.0.0.1:7070 (decision mode,
// in-memory store, the built-in rule of 100 requests per minute per client
// IP) with metrics on 127.0.0.1:7071, and logs every default it took. The
// flags set the fields of edge.Options, whose defaults they show.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/poplimit/poplimit/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run builds the edge from args and serves until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, logLevel, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("edge: -log-level %q: %w", logLevel, err)
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.EdgeIDDerived {
		host, _ := os.Hostname()
		o.Logger.Info("edge: -edge-id not set: the id is derived from the host name, -listen and -pop", "edge_id", o.EdgeID,
			"host", host, "listen", o.Listen, "pop", o.Pop)
	}
	edge.RaiseFileLimit(o, o.Logger) // logged, with a warning when below what -concurrency needs
	e, err := edge.Build(o)
	if err != nil {
		return err
	}
	if o.XDS.Server != "" && !o.XDS.ForceStart {
		o.Logger.Info("edge: waiting for the first rate limit configuration from the xDS management server (-rls-xds-force-start serves before it)", "server", o.XDS.Server)
	}
	if err := e.WaitConfig(ctx); err != nil {
		e.Close(context.Background())
		if ctx.Err() != nil {
			return nil // stopped while waiting: a clean exit
		}
		return err
	}
	if err := e.Listen(); err != nil {
		e.Close(context.Background())
		return err
	}
	e.LogStart()
	return e.Serve(ctx)
}
