package shardproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

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
	replyNotFound      = []byte("NOT_FOUND")
	replyStored        = []byte("STORED")
	replyNotStored     = []byte("NOT_STORED")
	replyExists        = []byte("EXISTS")
	replyEnd           = []byte("END")
	replyError         = []byte("ERROR")
	replyValue         = []byte("VALUE ")
	replyVersion       = []byte("VERSION ")
	replyClientError   = []byte("CLIENT_ERROR ")
	replyServerError   = []byte("SERVER_ERROR ")
	replyMetaValue     = []byte("VA ")
	replyMetaNotStored = []byte("NS")
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

// parseValueLine reads "<key> <flags> <bytes>", the rest of a VALUE line,
// or "<key> <flags> <bytes> <cas>" (the reply to gets) when withCAS.
func parseValueLine(b []byte, withCAS bool) (key []byte, size int, cas uint64, ok bool) {
	key, b, ok = bytes.Cut(b, []byte{' '})
	if !ok || len(key) == 0 {
		return nil, 0, 0, false
	}
	flags, b, ok := bytes.Cut(b, []byte{' '})
	if !ok || len(flags) > 10 {
		return nil, 0, 0, false
	}
	if _, ok := parseDigits(flags); !ok {
		return nil, 0, 0, false
	}
	if withCAS {
		var token []byte
		if b, token, ok = bytes.Cut(b, []byte{' '}); !ok {
			return nil, 0, 0, false
		}
		if cas, ok = parseDigits(token); !ok || token[len(token)-1] == ' ' {
			return nil, 0, 0, false
		}
	}
	n, ok := parseDigits(b)
	if !ok || len(b) > 10 || b[len(b)-1] == ' ' {
		return nil, 0, 0, false
	}
	return key, int(n), cas, true
}

// parseCounter reads a counter's value: decimal digits, which memcached may
// pad with trailing spaces after a decr shortens them in place.
func parseCounter(b []byte) (uint64, error) {
	v, ok := parseDigits(b)
	if !ok {
		return 0, fmt.Errorf("value %.40q is not a counter", b)
	}
	return v, nil
}

// readCounter is parseCounter for the value of key read from addr, its
// error that op's.
func readCounter[K string | []byte](addr string, key K, value []byte) (uint64, error) {
	v, err := parseCounter(value)
	if err != nil {
		return 0, fmt.Errorf("shardproxy: get %s: %s: %w", addr, key, err)
	}
	return v, nil
}

// number reads the reply of an incr or decr: the counter's new value.
func number(line []byte) (uint64, error) {
	v, ok := parseDigits(line)
	if !ok {
		return 0, malformedLine("incr/decr reply", line)
	}
	return v, nil
}
