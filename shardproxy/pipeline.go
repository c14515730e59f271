package shardproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
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
	nc   net.Conn
	r    *bufio.Reader
	w    []byte  // the round being written
	next []int32 // ops that go on to the next round (misses, lost add races)
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
	addr    string
	timeout time.Duration
}

// run performs ops, which plan sorted by phase and, within a phase, reads
// before writes. Each phase goes in chunks of at most maxPipelineOps ops
// (a unit holds more when one counter is hot, since all of a counter's ops
// are in one unit), each chunk in up to three rounds:
// (1) the multi-gets of its reads and the incr or decr of its writes, (2)
// an add for each incr that missed, (3) an incr for each add that lost a
// race. Each round is one write and the reads of its replies, within
// timeout. Chunks of a phase run in order, so its reads still precede its
// writes.
//
// It returns nil when every round ended cleanly, or stopped early because
// the batch is over (ops left without an outcome are then late, not
// failed); otherwise the connection's or the stream's error, after which
// the connection must be closed and ops without an outcome fail with it.
func (x *exchange) run(ops []int32) error {
	b := x.b
	for len(ops) > 0 {
		if b.ctx.Err() != nil {
			return nil
		}
		phase := b.ops[ops[0]].phase
		n := 1
		for n < len(ops) && n < maxPipelineOps && b.ops[ops[n]].phase == phase {
			n++
		}
		chunk := ops[:n]
		ops = ops[n:]
		err := x.chunk(chunk)
		if errors.Is(err, errOutOfStep) {
			for _, i := range chunk {
				b.ops[i].reset()
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// chunk runs the rounds of ops of one phase.
func (x *exchange) chunk(ops []int32) error {
	b := x.b
	m := 0
	for m < len(ops) && b.ops[ops[m]].kind == kindGet {
		m++
	}
	if err := x.first(ops[:m], ops[m:]); err != nil {
		return err
	}
	for round := 2; round <= 3 && len(x.pc.next) > 0; round++ {
		if b.ctx.Err() != nil {
			return nil
		}
		if err := x.retry(round); err != nil {
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
		if st.kind == kindIncr {
			w = append(w, "incr "...)
		} else {
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
		switch {
		case isNumber(line):
			v, ok := parseDigits(line)
			if !ok {
				return malformedLine("incr/decr reply", line)
			}
			st.value, st.done = v, true
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

// retry sends and reads round 2 (add each counter pc.next holds, created
// with the op's delta and TTL) or round 3 (incr each one whose add lost a
// race), and leaves in pc.next the ops that go on to the next round.
func (x *exchange) retry(round int) error {
	b, pc := x.b, x.pc
	w := pc.w[:0]
	for _, i := range pc.next {
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
	next := pc.next[:0] // compacted in place: reads stay ahead of writes
	for _, i := range pc.next {
		st := &b.ops[i]
		line, err := x.line()
		if err != nil {
			return err
		}
		switch {
		case round == 2 && bytes.Equal(line, replyStored):
			st.value, st.miss, st.done = st.delta, true, true // created
		case round == 2 && bytes.Equal(line, replyNotStored):
			next = append(next, i) // another client created it meanwhile
		case round == 3 && isNumber(line):
			v, ok := parseDigits(line)
			if !ok {
				return malformedLine("incr reply", line)
			}
			st.value, st.done = v, true
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
	pc.next = next
	return x.end()
}

// readGet reads the reply of one multi-get of reads: a VALUE block for
// each counter found, in the order asked (memcached repeats a key asked
// twice), then END. A counter without a VALUE is missing and reads 0. When
// the reply is broken, none of its VALUEs is kept.
func (x *exchange) readGet(reads []int32) error {
	err := x.readValues(reads)
	if err != nil {
		for _, i := range reads {
			x.b.ops[i].reset()
		}
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
		key, size, ok := parseValueLine(line[len(replyValue):])
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
		data, err := x.pc.r.Peek(size + 2)
		if err != nil {
			return readErr(err, len(data) > 0)
		}
		if data[size] != '\r' || data[size+1] != '\n' {
			return malformedLine("VALUE data block", data)
		}
		st := &b.ops[reads[j]]
		if v, ok := parseDigits(data[:size]); ok {
			st.value = v
		} else {
			// A value that is not a counter: memcached's answer, this op's
			// error, as on the gomemcache path.
			st.err = fmt.Errorf("shardproxy: get %s: %s: value %.40q is not a counter", x.addr, b.key(reads[j]), data[:size])
		}
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

// line reads one reply line and returns it without its "\r\n". It is valid
// until the next read.
func (x *exchange) line() ([]byte, error) {
	l, err := x.pc.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: reply line longer than %d bytes", ErrMalformed, readBufSize)
		}
		return nil, readErr(err, len(l) > 0)
	}
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return nil, malformedLine("line not ended by \\r\\n", l)
	}
	return l[:len(l)-2], nil
}

// readErr describes an error reading a reply, partial when part of the
// reply had arrived.
func readErr(err error, partial bool) error {
	if err != io.EOF {
		return err // a timeout or a broken connection
	}
	if partial {
		return fmt.Errorf("%w: reply truncated by the server closing the connection", ErrMalformed)
	}
	return fmt.Errorf("connection closed by the server: %w", io.ErrUnexpectedEOF)
}

// unexpected is the error of a reply line that is not an answer to the
// command it is read for.
func (x *exchange) unexpected(line []byte) error {
	switch {
	case bytes.HasPrefix(line, replyVersion):
		return errOutOfStep // endCommand's reply where a command's was due
	case bytes.HasPrefix(line, replyServerError):
		// memcached's own failure (out of memory, …): it counts against
		// the shard, and memcached may close the connection after it.
		return fmt.Errorf("server error: %.100s", line[len(replyServerError):])
	case bytes.Equal(line, replyError):
		return fmt.Errorf("%w: memcached did not understand a command (ERROR)", ErrMalformed)
	}
	return malformedLine("reply", line)
}

// clientError is the error of an op memcached refused with CLIENT_ERROR
// (an incr of a value that is not a number): its answer, not a failure.
func (x *exchange) clientError(kind opKind, line []byte) error {
	return fmt.Errorf("shardproxy: %s %s: client error: %.100s", kind, x.addr, line[len(replyClientError):])
}

func malformedLine(what string, line []byte) error {
	return fmt.Errorf("%w: %s %.40q", ErrMalformed, what, line)
}

// Reply lines, without "\r\n", and prefixes.
var (
	replyNotFound    = []byte("NOT_FOUND")
	replyStored      = []byte("STORED")
	replyNotStored   = []byte("NOT_STORED")
	replyEnd         = []byte("END")
	replyError       = []byte("ERROR")
	replyValue       = []byte("VALUE ")
	replyVersion     = []byte("VERSION ")
	replyClientError = []byte("CLIENT_ERROR ")
	replyServerError = []byte("SERVER_ERROR ")
)

func isNumber(line []byte) bool { return len(line) > 0 && '0' <= line[0] && line[0] <= '9' }

// parseDigits reads a counter: decimal digits, which memcached may pad
// with trailing spaces after a decr shortens them in place. It reports
// false for anything else, an empty value or one over math.MaxUint64.
func parseDigits(b []byte) (uint64, bool) {
	for len(b) > 0 && b[len(b)-1] == ' ' {
		b = b[:len(b)-1]
	}
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// parseValueLine reads "<key> <flags> <bytes>", the rest of a VALUE line.
func parseValueLine(b []byte) (key []byte, size int, ok bool) {
	key, b, ok = bytes.Cut(b, []byte{' '})
	if !ok || len(key) == 0 {
		return nil, 0, false
	}
	flags, b, ok := bytes.Cut(b, []byte{' '})
	if !ok || len(flags) > 10 || len(b) > 10 {
		return nil, 0, false
	}
	if _, ok := parseDigits(flags); !ok {
		return nil, 0, false
	}
	n, ok := parseDigits(b)
	if !ok || b[len(b)-1] == ' ' {
		return nil, 0, false
	}
	return key, int(n), true
}
