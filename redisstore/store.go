package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
)

// Sentinel errors, checked with errors.Is. An op's error wraps one of them
// (and, where there is one, the underlying error) behind
// "redisstore: <op> <addr>: ".
var (
	// ErrTimeout: no answer within Config.Timeout (or the caller's
	// deadline, whichever came first).
	ErrTimeout = errors.New("timeout")

	// ErrUnavailable: the Store is not connected (yet, or its servers are
	// unreachable), or the connection failed: refused, reset, closed.
	ErrUnavailable = errors.New("unavailable")

	// ErrReply: the server answered the op with an error, such as WRONGTYPE
	// for a key of another type, or "not an integer" for a counter that is
	// not one.
	ErrReply = errors.New("error reply")

	// ErrBadValue: a stored value, or a reply, that does not decode: a
	// counter that is not a decimal integer ≥ 0, a bucket or a log whose
	// fields are not what the scripts write.
	ErrBadValue = errors.New("bad value")

	// ErrInvalid: the arguments of a GCRA or SlidingLog call are out of
	// range; nothing was sent.
	ErrInvalid = errors.New("invalid argument")

	// ErrClosed: the call came after Close.
	ErrClosed = errors.New("store closed")
)

// errPending marks, during a scripted batch (scriptBatch: GCRABatch,
// SlidingLogBatch, DoState), the ops whose command was sent; it never
// leaves the call.
var errPending = errors.New("pending")

var _ store.Store = (*Store)(nil)

// Store is a store.Store over Redis or Redis Cluster, with the scripted
// leaky bucket (GCRA) and sliding log beside it. It is safe for concurrent
// use; see the package documentation for the keys, the scripts, timeouts
// and failures.
type Store struct {
	cfg  Config // defaults applied
	m    *metrics
	addr string // for errors: the address, or the first of several and their number

	cl      atomic.Pointer[rueidis.Client] // nil until connected, and after Close
	connErr atomic.Pointer[error]          // why the last connection attempt failed; nil once connected
	fails   atomic.Int32                   // consecutive unanswered calls; 0 after an answer
	lastKO  atomic.Int64                   // Unix ns of the last call with an op unanswered; 0: none

	// closeMu guards closed and the hand-over of a client the connector
	// made; calls hold it for reading while they add their goroutine to
	// wg, so Close's wg.Wait never races an Add. stop ends the connector.
	// wg counts the connector and the calls' goroutines (batch.go).
	closeMu sync.RWMutex
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup

	batches sync.Pool // *batch
}

// New returns a Store for cfg, its metrics registered with reg unless reg is
// nil (one Registerer holds the metrics of one Store). It makes one attempt
// to connect, bounded by DialTimeout per address; if that fails, New still
// returns the Store, whose ops fail with ErrUnavailable while a goroutine
// tries again every ReconnectInterval until it connects or Close is called.
// The error is for an invalid cfg or a metrics registration only.
func New(cfg Config, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
	}
	if cfg.SentinelTLS != nil {
		cfg.SentinelTLS = cfg.SentinelTLS.Clone()
	} else if cfg.Mode == TopologySentinel {
		cfg.SentinelTLS = cfg.TLS
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, m: m, addr: cfg.Addrs[0], stop: make(chan struct{})}
	if n := len(cfg.Addrs); n > 1 {
		s.addr = fmt.Sprintf("%s(+%d)", cfg.Addrs[0], n-1)
	}
	if s.connect() != nil {
		s.wg.Add(1)
		go s.reconnect()
	}
	return s, nil
}

// options returns the rueidis options for cfg.
func (s *Store) options() rueidis.ClientOption {
	c := s.cfg
	o := rueidis.ClientOption{
		InitAddress:         c.Addrs,
		Username:            c.Username,
		Password:            c.Password,
		TLSConfig:           c.TLS,
		SelectDB:            c.DB,
		ClientName:          "poplimit",
		DisableCache:        true, // no client-side caching: counters change under every edge
		DisableRetry:        true, // one attempt per call; the caller's next flush is the retry
		ForceSingleClient:   c.Mode == TopologyStandalone,
		PipelineMultiplex:   bits.TrailingZeros(uint(c.ConnsPerNode)),
		ReadBufferEachConn:  c.BufferBytes,
		WriteBufferEachConn: c.BufferBytes,
		ConnWriteTimeout:    c.ConnTimeout,
		ClientSetInfo:       rueidis.DisableClientSetInfo,
	}
	o.Dialer.Timeout = c.DialTimeout
	if c.Mode == TopologySentinel {
		o.Sentinel = rueidis.SentinelOption{
			MasterSet:               c.SentinelMaster,
			Username:                c.SentinelUsername,
			Password:                c.SentinelPassword,
			TLSConfig:               c.SentinelTLS,
			ClientName:              "poplimit",
			TopologyRefreshInterval: c.SentinelRefresh,
		}
		o.Sentinel.Dialer.Timeout = c.DialTimeout
	}
	return o
}

