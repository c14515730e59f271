package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a loopback TCP port that is free now, for a server the
// test starts itself, often in another process that binds it later (after
// a build, seconds later). See FreePortPair.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePorts(t, 1)
}

// FreePortPair returns a loopback TCP port p with p+1 free as well (an
// edge serves its admin endpoints on the port after its traffic port).
//
// A port asked of the kernel (a listener on port 0, closed) comes from
// its ephemeral range, from which every outgoing connection of every
// process also takes its local port: on a machine running many tests at
// once, one of them takes it before the server binds it. So the ports are
// drawn at random from below that range (net.ipv4.ip_local_port_range),
// which only a listener that names its port can take; each is checked
// free when drawn, and this process never hands one out twice.
func FreePortPair(t testing.TB) int {
	t.Helper()
	return freePorts(t, 2)
}

// handed holds the ports this process has handed out.
var handed struct {
	sync.Mutex
	ports map[int]bool
}

// lowestPort is the lowest port drawn: below it lie the ports of
// well-known services.
const lowestPort = 10_000

func freePorts(t testing.TB, span int) int {
	t.Helper()
	handed.Lock()
	defer handed.Unlock()
	if handed.ports == nil {
		handed.ports = make(map[int]bool)
	}
	top := ephemeralLow() // exclusive
	if top-lowestPort < 1000 {
		return kernelPorts(t, span)
	}
draw:
	for range 1000 {
		p := lowestPort + rand.IntN(top-lowestPort-span+1)
		for q := p; q < p+span; q++ {
			if handed.ports[q] || !bindable(q) {
				continue draw
			}
		}
		for q := p; q < p+span; q++ {
			handed.ports[q] = true
		}
		return p
	}
	t.Fatalf("no %d free consecutive ports found below %d in 1000 draws", span, top)
	return 0
}

// bindable reports whether a listener can bind 127.0.0.1:port now.
func bindable(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux's default when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// kernelPorts is freePorts when the ephemeral range leaves too little
// below it: ports the kernel offers, with the risk FreePortPair describes.
func kernelPorts(t testing.TB, span int) int {
	t.Helper()
	for range 1000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ok := !handed.ports[p]
		for q := p + 1; ok && q < p+span; q++ {
			ok = !handed.ports[q] && bindable(q)
		}
		ln.Close()
		if ok {
			for q := p; q < p+span; q++ {
				handed.ports[q] = true
			}
			return p
		}
	}
	t.Fatalf("no %d free consecutive ports found in 1000 tries", span)
	return 0
}
