package httpedge

import (
	"crypto/tls"
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
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
)

// connLimiter caps the connections each client holds open at once
// (Config.MaxConnsPerClient) and the traffic connections open in all
// (Config.MaxConns), counted when the listener accepts them, below TLS
// and HTTP. It is safe for concurrent use.
//
// A client is the TCP peer address as a rule with the default
// ipv6_prefix keys it (KeyAddr): an IPv6 one by its /64, what one
// subscriber is routed, and an address that stands for an IPv4 client
// (IPv4-mapped, a NAT64/SIIT prefix) as that client. Peers in
// TrustedProxies are not capped per client: a proxy's connections carry
// many clients.
//
// The total cap keeps file descriptors for new clients and for the rest
// of the process (the admin listener, the stores): clients that each stay
// within their own cap could otherwise hold every descriptor together.
// Past the high-water mark (pressureShare of MaxConns) the edge is under
// pressure: each connection accepted closes the connection idle longest
// (a kept-alive one waiting for its next request, or a new one that has
// sent nothing yet), and a client's cap tightens to a share of the room
// left (clientCap). At MaxConns, a connection for which no idle one can
// be closed is refused.
//
// fasthttp's Server.MaxConnsPerIP caps per full IPv6 address, which a
// host with a /64 can vary at will, without a metric, and it cannot
// exempt proxies; its Concurrency answers 503 past the cap without making
// room; hence this.
type connLimiter struct {
	max     int // per client; ≤ 0: no cap
	total   int // in all; ≤ 0: no cap
	high    int // the high-water mark: pressure from here
	trusted func(netip.Addr) bool

	mu     sync.Mutex
	counts map[netip.Addr]int // open connections by client key; absent: none

	open  atomic.Int64
	ids   atomic.Uint64 // connections accepted, numbering them for their idle shard
	seq   atomic.Uint64 // idle stamps: the smaller, the longer idle
	idle  [idleShards]idleShard
	stats connStats
	log   *slog.Logger
}

// connStats are the limiter's counters.
type connStats struct {
	refusedClient, refusedPressure, refusedTotal prometheus.Counter
	closedPressure                               prometheus.Counter
	// The accepts retried for want of a file descriptor, of kernel
	// memory.
	pausedFiles, pausedMemory prometheus.Counter
}

// The pressure policy: pressure starts when the connections open reach
// pressureShare of MaxConns; then a client's cap is the room left
// (MaxConns less the connections open) divided by pressureFactor, but at
// least pressureFloor (and at most MaxConnsPerClient).
const (
	pressureShare  = 0.75
	pressureFactor = 8
	pressureFloor  = 8
)

// idleShards is how many lists the idle connections are kept in, each
// under its own lock, so that connections going active and idle on
// several cores do not wait on one lock.
const idleShards = 16

// idleShard is a list of idle connections, the longest idle first.
type idleShard struct {
	mu         sync.Mutex
	head, tail *limitedConn
	_          [40]byte // a cache line each
}

// connClient is the rule whose client keys count connections: an IPv6
// client by its /64.
var connClient = &rules.Rule{IPv6Prefix: 64}

