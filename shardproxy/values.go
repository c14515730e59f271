package shardproxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
)

// MaxValueLen is the longest value Add and CompareAndSwap store, in bytes:
// a shared token bucket or a sliding log (one of algo.MaxSharedLogLimit
// units encodes to at most about 12 KiB), not a cache entry. A longer
// value stored under a value key by anyone else is read as a malformed
// reply.
const MaxValueLen = 16 << 10

// Limits of one pipeline round of value ops.
//
// A round is written whole before its replies are read. Its write
// completes whatever the server does as long as the request fits in the
// socket buffers (the client's send buffer and the server's receive
// buffer, 16 KiB and 128 KiB by Linux's defaults, before autotuning), so
// it cannot stall on a server that has stopped reading while its replies
// wait to be read; replies of any length are then read. maxValueRoundBytes
// bounds the request: the values that adds and cases store and the
// command lines, so a round is at most 64 KiB plus one value. The
// replies (gets of values up to MaxValueLen each) are read into the
// unit's buffer, not the connection's, so their length does not matter.
const (
	// maxValueRoundOps caps the value ops of one pipeline round.
	maxValueRoundOps = 32
	// maxValueRoundBytes caps the bytes of a round's request: the round
	// closes before an op whose command would take it past this (a
	// round always takes its first op, whatever its length).
	maxValueRoundBytes = 64 << 10
	// valueCommandLen is the most bytes of an add or cas command besides
	// its value: "cas <key> 0 <ttl> <len> <cas>\r\n" and the "\r\n" after
	// the value.
	valueCommandLen = len("cas  0 2592000 16384 18446744073709551615\r\n\r\n") + ValueKeyLen
	// getsCommandLen is the bytes of a gets command.
	getsCommandLen = len("gets \r\n") + ValueKeyLen
)

// ValueKind is what a ValueOp does.
type ValueKind uint8

const (
	// ValueGets reads the value and its CAS token (memcached's gets).
	ValueGets ValueKind = iota
	// ValueAdd stores the value if none is stored (memcached's add).
	ValueAdd
	// ValueCAS stores the value if it has not changed since the gets that
	// returned CAS (memcached's cas).
	ValueCAS
)

// ValueOp is one operation on a small value of a key, the shared state of
// a token bucket (GCRA) or a sliding log that edges update by
// read-modify-write: Gets, then CompareAndSwap, or Add when there is none.
// Its memcached key is AppendValueKey(Key), on the shard of Key's counters.
type ValueOp struct {
	Kind ValueKind
	Key  uint64 // hash of rule and client key, as Op.Key

	// Value is the value to store (ValueAdd, ValueCAS), at most
	// MaxValueLen bytes of any kind. For ValueGets DoValues sets it to the
	// value read, appended to Value[:0] so that a caller reusing its ops
	// reuses their arrays; empty on error.
	Value []byte

	// CAS is the token of the value a ValueCAS replaces, as ValueGets set
	// it. ValueGets sets it: 0 on error.
	CAS uint64

	// TTL is the lifetime of the value stored (ValueAdd, ValueCAS): whole
	// seconds rounded up, at least 1, at most 30 days.
	TTL time.Duration

	// Err is set by DoValues: nil, an answer (ErrNotFound, ErrCASConflict,
	// ErrExists) or a failure, as Op.Err.
	Err error
}

// opKind returns the op kind of k, false if k is none.
func (k ValueKind) opKind() (opKind, bool) {
	switch k {
	case ValueGets:
		return kindGets, true
	case ValueAdd:
		return kindAdd, true
	case ValueCAS:
		return kindCAS, true
	}
	return kindGets, false
}

// DoValues performs every value op and sets its outputs (see ValueOp), as
// Do does for counters: within BatchTimeout and ctx, each round trip
// within Timeout, failures charged to the shard's health, outcomes to
// poplimit_shardproxy_ops_total{op="gets"|"add"|"cas"}. Ops on one key
// take effect in the order given, on one connection; ops on different keys
// run concurrently. Each shard's ops go as pipelines on the shard's
// pipeline connections, up to 32 commands and 64 KiB of request (the
// values stored and the commands) a round trip. It keeps no
// reference to ops after it returns, and is safe for concurrent use.
//
// A value of a shard that is ejected is missing on the shard that takes
// its keys (Gets: ErrNotFound), and the value kept on the shard is found
// again when it comes back; a CAS token is only good on the shard that
// gave it (on another, ErrCASConflict or ErrNotFound).
//
// Hits and successful stores do not allocate, once the ops' Value arrays
// are large enough; a miss, a conflict or a failure allocates its error.
func (c *Client) DoValues(ctx context.Context, ops []ValueOp) {
	if len(ops) == 0 {
		return
	}
	now := time.Now()
	ring := c.liveRing(now)
	if ring == nil {
		for i := range ops {
			k, _ := ops[i].Kind.opKind()
			c.settleValue(&ops[i], k, fmt.Errorf("shardproxy: %s: %w", k, ErrNoServers))
		}
		return
	}
	b := getBatch()
	b.planValues(c, ring, ops)
	b.vout = ops
	c.exec(ctx, b, now)
}

