package shardproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Limits of the pipelined path.
const (
	// maxPipelineOps caps the ops of one round of a pipeline, and so a
	// round's request (at most ~37 KB) and its replies (at most ~70 KB of
	// counters and VALUE lines) to what the socket buffers hold: writing a
	// whole round before reading it then cannot stall on a server that
	// stops reading while its replies wait. A shard's share of a larger
	// call is split into pipelines of about this size, by counter, run on
	// as many connections.
	maxPipelineOps = 512

	// readBufSize is the read buffer of a pipeline connection and so the
	// longest reply line accepted; memcached's are under 300 bytes.
	readBufSize = 4096

	// maxValueLen is the longest value a VALUE reply may announce: a
	// counter is at most 20 digits, padded with spaces after a decr. A
	// longer one is malformed, so a hostile length costs no allocation.
	maxValueLen = 64

	// endCommand ends every round: its reply, "VERSION <v>", is the one
	// line no counter command can produce, so a reply missing or extra is
	// caught in the round it happens in instead of shifting the next
	// batch's replies onto the wrong counters.
	endCommand = "version\r\n"
)

// errOutOfStep marks a round whose replies and commands are out of step:
// a reply is missing or extra, so none of the round's replies can be
// trusted, not even those that parsed.
var errOutOfStep = fmt.Errorf("%w: replies out of step with commands", ErrMalformed)

// pconn is a raw connection to one shard for pipelines. A worker holds it
// for a whole unit; between units it waits in its shard's pipePool.
type pconn struct {
	nc    net.Conn
	r     *bufio.Reader
	w     []byte  // the round being written
	round []int32 // ops of round 2 or 3 being read
	next  []int32 // ops that go on to the next round (misses, lost add races)
}

// pipePool keeps a shard's idle pipeline connections, most recently used
// first out. The shard's slots bound the connections in use; the pool
// bounds those idle.
type pipePool struct {
	addr    string
	maxIdle int

	// mu protects the fields below.
	mu     sync.Mutex
	idle   []*pconn
	closed bool
}

// get returns an idle connection, or dials one within timeout.
func (p *pipePool) get(timeout time.Duration) (*pconn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return pc, nil
	}
	p.mu.Unlock()
	nc, err := net.DialTimeout("tcp", p.addr, timeout)
	if err != nil {
		return nil, err
	}
	return &pconn{nc: nc, r: bufio.NewReaderSize(nc, readBufSize), w: make([]byte, 0, 2048)}, nil
}

// put returns a connection whose last round ended cleanly, or closes it
// when the pool is full or closed.
func (p *pipePool) put(pc *pconn) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.maxIdle {
		p.mu.Unlock()
		pc.nc.Close()
		return
	}
	p.idle = append(p.idle, pc)
	p.mu.Unlock()
}

