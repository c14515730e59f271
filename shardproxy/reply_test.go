package shardproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseCounter(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"0", 0, false},
		{"5  ", 5, false}, // memcached pads a value a decr shortened
		{"18446744073709551615", math.MaxUint64, false},
		{"", 0, true},
		{" 5", 0, true},
		{"abc", 0, true},
		{"18446744073709551616", 0, true},
	}
	for _, tt := range tests {
		got, err := parseCounter([]byte(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseCounter(%q): got %d, %v, want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseDigits(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"7", 7, true}, {"5   ", 5, true}, {"18446744073709551615", math.MaxUint64, true},
		{"18446744073709551616", 0, false}, {"99999999999999999999", 0, false}, {"000000000000000000001", 0, false},
		{"", 0, false}, {" ", 0, false}, {" 5", 0, false}, {"5x", 0, false}, {"-1", 0, false}, {"+1", 0, false},
	}
	for _, tt := range tests {
		if got, ok := parseDigits([]byte(tt.in)); got != tt.want || ok != tt.ok {
			t.Errorf("parseDigits(%q): got %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseValueLine(t *testing.T) {
	tests := []struct {
		in   string
		key  string
		size int
		ok   bool
	}{
		{"k 0 1", "k", 1, true},
		{"pl:{0123456789abcdef}:0 4294967295 20", "pl:{0123456789abcdef}:0", 20, true},
		{"k 0 99999999999", "", 0, false}, // longer than any reply we read
		{"k 0", "", 0, false}, {"k", "", 0, false}, {"", "", 0, false}, {" 0 1", "", 0, false},
		{"k 0 1 5", "", 0, false}, {"k x 1", "", 0, false}, {"k 0 -1", "", 0, false}, {"k 0 1 ", "", 0, false},
		{"k  0 1", "", 0, false}, {"k 0  1", "", 0, false},
	}
	for _, tt := range tests {
		key, size, _, ok := parseValueLine([]byte(tt.in), false)
		if string(key) != tt.key || size != tt.size || ok != tt.ok {
			t.Errorf("parseValueLine(%q): got %q, %d, %v, want %q, %d, %v", tt.in, key, size, ok, tt.key, tt.size, tt.ok)
		}
	}
}

// replayConn is a net.Conn that answers with fixed bytes, then EOF.
type replayConn struct {
	r       io.Reader
	written int
}

func (c *replayConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *replayConn) Write(p []byte) (int, error)      { c.written += len(p); return len(p), nil }
func (c *replayConn) Close() error                     { return nil }
func (c *replayConn) LocalAddr() net.Addr              { return tcpAddr("127.0.0.1:1") }
func (c *replayConn) RemoteAddr() net.Addr             { return tcpAddr("127.0.0.1:2") }
func (c *replayConn) SetDeadline(time.Time) error      { return nil }
func (c *replayConn) SetReadDeadline(time.Time) error  { return nil }
func (c *replayConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzPipelineReplies feeds arbitrary reply streams to a pipeline of two
// reads, an incr that may miss (then an add, then an incr) and a decr:
// never a panic, every op ends with an outcome or the stream's error, and
// the error is one of the kinds the package reports; with meta, the incr
// is an ma.
func FuzzPipelineReplies(f *testing.F) {
	c, err := New(Config{Servers: []Server{{Addr: "127.0.0.1:1"}}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	ring := c.Ring()
	ops := []Op{{Key: 1}, {Key: 2}, {Key: 3, Delta: 5, TTL: time.Minute}, {Key: 4, Delta: -2}}
	k1, k2 := counterKey(1, 0), counterKey(2, 0)
	f.Add([]byte("VALUE "+k1+" 0 1\r\n7\r\nEND\r\n8\r\n3  \r\nVERSION 1.6\r\n"), false)
	f.Add([]byte("VALUE "+k1+" 0 1\r\n7\r\nVALUE "+k2+" 0 2\r\n9 \r\nEND\r\nNOT_FOUND\r\nNOT_FOUND\r\nVERSION 1\r\nNOT_STORED\r\nVERSION 1\r\n12\r\nVERSION 1\r\n"), false)
	f.Add([]byte("END\r\nNOT_FOUND\r\n0\r\nVERSION 1\r\nSTORED\r\nVERSION 1\r\n"), false)
	f.Add([]byte("END\r\nCLIENT_ERROR bad\r\nSERVER_ERROR oom\r\nVERSION 1\r\n"), false)
	f.Add([]byte("VALUE "+k1+" 0 1099511627776\r\n"), false)
	f.Add([]byte("VALUE x 0 1\r\n1\r\nEND\r\n"), false)
	f.Add([]byte("END\r\n1\r\n2\r\n3\r\nVERSION 1\r\n"), false)
	f.Add([]byte("VALUE "+k1+" 0 1\r\n7\r\nEND\r\nVA 1\r\n5\r\n3  \r\nVERSION 1.6\r\n"), true)
	f.Add([]byte("END\r\nVA 2 t60\r\n12\r\nNOT_FOUND\r\nVERSION 1\r\n"), true)
	f.Add([]byte("END\r\nNS\r\n0\r\nVERSION 1\r\n"), true)
	f.Add([]byte("END\r\nVA 99\r\n"), true)
	f.Add([]byte("END\r\nVA 1\r\nx\r\n0\r\nVERSION 1\r\n"), true)
	f.Add([]byte("END\r\nCLIENT_ERROR bad\r\nVA\r\nVERSION 1\r\n"), true)
	f.Fuzz(func(t *testing.T, replies []byte, meta bool) {
		b := getBatch()
		defer b.release()
		b.ctx, b.parent = context.Background(), context.Background()
		batch := append([]Op(nil), ops...)
		b.plan(c, ring, batch)
		if len(b.units) != 1 || !b.units[0].pipe {
			t.Fatalf("got units %+v, want one pipeline", b.units)
		}
		conn := &replayConn{r: bytes.NewReader(replies)}
		x := exchange{b: b, pc: &pconn{nc: conn, r: bufio.NewReaderSize(conn, readBufSize)}, addr: "shard", timeout: time.Second, meta: meta}
		order := b.order[b.units[0].lo:b.units[0].hi]
		err := x.run(order)
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, io.ErrUnexpectedEOF) && !strings.HasPrefix(msg, "server error: ") {
				t.Fatalf("run: got error %v, want ErrMalformed, a closed connection or a server error", err)
			}
			return
		}
		for _, i := range order {
			if !b.ops[i].done {
				t.Fatalf("op %d: no outcome after a clean run", i)
			}
		}
	})
}