// Gets returns the value of key and its CAS token. It returns ErrNotFound
// when there is none. It is DoValues with one op.
func (c *Client) Gets(ctx context.Context, key uint64) (value []byte, cas uint64, err error) {
	op := [1]ValueOp{{Kind: ValueGets, Key: key}}
	c.DoValues(ctx, op[:])
	return op[0].Value, op[0].CAS, op[0].Err
}

// CompareAndSwap stores value as key's value, with the given TTL, if the
// value stored is still the one whose token Gets returned as cas. It
// returns ErrCASConflict when another client changed it since, and
// ErrNotFound when it is gone (expired or evicted): then Add creates it.
// It is DoValues with one op.
func (c *Client) CompareAndSwap(ctx context.Context, key uint64, value []byte, cas uint64, ttl time.Duration) error {
	op := [1]ValueOp{{Kind: ValueCAS, Key: key, Value: value, CAS: cas, TTL: ttl}}
	c.DoValues(ctx, op[:])
	return op[0].Err
}

// Add stores value as key's value, with the given TTL, if none is stored.
// It returns ErrExists when one is. It is DoValues with one op.
func (c *Client) Add(ctx context.Context, key uint64, value []byte, ttl time.Duration) error {
	op := [1]ValueOp{{Kind: ValueAdd, Key: key, Value: value, TTL: ttl}}
	c.DoValues(ctx, op[:])
	return op[0].Err
}

// planValues places every value op on ring and groups them into units, as
// plan does for counters. It copies the values to store, so that a worker
// outliving the call never reads the caller's arrays. Ops it rejects
// outright (an unknown kind, a value too long, a TTL memcached cannot
// take) are settled here.
func (b *batch) planValues(c *Client, ring *Ring, ops []ValueOp) {
	b.start(len(ops), ring.Len(), true)
	for i := range ops {
		op := &ops[i]
		kind, ok := op.Kind.opKind()
		st := &b.ops[i]
		*st = opState{kind: kind, unit: -1}
		at := len(b.keys)
		b.keys = AppendValueKey(b.keys, op.Key)
		st.keyAt, st.keyEnd = int32(at), int32(len(b.keys))
		sh := ring.Lookup(b.keys[at:])
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("kind %d is not a ValueKind", op.Kind)
		case kind == kindGets:
			op.Value, op.CAS, op.Err = op.Value[:0], 0, nil
		case len(op.Value) > MaxValueLen:
			err = fmt.Errorf("value of %d bytes, longer than MaxValueLen (%d)", len(op.Value), MaxValueLen)
		default:
			op.Err = nil
			st.ttl, err = ttlSeconds(op.TTL)
			st.cas = op.CAS
			st.valAt = int32(len(b.vals))
			b.vals = append(b.vals, op.Value...)
			st.valEnd = int32(len(b.vals))
		}
		if err != nil {
			c.settleValue(op, kind, fmt.Errorf("shardproxy: %s %s: %w", kind, c.shards[sh].addr, err))
			continue
		}
		st.hash = counterHash(op.Key, 0) // by key: its ops stay in one unit, in order
		st.unit = int32(sh)              // the shard, until units are made
		b.perShard[sh]++
	}
	b.group(c)
	b.valueRounds()
}

// valueRounds splits each unit's value ops, in the call's order, into
// rounds of at most maxValueRoundOps ops and maxValueRoundBytes bytes of
// request, and numbers them as phases: exchange.run ends a chunk (one
// round for value ops) where the phase changes. The phases of value ops
// only ever grow along a unit's order, so the order, and with it the
// order of the ops on one key, stays the call's.
func (b *batch) valueRounds() {
	for u := range b.units {
		un := &b.units[u]
		var phase, ops int32
		bytes := 0
		for _, i := range b.order[un.lo:un.hi] {
			st := &b.ops[i]
			n := getsCommandLen
			if st.kind != kindGets {
				n = valueCommandLen + int(st.valEnd-st.valAt)
			}
			if ops > 0 && (ops == maxValueRoundOps || bytes+n > maxValueRoundBytes) {
				phase++
				ops, bytes = 0, 0
			}
			st.phase = phase
			ops++
			bytes += n
		}
	}
}

