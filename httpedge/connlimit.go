package httpedge

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
)

// connLimiter caps the connections each client holds open at once
// (Config.MaxConnsPerClient), counted when the listener accepts them,
// below TLS and HTTP: the client is the TCP peer address as a rule with
// the default ipv6_prefix keys it (KeyAddr): an IPv6 one by its /64, what
// one subscriber is routed, and an address that stands for an IPv4
// client (IPv4-mapped, a NAT64/SIIT prefix) as that client. Peers in
// TrustedProxies are not capped: a proxy's connections carry many
// clients. It is safe for concurrent use.
//
// fasthttp's Server.MaxConnsPerIP does the same per full IPv6 address,
// which a host with a /64 can vary at will, without a metric, and it
// cannot exempt proxies; hence this.
type connLimiter struct {
	max     int // ≤ 0: no cap
	trusted func(netip.Addr) bool

	mu     sync.Mutex
	counts map[netip.Addr]int // open connections by client key; absent: none

	open    atomic.Int64
	refused prometheus.Counter
	// The accepts retried for want of a file descriptor, of kernel
	// memory.
	pausedFiles, pausedMemory prometheus.Counter
	log                       *slog.Logger
}

// connClient is the rule whose client keys count connections: an IPv6
// client by its /64.
var connClient = &rules.Rule{IPv6Prefix: 64}

func newConnLimiter(max int, trusted func(netip.Addr) bool, log *slog.Logger, reg prometheus.Registerer) (*connLimiter, error) {
	if log == nil {
		log = slog.Default()
	}
	paused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "accept_paused_total",
		Help: "Accepts of traffic connections that failed for want of a file descriptor (reason files: EMFILE, ENFILE) " +
			"or of kernel memory (memory: ENOBUFS, ENOMEM) and were retried after a pause (5 ms doubling to 1 s); " +
			"meanwhile new connections wait in the kernel's backlog."}, []string{"reason"})
	l := &connLimiter{max: max, trusted: trusted, counts: map[netip.Addr]int{}, log: log,
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "client_conns_refused_total",
			Help: "Traffic connections closed when accepted because their client already held MaxConnsPerClient open " +
				"(answered 429 on a plain listener, closed on TLS)."}),
		pausedFiles: paused.WithLabelValues("files"), pausedMemory: paused.WithLabelValues("memory")}
	if reg == nil {
		return l, nil
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "conns_open", Help: "Traffic connections open, each holding a file descriptor."},
		func() float64 { return float64(l.open.Load()) })
	for _, c := range []prometheus.Collector{l.refused, paused, open} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// clientKey is the address a peer's connections are counted under, and
// whether the peer is counted at all (it has an IP address and is not a
// trusted proxy).
func (l *connLimiter) clientKey(peer net.Addr) (netip.Addr, bool) {
	ta, ok := peer.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap().WithZone("")
	if l.trusted != nil && l.trusted(a) {
		return netip.Addr{}, false
	}
	return decision.KeyAddr(connClient, a), true
}

// acquire counts a connection of key, unless key already holds max.
func (l *connLimiter) acquire(key netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.counts[key]
	if n >= l.max {
		return false
	}
	l.counts[key] = n + 1
	return true
}

func (l *connLimiter) release(key netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.counts[key] - 1; n > 0 {
		l.counts[key] = n
	} else {
		delete(l.counts, key) // the map holds the clients connected now, no more
	}
}

// wrap returns ln with connections counted and capped. On a plain
// listener (answer), a refused connection is answered 429 before it is
// closed; under TLS it is closed without a word, as no handshake was made.
func (l *connLimiter) wrap(ln net.Listener, answer bool) net.Listener {
	return &limitedListener{Listener: ln, l: l, answer: answer, refusal: l.refusal()}
}

// refusal is the plain-HTTP answer to a refused connection.
func (l *connLimiter) refusal() []byte {
	body := `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"this client holds ` +
		strconv.Itoa(l.max) + ` connections to the edge already, the most it may; reuse them"}`
	return []byte("HTTP/1.1 429 Too Many Requests\r\nContent-Type: " + decision.ContentTypeProblem + "\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

type limitedListener struct {
	net.Listener
	l       *connLimiter
	answer  bool
	refusal []byte

	// The accept loop's own (fasthttp calls Accept from one goroutine).
	pause    time.Duration // the current pause after a failed accept; 0: none failed
	lastWarn time.Time
}

// The pauses after accepts that failed for want of a resource: from
// minAcceptPause, doubling, to maxAcceptPause; a warning at most every
// acceptWarnEvery.
const (
	minAcceptPause  = 5 * time.Millisecond
	maxAcceptPause  = time.Second
	acceptWarnEvery = 10 * time.Second
)

// pauseFor returns the counter of an accept error that a pause may cure:
// no file descriptor left, or no kernel memory. fasthttp ends Serve on
// any accept error but a timeout, which would take the edge down when its
// connections reach the open-file limit.
func (l *connLimiter) pauseFor(err error) (prometheus.Counter, bool) {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return l.pausedFiles, true
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return l.pausedMemory, true
	}
	return nil, false
}

// wait pauses the accept loop after err, longer each time in a row, and
// warns now and then. A listener closed meanwhile is seen at the next
// Accept, at most maxAcceptPause later.
func (ll *limitedListener) wait(err error, now time.Time) {
	ll.pause = min(max(2*ll.pause, minAcceptPause), maxAcceptPause)
	if now.Sub(ll.lastWarn) >= acceptWarnEvery {
		ll.lastWarn = now
		ll.l.log.Warn("edge: cannot accept connections: out of file descriptors or kernel memory; new ones wait in the backlog, "+
			"retried after pauses (see the open-file limit logged at start, -concurrency and -max-conns-per-client)",
			"err", err, "pause", ll.pause, "open", ll.l.open.Load())
	}
	time.Sleep(ll.pause)
}

// refusalWriteTimeout bounds the write of a refusal, made on the accept
// loop: a new connection's send buffer takes it at once.
const refusalWriteTimeout = 50 * time.Millisecond

// Accept returns the next connection whose client is within its cap,
// closing the ones beyond it. An accept that fails for want of a file
// descriptor or of kernel memory is retried after a pause, counted,
// rather than ending Serve.
func (ll *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			if paused, ok := ll.l.pauseFor(err); ok {
				paused.Inc()
				ll.wait(err, time.Now())
				continue
			}
			return nil, err
		}
		ll.pause = 0
		key, counted := ll.l.clientKey(c.RemoteAddr())
		if counted && ll.l.max > 0 && !ll.l.acquire(key) {
			ll.l.refused.Inc()
			if ll.answer {
				c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
				c.Write(ll.refusal)
			}
			c.Close()
			continue
		}
		ll.l.open.Add(1)
		return &limitedConn{Conn: c, l: ll.l, key: key, counted: counted && ll.l.max > 0}, nil
	}
}

// limitedConn gives its client's place back when closed.
type limitedConn struct {
	net.Conn
	l       *connLimiter
	key     netip.Addr
	counted bool
	closed  atomic.Bool
}

func (c *limitedConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	err := c.Conn.Close()
	c.l.open.Add(-1)
	if c.counted {
		c.l.release(c.key)
	}
	return err
}
