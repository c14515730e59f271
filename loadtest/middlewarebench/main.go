// Command middlewarebench serves a 200 "ok" handler for scripts/bench-edge.sh,
// either bare or behind poplimit's middleware over an edge built with
// edge.Build, so that the middleware's cost is measured against its own
// bare server (same binary, same server settings):
//
//	-kind nethttp-bare   net/http, the handler alone
//	-kind nethttp        net/http, e.NetHTTP()(handler) (package middleware)
//	-kind fasthttp-bare  fasthttp (the edge's server settings), the handler alone
//	-kind fasthttp       fasthttp, e.Server.Wrap(handler)
//
// The edge's store and events are set as cmd/edge's: -rules, -memcache or
// -redis, -brokers, -edge-id. It serves until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/edge"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7095", "address to serve on")
	kind := flag.String("kind", "nethttp", "nethttp, nethttp-bare, fasthttp or fasthttp-bare")
	rulesFile := flag.String("rules", "", "rules YAML file (default: the built-in rule)")
	memcache := flag.String("memcache", "", "memcached shards host:port,... (default: in-memory store)")
	redis := flag.String("redis", "", "Redis host:port,... as the store instead")
	brokers := flag.String("brokers", "", "Kafka brokers for decision events (default: none)")
	edgeID := flag.Int("edge-id", 0, "the edge's id in decision events")
	flag.Parse()
	if err := run(*listen, *kind, *rulesFile, *memcache, *redis, *brokers, *edgeID); err != nil {
		fmt.Fprintln(os.Stderr, "middlewarebench:", err)
		os.Exit(1)
	}
}

func run(listen, kind, rulesFile, memcache, redis, brokers string, edgeID int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var e *edge.Edge
	if !strings.HasSuffix(kind, "-bare") {
		o := edge.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		o.RulesFile, o.EdgeID = rulesFile, edgeID
		if memcache != "" {
			var err error
			if o.Memcache.Servers, err = edge.ParseServers(memcache); err != nil {
				return err
			}
		}
		if redis != "" {
			o.Redis.Addrs = strings.Split(redis, ",")
		}
		if brokers != "" {
			o.Brokers = strings.Split(brokers, ",")
		}
		var err error
		if e, err = edge.Build(o); err != nil {
			return err
		}
		defer e.Close(context.Background())
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	var shutdown func(context.Context) error
	switch kind {
	case "nethttp", "nethttp-bare":
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
		if e != nil {
			h = e.NetHTTP()(h)
		}
		srv := &http.Server{Handler: h, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
			IdleTimeout: 60 * time.Second, ErrorLog: nil}
		go func() { errc <- srv.Serve(ln) }()
		shutdown = srv.Shutdown
	case "fasthttp", "fasthttp-bare":
		h := func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }
		if e != nil {
			h = e.Server.Wrap(h)
		}
		// The settings of loadtest/bare and the edge's server.
		srv := &fasthttp.Server{Handler: h, Name: "middlewarebench", ReadTimeout: 10 * time.Second,
			WriteTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, ReadBufferSize: 8192,
			Concurrency: 65536, NoDefaultServerHeader: true}
		go func() { errc <- srv.Serve(ln) }()
		shutdown = srv.ShutdownWithContext
	default:
		ln.Close()
		return fmt.Errorf("-kind %q: nethttp, nethttp-bare, fasthttp or fasthttp-bare", kind)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return shutdown(sctx)
}
