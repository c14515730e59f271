// Command pop starts a whole point of presence on this machine and shows it
// working: memcached shards, the aggregator with its embedded Kafka broker,
// two edges in proxy mode in front of a tiny origin, Prometheus with the
// project's rules and consoles when it is installed, and then a built-in
// replay through both edges that ends with the summary report and the URLs
// to look at. Ctrl-C stops every process it started.
//
//	go run ./deploy/pop                 # run, replay, keep serving until Ctrl-C
//	go run ./deploy/pop -exit           # run, replay, stop (for scripts and CI)
//
// Every port is a flag; none is a default service port.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "pop:", err)
		os.Exit(1)
	}
}
