package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// tool is a program the PoP runs when it is installed, with the Debian
// package that provides it (the names scripts/test.sh installs) and what
// the PoP does without it.
type tool struct {
	bin, pkg, without string
}

var tools = []tool{
	{"memcached", "memcached", "each edge counts in its own memory, so limits do NOT hold across the two edges " +
		"(a client spread over both gets up to twice its limit) and the accuracy measured is each edge's alone"},
	{"prometheus", "prometheus", "no Prometheus and no dashboards; the replay and the aggregator's accuracy report run as usual"},
}

// system is what ensureTools needs from the machine, so that tests can
// stand in for it.
type system struct {
	lookPath func(string) (string, error)
	euid     func() int
	run      func(ctx context.Context, stdout, stderr io.Writer, env []string, name string, args ...string) error
}

var realSystem = system{
	lookPath: exec.LookPath,
	euid:     os.Geteuid,
	run: func(ctx context.Context, stdout, stderr io.Writer, env []string, name string, args ...string) error {
		c := exec.CommandContext(ctx, name, args...)
		c.Stdout, c.Stderr, c.Env = stdout, stderr, append(os.Environ(), env...)
		return c.Run()
	},
}

// ensureTools finds memcached and prometheus. When some are missing and
// install is set, pop runs as root and apt-get is there, it installs their
// Debian packages as scripts/test.sh does; otherwise it says exactly what
// to install and what the PoP does without it. It returns the path of each
// tool found ("" for a missing one).
func ensureTools(ctx context.Context, sys system, install bool, stdout, stderr io.Writer) map[string]string {
	found := map[string]string{}
	var missing []tool
	for _, t := range tools {
		if p, err := sys.lookPath(t.bin); err == nil {
			found[t.bin] = p
		} else {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return found
	}
	var pkgs []string
	for _, t := range missing {
		pkgs = append(pkgs, t.pkg)
	}
	_, aptErr := sys.lookPath("apt-get")
	switch {
	case !install:
		fmt.Fprintf(stderr, "pop: -install=false: not installing %s\n", strings.Join(pkgs, " "))
	case sys.euid() != 0:
		fmt.Fprintf(stderr, "pop: not root: not installing %s (run pop as root to have them installed with apt-get)\n", strings.Join(pkgs, " "))
	case aptErr != nil:
		fmt.Fprintf(stderr, "pop: no apt-get on this machine: not installing %s\n", strings.Join(pkgs, " "))
	default:
		fmt.Fprintf(stdout, "pop: installing %s with apt-get (as scripts/test.sh does)\n", strings.Join(pkgs, " "))
		env := []string{"DEBIAN_FRONTEND=noninteractive"}
		err := sys.run(ctx, stderr, stderr, env, "apt-get", "update", "-qq")
		if err == nil {
			err = sys.run(ctx, stderr, stderr, env, "apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
		}
		if err != nil {
			fmt.Fprintf(stderr, "pop: WARNING: apt-get install %s failed: %v\n", strings.Join(pkgs, " "), err)
		}
		// The packages may start system services on their default ports
		// (memcached 11211, prometheus 9090); the PoP uses its own ports.
		var still []tool
		for _, t := range missing {
			if p, err := sys.lookPath(t.bin); err == nil {
				found[t.bin] = p
				fmt.Fprintf(stdout, "pop: installed %s (%s)\n", t.bin, p)
			} else {
				still = append(still, t)
			}
		}
		missing = still
	}
	for _, t := range missing {
		fmt.Fprintf(stderr, "pop: WARNING: %s is not installed; install it with: sudo apt-get install %s\n", t.bin, t.pkg)
		fmt.Fprintf(stderr, "pop: WARNING: without %s: %s\n", t.bin, t.without)
	}
	return found
}
