package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a loopback TCP relay in front of a server that a test controls:
// it forwards, or hangs: every connection, open or new, stays open and
// carries nothing more in either direction, so only timeouts can tell. It
// models a hung shard and a network partition. Safe for concurrent use.
type Relay struct {
	Addr   string // where clients connect
	target string
	hung   atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	ln     net.Listener
	wg     sync.WaitGroup
	closed bool
}

// NewRelay starts a relay to target on a free loopback port; it is closed
// at cleanup.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
	return r
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.drop(c)
			up, err := net.Dial("tcp", r.target)
			if err != nil {
				return
			}
			if !r.track(up) {
				return
			}
			defer r.drop(up)
			done := make(chan struct{}, 2)
			go func() { r.pipe(up, c); done <- struct{}{} }()
			go func() { r.pipe(c, up); done <- struct{}{} }()
			<-done
		}()
	}
}

// pipe copies src to dst, dropping what arrives while the relay hangs.
func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.hung.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *Relay) drop(c net.Conn) {
	c.Close()
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// Hang makes the relay carry nothing: requests vanish, connections stay
// open.
func (r *Relay) Hang() { r.hung.Store(true) }

// Forward makes the relay carry traffic again. Connections that lost bytes
// while it hung are closed, as their protocol state is broken.
func (r *Relay) Forward() {
	r.hung.Store(false)
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
}

// Close stops the relay and every connection through it.
func (r *Relay) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