// connect makes one attempt to connect and load the scripts, and on success
// hands the client over for use.
func (s *Store) connect() error {
	c, err := rueidis.NewClient(s.options())
	if err == nil && s.cfg.Mode == TopologyCluster && c.Mode() != rueidis.ClientModeCluster {
		c.Close()
		err = fmt.Errorf("mode %q: the server is not a cluster node", TopologyCluster)
	}
	if err == nil && s.cfg.Mode == TopologySentinel && c.Mode() != rueidis.ClientModeSentinel {
		c.Close()
		err = fmt.Errorf("mode %q: not a sentinel client", TopologySentinel)
	}
	if err != nil {
		s.m.connectKO.Inc()
		err = fmt.Errorf("connect: %w", err) // wrapped by each op's error, which names the address
		s.connErr.Store(&err)
		return err
	}
	s.loadScripts(c)
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		c.Close()
		return ErrClosed
	}
	s.cl.Store(&c)
	s.connErr.Store(nil)
	s.fails.Store(0)
	s.m.connectOK.Inc()
	s.m.healthy.Set(1)
	return nil
}

// reconnect tries to connect every ReconnectInterval until it succeeds or
// the Store is closed. It is the Store's only goroutine; Close waits for it.
func (s *Store) reconnect() {
	defer s.wg.Done()
	t := time.NewTimer(s.cfg.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if err := s.connect(); err == nil || errors.Is(err, ErrClosed) {
			return
		}
		t.Reset(s.cfg.ReconnectInterval)
	}
}

// loadScripts sends SCRIPT LOAD of every script to every node, bounded by
// DialTimeout. Failures are ignored: a node without a script answers
// NOSCRIPT and gets EVAL instead.
func (s *Store) loadScripts(c rueidis.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancel()
	for _, n := range c.Nodes() {
		cmds := make(rueidis.Commands, 0, numScripts)
		for i := range scripts {
			cmds = append(cmds, n.B().ScriptLoad().Script(scripts[i].src).Build())
		}
		n.DoMulti(ctx, cmds...)
	}
}

// client returns the connected client, or the error ops fail with.
func (s *Store) client(kind opKind) (rueidis.Client, error) {
	if c := s.cl.Load(); c != nil {
		return *c, nil
	}
	if s.isClosed() {
		return nil, fmt.Errorf("redisstore: %s %s: %w", kind, s.addr, ErrClosed)
	}
	if e := s.connErr.Load(); e != nil {
		return nil, fmt.Errorf("redisstore: %s %s: %w: %w", kind, s.addr, ErrUnavailable, *e)
	}
	return nil, fmt.Errorf("redisstore: %s %s: %w: not connected", kind, s.addr, ErrUnavailable)
}

// Parts is 1 (store.Placer): the counters of a standalone server, or of
// the master a Sentinel names, are on one server, and a call to it
// succeeds or fails whole.
func (s *Store) Parts() int { return 1 }

// Place is 0 (store.Placer) while connected to one server; -1 in cluster
// mode or before the first connection, so that the limiter gives each sync
// decision a call of its own rather than share one across cluster nodes,
// which fail apart.
func (s *Store) Place(uint64) int {
	if c := s.cl.Load(); c != nil && (*c).Mode() != rueidis.ClientModeCluster {
		return 0
	}
	return -1
}

// Healthy reports whether the Store is connected and fewer than
// FailureLimit consecutive calls went unanswered (every op of the call
// failing for want of an answer: a timeout, a broken or refused
// connection). It is false before the first connection and after Close.
func (s *Store) Healthy() bool {
	return s.cl.Load() != nil && s.fails.Load() < int32(s.cfg.FailureLimit)
}

// Whole is true (store.Store): a key's counters never move to another
// server; while the server is out its keys fail, and the rules' failure
// policies answer.
func (s *Store) Whole() bool { return true }

// Close closes every connection and stops the connector. Calls in flight
// fail with ErrClosed (or ErrUnavailable); later calls fail with ErrClosed.
// It waits for the goroutines of the calls it interrupted and for a
// connection attempt in progress (at most DialTimeout per address). Close
// is idempotent.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.closeMu.Unlock()
	if c := s.cl.Swap(nil); c != nil {
		(*c).Close()
	}
	s.wg.Wait()
	s.m.healthy.Set(0)
	return nil
}