// drain closes the idle connections; after drain(true) the pool keeps none.
func (p *pipePool) drain(closing bool) error {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = p.closed || closing
	p.mu.Unlock()
	var errs []error
	for _, pc := range idle {
		if err := pc.nc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// exchange runs the ops of one pipeline unit on one connection. It lives
// on its worker's stack.
type exchange struct {
	b       *batch
	pc      *pconn
	u       int32 // the unit it runs
	addr    string
	timeout time.Duration
	meta    bool // increments are ma commands (Config.Protocol "meta")
}

// run performs ops, which plan sorted by phase and, within a phase, reads
// before writes. Each phase goes in chunks of at most maxPipelineOps ops
// (a unit holds more when one counter is hot, since all of a counter's ops
// are in one unit), each chunk in up to three rounds:
// (1) the multi-gets of its reads and the incr (or ma) or decr of its
// writes, or its value ops, (2) an add for each incr that missed, (3) an
// incr for each add that lost a race; a chunk of value ops is at most
// maxValueRoundOps, and one round. Each round is one write and the reads
// of its replies, within timeout. Chunks of a phase run in order, so its reads still precede its
// writes.
//
// It returns nil when every round ended cleanly, or stopped early because
// the batch is over (ops left without an outcome are then late, not
// failed); otherwise the connection's or the stream's error, after which
// the connection must be closed and ops without an outcome fail with it.
func (x *exchange) run(ops []int32) error {
	b := x.b
	limit := maxPipelineOps
	if b.values {
		limit = maxValueRoundOps
	}
	for len(ops) > 0 {
		if b.ctx.Err() != nil {
			return nil
		}
		phase := b.ops[ops[0]].phase
		n := 1
		for n < len(ops) && n < limit && b.ops[ops[n]].phase == phase {
			n++
		}
		chunk := ops[:n]
		ops = ops[n:]
		if err := x.chunk(chunk); err != nil {
			return err
		}
	}
	return nil
}

// chunk runs the rounds of ops of one phase. When a round's replies are
// out of step with its commands, the outcomes read in that round are
// forgotten, and only those: the rounds before it ended in step, so what
// memcached confirmed in them stands (an increment failed after memcached
// counted it would be sent again by the caller, and counted twice).
func (x *exchange) chunk(ops []int32) error {
	b, pc := x.b, x.pc
	m := 0
	for m < len(ops) && b.ops[ops[m]].kind == kindGet {
		m++
	}
	if err := x.first(ops[:m], ops[m:]); err != nil {
		if errors.Is(err, errOutOfStep) {
			b.reset(ops)
		}
		return err
	}
	for round := 2; round <= 3 && len(pc.next) > 0; round++ {
		if b.ctx.Err() != nil {
			return nil
		}
		pc.round, pc.next = pc.next, pc.round[:0]
		if err := x.retry(round); err != nil {
			if errors.Is(err, errOutOfStep) {
				b.reset(pc.round)
			}
			return err
		}
	}
	return nil
}

// first sends and reads round 1: multi-gets of reads, then writes.
func (x *exchange) first(reads, writes []int32) error {
	b, pc := x.b, x.pc
	w := pc.w[:0]
	for j := 0; j < len(reads); j += maxKeysPerGet {
		w = append(w, "get"...)
		for _, i := range reads[j:min(j+maxKeysPerGet, len(reads))] {
			w = append(w, ' ')
			w = append(w, b.key(i)...)
		}
		w = append(w, "\r\n"...)
	}
	for _, i := range writes {
		st := &b.ops[i]
		switch {
		case st.kind >= kindGets:
			w = x.appendValueCommand(w, i)
			continue
		case st.kind == kindIncr && x.meta:
			// Increment, or create with the delta as initial value and the
			// TTL, in one command.
			w = append(w, "ma "...)
			w = append(w, b.key(i)...)
			w = append(w, " N"...)
			w = strconv.AppendInt(w, int64(st.ttl), 10)
			w = append(w, " J"...)
			w = strconv.AppendUint(w, st.delta, 10)
			w = append(w, " D"...)
			w = strconv.AppendUint(w, st.delta, 10)
			w = append(w, " v\r\n"...)
			continue
		case st.kind == kindIncr:
			if st.create {
				// Create the counter if it is missing, with its TTL, so the
				// incr after it finds it: no reply, and none to read;
				// refused (it exists) or failed, the incr goes as before.
				w = append(w, "add "...)
				w = append(w, b.key(i)...)
				w = append(w, " 0 "...)
				w = strconv.AppendInt(w, int64(st.ttl), 10)
				w = append(w, " 1 noreply\r\n0\r\n"...)
			}
			w = append(w, "incr "...)
		default:
			w = append(w, "decr "...)
		}
		w = append(w, b.key(i)...)
		w = append(w, ' ')
		w = strconv.AppendUint(w, st.delta, 10)
		w = append(w, "\r\n"...)
	}
	if err := x.send(w); err != nil {
		return err
	}
	for j := 0; j < len(reads); j += maxKeysPerGet {
		if err := x.readGet(reads[j:min(j+maxKeysPerGet, len(reads))]); err != nil {
			return err
		}
	}
	pc.next = pc.next[:0]
	for _, i := range writes {
		st := &b.ops[i]
		line, err := x.line()
		if err != nil {
			return err
		}
		if st.kind >= kindGets {
			if err := x.valueReply(i, line); err != nil {
				return err
			}
			continue
		}
		if st.kind == kindIncr && x.meta {
			if err := x.metaReply(st, line); err != nil {
				return err
			}
			continue
		}
		switch {
		case isNumber(line):
			if st.value, err = number(line); err != nil {
				return err
			}
			st.done = true
		case bytes.Equal(line, replyNotFound):
			if st.kind == kindIncr {
				pc.next = append(pc.next, i) // add it in round 2
			} else {
				st.miss, st.done = true, true // decr of a missing counter reads 0
			}
		case bytes.HasPrefix(line, replyClientError):
			st.err, st.done = x.clientError(st.kind, line), true
		default:
			return x.unexpected(line)
		}
	}
	return x.end()
}

// metaReply reads the reply of an ma command (with the v flag): "VA
// <length>" and the counter's new value, whether it existed or not.
func (x *exchange) metaReply(st *opState, line []byte) error {
	switch {
	case bytes.HasPrefix(line, replyMetaValue):
		size, _, _ := bytes.Cut(line[len(replyMetaValue):], []byte{' '}) // flags, if any, follow
		n, ok := parseDigits(size)
		if !ok || n > maxValueLen {
			return malformedLine("ma reply", line)
		}
		data, err := x.block(int(n))
		if err != nil {
			return err
		}
		v, ok := parseDigits(data[:n])
		if !ok {
			return malformedLine("ma value", data)
		}
		x.pc.r.Discard(int(n) + 2)
		st.value, st.done = v, true
	case bytes.Equal(line, replyMetaNotStored):
		// memcached could not store the counter it was to create.
		st.err, st.done = fmt.Errorf("shardproxy: incr %s: counter not created (NS)", x.addr), true
	case bytes.HasPrefix(line, replyClientError):
		st.err, st.done = x.clientError(kindIncr, line), true
	default:
		return x.unexpected(line)
	}
	return nil
}

// retry sends and reads round 2 (add each counter pc.round holds, created
// with the op's delta and TTL) or round 3 (incr each one whose add lost a
// race), and leaves in pc.next the ops that go on to the next round.
func (x *exchange) retry(round int) error {
	b, pc := x.b, x.pc
	w := pc.w[:0]
	for _, i := range pc.round {
		st := &b.ops[i]
		var digits [20]byte
		d := strconv.AppendUint(digits[:0], st.delta, 10)
		if round == 2 {
			w = append(w, "add "...)
			w = append(w, b.key(i)...)
			w = append(w, " 0 "...)
			w = strconv.AppendInt(w, int64(st.ttl), 10)
			w = append(w, ' ')
			w = strconv.AppendInt(w, int64(len(d)), 10)
			w = append(w, "\r\n"...)
			w = append(w, d...)
		} else {
			w = append(w, "incr "...)
			w = append(w, b.key(i)...)
			w = append(w, ' ')
			w = append(w, d...)
		}
		w = append(w, "\r\n"...)
	}
	if err := x.send(w); err != nil {
		return err
	}
	for _, i := range pc.round {
		st := &b.ops[i]
		line, err := x.line()
		if err != nil {
			return err
		}
		switch {
		case round == 2 && bytes.Equal(line, replyStored):
			st.value, st.miss, st.done = st.delta, true, true // created
		case round == 2 && bytes.Equal(line, replyNotStored):
			pc.next = append(pc.next, i) // another client created it meanwhile
		case round == 3 && isNumber(line):
			if st.value, err = number(line); err != nil {
				return err
			}
			st.done = true
		case round == 3 && bytes.Equal(line, replyNotFound):
			// Created by another client, then gone (expired, evicted or
			// deleted) before this incr: as gomemcache reports it.
			st.err, st.done = fmt.Errorf("shardproxy: incr %s: %w", x.addr, memcache.ErrCacheMiss), true
		case bytes.HasPrefix(line, replyClientError):
			st.err, st.done = x.clientError(kindIncr, line), true
		default:
			return x.unexpected(line)
		}
	}
	return x.end()
}

// readGet reads the reply of one multi-get of reads: a VALUE block for
// each counter found, in the order asked (memcached repeats a key asked
// twice), then END. A counter without a VALUE is missing and reads 0. When
// the reply is broken, none of its VALUEs is kept.
func (x *exchange) readGet(reads []int32) error {
	err := x.readValues(reads)
	if err != nil {
		x.b.reset(reads)
	}
	return err
}

func (x *exchange) readValues(reads []int32) error {
	b := x.b
	j := 0 // reads before j have had their VALUE, or are missing
	for {
		line, err := x.line()
		if err != nil {
			return err
		}
		if bytes.Equal(line, replyEnd) {
			for _, i := range reads {
				if st := &b.ops[i]; !st.done {
					st.miss, st.done = true, true
				}
			}
			return nil
		}
		if !bytes.HasPrefix(line, replyValue) {
			return x.unexpected(line)
		}
		key, size, _, ok := parseValueLine(line[len(replyValue):], false)
		if !ok {
			return malformedLine("VALUE line", line)
		}
		if size > maxValueLen {
			return fmt.Errorf("%w: VALUE of %d bytes, longer than any counter (%d)", ErrMalformed, size, maxValueLen)
		}
		for j < len(reads) && !bytes.Equal(b.key(reads[j]), key) {
			j++ // missing, unless the VALUE is out of order
		}
		if j == len(reads) {
			return fmt.Errorf("%w: VALUE for key %.60q, not asked or out of order", ErrMalformed, key)
		}
		data, err := x.block(size)
		if err != nil {
			return err
		}
		// A value that is not a counter is memcached's answer: this op's
		// error, as on the gomemcache path.
		st := &b.ops[reads[j]]
		st.value, st.err = readCounter(x.addr, b.key(reads[j]), data[:size])
		st.done = true
		j++
		x.pc.r.Discard(size + 2)
	}
}

// send writes a round, with endCommand appended, in one write, and sets
// the deadline its replies must arrive by.
func (x *exchange) send(w []byte) error {
	w = append(w, endCommand...)
	x.pc.w = w
	if err := x.pc.nc.SetDeadline(time.Now().Add(x.timeout)); err != nil {
		return err
	}
	_, err := x.pc.nc.Write(w)
	return err
}

// block returns the data block of size bytes that follows a VALUE or VA
// line, checking its "\r\n"; it stays buffered (and valid) until the
// caller discards its size+2 bytes. size is at most what the read buffer
// holds.
func (x *exchange) block(size int) ([]byte, error) {
	data, err := x.pc.r.Peek(size + 2)
	if err != nil {
		return nil, readErr(err, len(data) > 0)
	}
	if data[size] != '\r' || data[size+1] != '\n' {
		return nil, malformedLine("data block", data)
	}
	return data, nil
}

// end reads the reply to endCommand, which must be the round's last.
func (x *exchange) end() error {
	line, err := x.line()
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, replyVersion) || x.pc.r.Buffered() > 0 {
		return errOutOfStep
	}
	return nil
}