func newConnLimiter(perClient, total int, trusted func(netip.Addr) bool, log *slog.Logger, reg prometheus.Registerer) (*connLimiter, error) {
	if log == nil {
		log = slog.Default()
	}
	paused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "accept_paused_total",
		Help: "Accepts of traffic connections that failed for want of a file descriptor (reason files: EMFILE, ENFILE) " +
			"or of kernel memory (memory: ENOBUFS, ENOMEM) and were retried after a pause (5 ms doubling to 1 s); " +
			"meanwhile new connections wait in the kernel's backlog."}, []string{"reason"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "conns_refused_total",
		Help: "Traffic connections closed when accepted: their client held MaxConnsPerClient open (reason client) or, " +
			"under pressure, its tightened cap (client_pressure), both answered 429 on a plain listener; or MaxConns were " +
			"open and none idle could be closed (total), answered 503. Closed without an answer on TLS."}, []string{"reason"})
	closed := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "conns_closed_pressure_total",
		Help: "Idle traffic connections (kept alive, or new and silent) closed, the longest idle first, to make room " +
			"for new ones past the high-water mark of MaxConns."})
	l := &connLimiter{max: perClient, total: total, trusted: trusted, counts: map[netip.Addr]int{}, log: log,
		stats: connStats{refusedClient: refused.WithLabelValues("client"), refusedPressure: refused.WithLabelValues("client_pressure"),
			refusedTotal: refused.WithLabelValues("total"), closedPressure: closed,
			pausedFiles: paused.WithLabelValues("files"), pausedMemory: paused.WithLabelValues("memory")}}
	if total > 0 {
		l.high = max(1, int(float64(total)*pressureShare))
	}
	if reg == nil {
		return l, nil
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "conns_open", Help: "Traffic connections open, each holding a file descriptor."},
		func() float64 { return float64(l.open.Load()) })
	capped := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "conns_max", Help: "The traffic connections open at most (MaxConns; 0: no cap); pressure from three quarters of it."},
		func() float64 { return float64(max(l.total, 0)) })
	for _, c := range []prometheus.Collector{refused, closed, paused, open, capped} {
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

// clientCap is a client's cap with open connections open: MaxConnsPerClient,
// tightened under pressure to the room left over pressureFactor (at
// least pressureFloor).
func (l *connLimiter) clientCap(open int) int {
	if l.total <= 0 || open < l.high {
		return l.max
	}
	c := max((l.total-open)/pressureFactor, pressureFloor)
	if l.max > 0 {
		c = min(c, l.max)
	}
	return c
}

// acquire counts a connection of key, unless key already holds
// MaxConnsPerClient or capN (≤ 0: no cap); it returns nil when counted,
// or the counter of the refusal.
func (l *connLimiter) acquire(key netip.Addr, capN int) prometheus.Counter {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.counts[key]
	if l.max > 0 && n >= l.max {
		return l.stats.refusedClient
	}
	if capN > 0 && n >= capN {
		return l.stats.refusedPressure
	}
	l.counts[key] = n + 1
	return nil
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
// listener (answer), a refused connection is answered 429 or 503 before
// it is closed; under TLS it is closed without a word, as no handshake
// was made.
func (l *connLimiter) wrap(ln net.Listener, answer bool) net.Listener {
	return &limitedListener{Listener: ln, l: l, answer: answer,
		refusalClient: refusal(429, "1", "this client holds "+strconv.Itoa(l.max)+
			" connections to the edge already, the most it may; reuse them"),
		refusalPressure: refusal(429, "1", "the edge is short of connections and this client "+
			"holds as many as it may now; reuse them"),
		refusalTotal: refusal(503, "1", "the edge holds as many connections as it can; retry later")}
}

// refusal is the plain-HTTP answer to a refused connection, rendered once
// per listener: the core's problem body (decision.AppendProblem) under a
// status line of its own.
func refusal(status int, retryAfter, detail string) []byte {
	body := decision.AppendProblem(nil, status, detail)
	return append([]byte("HTTP/1.1 "+strconv.Itoa(status)+" "+decision.StatusTitle(status)+"\r\nContent-Type: "+decision.ContentTypeProblem+
		"\r\nRetry-After: "+retryAfter+"\r\nConnection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"), body...)
}

type limitedListener struct {
	net.Listener
	l      *connLimiter
	answer bool
	// The answers to refused connections, by reason.
	refusalClient, refusalPressure, refusalTotal []byte

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
		return l.stats.pausedFiles, true
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return l.stats.pausedMemory, true
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
			"retried after pauses (see the open-file limit logged at start, -max-conns and -max-conns-per-client)",
			"err", err, "pause", ll.pause, "open", ll.l.open.Load())
	}
	time.Sleep(ll.pause)
}

// refusalWriteTimeout bounds the write of a refusal, made on the accept
// loop: a new connection's send buffer takes it at once.
const refusalWriteTimeout = 50 * time.Millisecond

