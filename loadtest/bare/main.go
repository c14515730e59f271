// Command bare is the baseline of the edge benchmarks: a fasthttp server
// with the edge's server settings that answers 200 to everything, so the
// ratio edge ÷ bare is the cost of rate limiting alone.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7090", "address to serve on")
	pprofAddr := flag.String("pprof", "", "address to serve /debug/pprof/ on, to profile the baseline like the edge (default: none)")
	flag.Parse()
	if *pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go func() {
			if err := http.ListenAndServe(*pprofAddr, mux); err != nil {
				fmt.Fprintln(os.Stderr, "bare: pprof:", err)
				os.Exit(1)
			}
		}()
	}
	srv := &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusOK) },
		Name:                  "bare",
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           60 * time.Second,
		ReadBufferSize:        8192,
		Concurrency:           65536,
		NoDefaultServerHeader: true,
	}
	if err := srv.ListenAndServe(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	}
}
