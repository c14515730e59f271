// Command pop starts a whole point of presence on this machine and shows it
// working: memcached shards, the aggregator with its embedded Kafka broker,
// two edges in proxy mode in front of a tiny origin, Prometheus with the
// project's rules and consoles when it is installed, and then a built-in
// replay through both edges that ends with the summary report and the URLs
// to look at, beside the path of the replay's page (replay.html in the
// working directory: loadtest replay -html's charts of the run). Ctrl-C
// stops every process it started.
//
//	go run ./deploy/pop                 # run, replay, keep serving until Ctrl-C
//	go run ./deploy/pop -exit           # run, replay, stop (for scripts and CI)
//	go run ./deploy/pop -exit -align 10s -phase 2.5s   # the replay at a chosen phase of the 10 s windows
//
// On a fresh Debian machine, run as root, it installs memcached and
// prometheus with apt-get when they are missing (the packages
// scripts/test.sh installs; -install=false does not); otherwise it says
// what to install and what the PoP does without each. The end summary
// gives, per rule, the decisions the aggregator judged, those wrongly
// allowed and wrongly limited, and the worst wrongly allowed key's count
// over its limit, next to Cloudflare's published figures (the 2017
// Cloudflare blog post "How we built rate limiting capable of scaling to
// millions of domains": 0.003 % of 400 million requests wrongly allowed
// or blocked, the wrongly allowed sources under 15 % over their limit).
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