// finishValue copies the outcome st of a value op, whose unit's gets read
// into out, to the caller's op.
func (b *batch) finishValue(st *opState, op *ValueOp, out []byte) {
	if st.err != nil {
		failValue(op, st.err)
		return
	}
	op.Err = nil
	if st.kind == kindGets {
		op.Value = append(op.Value[:0], out[st.valAt:st.valEnd]...)
		op.CAS = st.cas
	}
}

// failValue sets a value op's outcome to err.
func failValue(op *ValueOp, err error) {
	op.Err = err
	if op.Kind == ValueGets {
		op.Value, op.CAS = op.Value[:0], 0
	}
}

// settleValue sets a value op's outcome to err, and counts it.
func (c *Client) settleValue(op *ValueOp, kind opKind, err error) {
	failValue(op, err)
	c.m.ops[kind][classify(err, false)].Inc()
}

// appendValueCommand appends the command of value op i to w.
func (x *exchange) appendValueCommand(w []byte, i int32) []byte {
	b := x.b
	st := &b.ops[i]
	switch st.kind {
	case kindGets:
		w = append(w, "gets "...)
		w = append(w, b.key(i)...)
		return append(w, "\r\n"...)
	case kindAdd:
		w = append(w, "add "...)
	default:
		w = append(w, "cas "...)
	}
	w = append(w, b.key(i)...)
	w = append(w, " 0 "...)
	w = strconv.AppendInt(w, int64(st.ttl), 10)
	w = append(w, ' ')
	w = strconv.AppendInt(w, int64(st.valEnd-st.valAt), 10)
	if st.kind == kindCAS {
		w = append(w, ' ')
		w = strconv.AppendUint(w, st.cas, 10)
	}
	w = append(w, "\r\n"...)
	w = append(w, b.vals[st.valAt:st.valEnd]...)
	return append(w, "\r\n"...)
}

// valueReply reads the reply of value op i, whose first line is line: for
// gets, END (none stored) or a VALUE block with its CAS token, then END;
// for add and cas, STORED, or the answer that another client wrote first.
func (x *exchange) valueReply(i int32, line []byte) error {
	b := x.b
	st := &b.ops[i]
	answer := func(err error) { st.setErr(fmt.Errorf("shardproxy: %s %s: %w", st.kind, x.addr, err)) }
	switch {
	case st.kind == kindGets && bytes.HasPrefix(line, replyValue):
		key, size, cas, ok := parseValueLine(line[len(replyValue):], true)
		switch {
		case !ok:
			return malformedLine("VALUE line", line)
		case !bytes.Equal(key, b.key(i)):
			return fmt.Errorf("%w: VALUE for key %.60q, not the one asked", ErrMalformed, key)
		case size > MaxValueLen:
			return fmt.Errorf("%w: VALUE of %d bytes, longer than any value (%d)", ErrMalformed, size, MaxValueLen)
		}
		out := &b.outs[x.u]
		at := len(*out)
		if err := x.valueBlock(out, size); err != nil {
			*out = (*out)[:at]
			return err
		}
		st.valAt, st.valEnd = int32(at), int32(len(*out))
		var err error
		if line, err = x.line(); err != nil {
			return err
		}
		if !bytes.Equal(line, replyEnd) {
			return x.unexpected(line)
		}
		st.cas, st.done = cas, true
	case st.kind == kindGets && bytes.Equal(line, replyEnd):
		answer(ErrNotFound)
	case st.kind != kindGets && bytes.Equal(line, replyStored):
		st.done = true
	case st.kind == kindAdd && bytes.Equal(line, replyNotStored):
		answer(ErrExists)
	case st.kind == kindCAS && bytes.Equal(line, replyExists):
		answer(ErrCASConflict)
	case st.kind == kindCAS && bytes.Equal(line, replyNotFound):
		answer(ErrNotFound)
	case bytes.HasPrefix(line, replyClientError):
		st.setErr(x.clientError(st.kind, line))
	default:
		return x.unexpected(line)
	}
	return nil
}

// valueBlock appends to out the data block of size bytes (at most
// MaxValueLen) that follows a gets' VALUE line, and reads the "\r\n"
// after it. Unlike block it does not need the block to fit in the read
// buffer: it reads through it.
func (x *exchange) valueBlock(out *[]byte, size int) error {
	at := len(*out)
	*out = slices.Grow(*out, size)[:at+size]
	if _, err := io.ReadFull(x.pc.r, (*out)[at:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		return readErr(err, true)
	}
	end, err := x.pc.r.Peek(2)
	if err != nil {
		return readErr(err, true)
	}
	if end[0] != '\r' || end[1] != '\n' {
		return malformedLine("data block", end)
	}
	x.pc.r.Discard(2)
	return nil
}