// Accept returns the next connection within the caps, closing the ones
// beyond them; under pressure it closes the connection idle longest for
// each one it returns. An accept that fails for want of a file
// descriptor or of kernel memory is retried after a pause, counted,
// rather than ending Serve.
func (ll *limitedListener) Accept() (net.Conn, error) {
	l := ll.l
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			if paused, ok := l.pauseFor(err); ok {
				paused.Inc()
				ll.wait(err, time.Now())
				continue
			}
			return nil, err
		}
		ll.pause = 0
		key, counted := l.clientKey(c.RemoteAddr())
		open := int(l.open.Load())
		if counted {
			if refused := l.acquire(key, l.clientCap(open)); refused != nil {
				answer := ll.refusalClient
				if refused == l.stats.refusedPressure {
					answer = ll.refusalPressure
				}
				ll.refuse(c, refused, answer)
				continue
			}
		}
		if l.total > 0 && open >= l.high {
			// Under pressure: room for this one, and one more every time, so
			// that idle connections drain below the high-water mark.
			if l.closeIdlest() {
				open--
			}
			if open >= l.total && l.closeIdlest() {
				open--
			}
			if open >= l.total {
				if counted {
					l.release(key)
				}
				ll.refuse(c, l.stats.refusedTotal, ll.refusalTotal)
				continue
			}
		}
		l.open.Add(1)
		lc := &limitedConn{Conn: c, l: l, key: key, counted: counted}
		lc.shard = &l.idle[l.ids.Add(1)%idleShards]
		lc.setIdle(true) // idle until its first request
		return lc, nil
	}
}

// refuse counts and closes c, answering it on a plain listener.
func (ll *limitedListener) refuse(c net.Conn, counter prometheus.Counter, answer []byte) {
	counter.Inc()
	if ll.answer {
		c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
		c.Write(answer)
	}
	c.Close()
}

// closeIdlest closes the connection idle longest, reporting whether
// there was one.
func (l *connLimiter) closeIdlest() bool {
	var oldest *idleShard
	var stamp uint64
	for i := range l.idle {
		sh := &l.idle[i]
		sh.mu.Lock()
		if sh.head != nil && (oldest == nil || sh.head.stamp < stamp) {
			oldest, stamp = sh, sh.head.stamp
		}
		sh.mu.Unlock()
	}
	if oldest == nil {
		return false
	}
	oldest.mu.Lock()
	c := oldest.head // the stamp's connection, or one idle since (a younger one)
	if c != nil {
		oldest.unlink(c)
	}
	oldest.mu.Unlock()
	if c == nil {
		return false
	}
	l.stats.closedPressure.Inc()
	c.Close()
	return true
}

// connState is fasthttp's ConnState hook: a connection waiting for its
// next request is idle, one reading or serving a request is not.
func (l *connLimiter) connState(c net.Conn, state fasthttp.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch state {
	case fasthttp.StateIdle:
		lc.setIdle(true)
	case fasthttp.StateActive, fasthttp.StateHijacked, fasthttp.StateClosed:
		lc.setIdle(false)
	}
}

// limitedConn gives its client's place back when closed, and is listed
// in its shard while idle.
type limitedConn struct {
	net.Conn
	l       *connLimiter
	key     netip.Addr
	counted bool
	closed  atomic.Bool

	// Under shard.mu.
	shard      *idleShard
	prev, next *limitedConn
	listed     bool
	stamp      uint64 // when it went idle: the smaller, the longer idle
}

// setIdle lists c as idle since now, or takes it off the list.
func (c *limitedConn) setIdle(idle bool) {
	sh := c.shard
	sh.mu.Lock()
	if c.listed {
		sh.unlink(c)
	}
	if idle && !c.closed.Load() {
		c.stamp = c.l.seq.Add(1)
		c.listed = true
		c.prev = sh.tail
		if sh.tail != nil {
			sh.tail.next = c
		} else {
			sh.head = c
		}
		sh.tail = c
	}
	sh.mu.Unlock()
}

// unlink takes c off sh's list; sh.mu is held and c is listed.
func (sh *idleShard) unlink(c *limitedConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		sh.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		sh.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
}

func (c *limitedConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	if c.shard != nil {
		c.setIdle(false)
	}
	err := c.Conn.Close()
	c.l.open.Add(-1)
	if c.counted {
		c.l.release(c.key)
	}
	return err
}
