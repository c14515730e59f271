package shardproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/bradfitz/gomemcache/memcache"
)

// Sentinel errors, checked with errors.Is. An op's error wraps one of them,
// or the underlying error, behind "shardproxy: <op> <addr>: ".
var (
	// ErrNoServers: every shard is ejected; ops fail at once, without a
	// network round trip, until the first one's RetryTimeout has passed.
	ErrNoServers = errors.New("no live servers")

	// ErrTimeout: a shard did not answer within Timeout, or the op did not
	// finish within BatchTimeout.
	ErrTimeout = errors.New("timeout")

	// ErrMalformed: a shard answered something that is not memcached's
	// protocol.
	ErrMalformed = errors.New("malformed reply")

	// ErrClosed: Do was called after Close.
	ErrClosed = errors.New("client closed")

	// ErrNotFound: no value is stored under the key (Gets), or none any
	// more (CompareAndSwap: it expired or was evicted since the Gets).
	// An answer, not a failure.
	ErrNotFound = errors.New("not found")

	// ErrCASConflict: CompareAndSwap lost a race: the value changed since
	// the Gets that returned its token. An answer, not a failure.
	ErrCASConflict = errors.New("compare-and-swap conflict")

	// ErrExists: Add found a value already stored under the key. An
	// answer, not a failure.
	ErrExists = errors.New("value exists")
)

// answered reports whether err is the shard's own answer (a miss, a lost
// add race, a CLIENT_ERROR, a value that is not a number) rather than a
// failure to get one. Only failures count toward ejection.
func answered(err error) bool {
	switch {
	case errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored):
		return true
	case strings.HasPrefix(err.Error(), "memcache: client error: "):
		// gomemcache has no sentinel for CLIENT_ERROR replies.
		return true
	}
	return false
}

// isTimeout reports whether err is a dial, read or write timeout.
func isTimeout(err error) bool {
	var ne net.Error
	var cte *memcache.ConnectTimeoutError
	return errors.As(err, &cte) || (errors.As(err, &ne) && ne.Timeout())
}

// wrapErr wraps an error of a call to addr once, marking timeouts with
// ErrTimeout and replies gomemcache could not parse with ErrMalformed. An
// error already marked (lateErr's, the pipelines') is only prefixed.
func wrapErr(kind opKind, addr string, err error) error {
	switch {
	case errors.Is(err, ErrTimeout), errors.Is(err, ErrMalformed), errors.Is(err, context.Canceled):
	case isTimeout(err):
		return fmt.Errorf("shardproxy: %s %s: %w: %w", kind, addr, ErrTimeout, err)
	case malformed(err):
		return fmt.Errorf("shardproxy: %s %s: %w: %w", kind, addr, ErrMalformed, err)
	}
	return fmt.Errorf("shardproxy: %s %s: %w", kind, addr, err)
}

// kindErrs is one error of a call to addr, wrapped by wrapErr once for
// each kind of op that it fails.
type kindErrs struct {
	addr    string
	err     error
	wrapped [numKinds]error
}

func (e *kindErrs) of(kind opKind) error {
	if e.wrapped[kind] == nil {
		e.wrapped[kind] = wrapErr(kind, e.addr, e.err)
	}
	return e.wrapped[kind]
}

// malformed reports whether err is gomemcache's complaint about a reply.
func malformed(err error) bool {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return true // incr/decr reply that is not a number
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "memcache: unexpected") || strings.HasPrefix(msg, "memcache: corrupt")
}

// errBatchTimeout is the cause of a batch context that BatchTimeout ended.
var errBatchTimeout = errors.New("batch timeout")

// lateErr is why ops of b had no outcome when b.ctx ended, as its cause
// says, whichever goroutine asks: ErrTimeout when BatchTimeout ended it;
// ErrTimeout too, wrapping context.DeadlineExceeded, when the caller's
// deadline did (an op that ran out of time is a timeout, whose deadline it
// was: the edge gives its calls a deadline equal to Timeout, so that the
// shard's own timeout and the caller's race); the caller's
// context.Canceled, with its cause, when the caller cancelled.
func (c *Client) lateErr(b *batch) error {
	cause := context.Cause(b.ctx)
	err := b.parent.Err()
	switch {
	case cause == errBatchTimeout || err == nil:
		return fmt.Errorf("%w: no reply within %v", ErrTimeout, c.cfg.BatchTimeout)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: the caller's deadline passed: %w", ErrTimeout, err)
	case cause != nil && cause != err:
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// opKind is the kind of an op, the bounded "op" label.
type opKind uint8

const (
	kindIncr opKind = iota
	kindDecr
	kindGet
	kindGets // the value ops, from here on
	kindAdd
	kindCAS
	numKinds
)

var kindNames = [numKinds]string{"incr", "decr", "get", "gets", "add", "cas"}

func (k opKind) String() string { return kindNames[k] }

// result is the outcome of one op as its caller saw it, the bounded
// "result" label.
type result uint8

const (
	resultOK       result = iota
	resultMiss            // the counter did not exist: created (incr) or read as 0; ErrNotFound
	resultConflict        // ErrCASConflict, ErrExists: another client wrote first
	resultError           // any other failure, ErrNoServers and ErrClosed included
	resultTimeout         // ErrTimeout: the shard's Timeout, BatchTimeout or the caller's deadline
	resultCanceled        // the caller cancelled its context (context.Canceled)
	numResults
)

var resultNames = [numResults]string{"ok", "miss", "conflict", "error", "timeout", "canceled"}

// classify returns the result label for an op's outcome.
func classify(err error, miss bool) result {
	switch {
	case err == nil && miss:
		return resultMiss
	case err == nil:
		return resultOK
	case errors.Is(err, ErrNotFound):
		return resultMiss
	case errors.Is(err, ErrCASConflict), errors.Is(err, ErrExists):
		return resultConflict
	case errors.Is(err, ErrTimeout):
		return resultTimeout
	case errors.Is(err, context.Canceled):
		return resultCanceled
	}
	return resultError
}