// steady reports whether at now no call has gone unanswered for
// ConnTimeout + DialTimeout: the connections are up, or were broken without
// a call noticing (exec runs one-command calls on the caller's goroutine
// only then).
func (s *Store) steady(now time.Time) bool {
	last := s.lastKO.Load()
	return s.fails.Load() == 0 && (last == 0 || now.UnixNano()-last > int64(s.cfg.ConnTimeout+s.cfg.DialTimeout))
}

// settled records the health outcome of one call: answered is whether any
// op got an answer (a value or an error reply), failed whether any went
// unanswered other than by the caller's cancellation.
func (s *Store) settled(answered, failed bool) {
	if failed {
		s.lastKO.Store(time.Now().UnixNano())
	}
	switch {
	case answered:
		if s.fails.Load() != 0 {
			s.fails.Store(0)
			s.m.healthy.Set(1)
		}
	case failed:
		if s.fails.Add(1) == int32(s.cfg.FailureLimit) {
			s.m.healthy.Set(0)
		}
	}
}

// opError classifies the error of a finished command: nil, an error reply
// (ErrBadValue for the scripts' own "bad state"), or no answer. answered
// reports whether the server answered at all. Errors that are not answers
// go through memo: the ops of one call that fail alike share an error.
func (s *Store) opError(parent context.Context, kind opKind, err error, memo *errMemo) (e error, res result, answered bool) {
	if err == nil {
		return nil, resultOK, true
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		msg := re.Error()
		if strings.HasPrefix(msg, "POPLIMIT bad state") || strings.HasPrefix(msg, "POPLIMIT bad arguments") {
			return fmt.Errorf("redisstore: %s %s: %w: %s", kind, s.addr, ErrBadValue, msg), resultBadValue, true
		}
		return fmt.Errorf("redisstore: %s %s: %w: %w", kind, s.addr, ErrReply, err), resultReply, true
	}
	var why error // what the error says beyond its sentinel
	switch {
	case cancelled(parent):
		res = resultUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		res, why = resultTimeout, ErrTimeout
	case errors.Is(err, rueidis.ErrClosing) && s.isClosed():
		res, why = resultUnavailable, ErrClosed
	default:
		res, why = resultUnavailable, ErrUnavailable
	}
	if e := memo.get(kind, res, why); e != nil {
		return e, res, false
	}
	switch why {
	case nil:
		e = fmt.Errorf("redisstore: %s %s: %w", kind, s.addr, parent.Err())
	case ErrClosed:
		e = fmt.Errorf("redisstore: %s %s: %w", kind, s.addr, ErrClosed)
	default:
		e = fmt.Errorf("redisstore: %s %s: %w: %w", kind, s.addr, why, err)
	}
	memo.put(kind, res, why, e)
	return e, res, false
}

// abandonedErr is the error of every op of a call whose deadline (or the
// caller's cancellation) came before rueidis returned.
func (s *Store) abandonedErr(parent context.Context, kind opKind, memo *errMemo) (error, result) {
	cause := context.DeadlineExceeded
	if cancelled(parent) {
		cause = parent.Err()
	}
	e, res, _ := s.opError(parent, kind, cause, memo)
	return e, res
}

// closedErr is the error of every op of a call that came after Close.
func (s *Store) closedErr(kind opKind, memo *errMemo) (error, result) {
	e, res, _ := s.opError(context.Background(), kind, rueidis.ErrClosing, memo)
	return e, res
}

func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// errMemo remembers, per kind of op, the error the last op of a call got
// that failed for want of an answer, so that the ops of a call that fail
// alike (a dead or hung node: thousands in a flush) share one error value,
// the first one's, instead of allocating one each.
type errMemo [numKinds]struct {
	res result
	why error
	err error
}

func (m *errMemo) get(kind opKind, res result, why error) error {
	if e := &m[kind]; e.err != nil && e.res == res && e.why == why {
		return e.err
	}
	return nil
}

func (m *errMemo) put(kind opKind, res result, why, err error) {
	m[kind].res, m[kind].why, m[kind].err = res, why, err
}

// badValue is the error of an answer that does not decode.
func (s *Store) badValue(kind opKind, err error) error {
	return fmt.Errorf("redisstore: %s %s: %w: %w", kind, s.addr, ErrBadValue, err)
}

// cancelled reports whether an unanswered op failed by the caller's
// cancellation rather than the server's silence.
func cancelled(parent context.Context) bool {
	err := parent.Err()
	return err != nil && !errors.Is(err, context.DeadlineExceeded)
}
