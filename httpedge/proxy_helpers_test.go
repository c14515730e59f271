package httpedge_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// wireMsg is one HTTP/1.1 message as read off the wire: its first line,
// its header lines in order as sent, and its body (decoded when chunked).
type wireMsg struct {
	first    string
	fields   [][2]string
	body     []byte
	chunked  bool
	complete bool // the body ended as its framing said
}

// values returns every value of the field name, in any case.
func (m *wireMsg) values(name string) []string {
	var out []string
	for _, f := range m.fields {
		if strings.EqualFold(f[0], name) {
			out = append(out, f[1])
		}
	}
	return out
}

// value returns the field's lines joined by ", ".
func (m *wireMsg) value(name string) string { return strings.Join(m.values(name), ", ") }

func (m *wireMsg) has(name string) bool { return len(m.values(name)) > 0 }

// readWireMsg reads one message from r. A request without Content-Length
// or chunked framing has no body; a response without them (and not
// noBody) runs to the connection's end.
func readWireMsg(r *bufio.Reader, response, noBody bool) (*wireMsg, error) {
	m := &wireMsg{}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	m.first = strings.TrimRight(line, "\r\n")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ":")
		m.fields = append(m.fields, [2]string{name, strings.TrimSpace(value)})
	}
	switch {
	case noBody:
		m.complete = true
	case strings.EqualFold(m.value("Transfer-Encoding"), "chunked"):
		m.chunked = true
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return m, err
			}
			size, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
			n, err := strconv.ParseInt(size, 16, 64)
			if err != nil {
				return m, fmt.Errorf("chunk size %q: %w", line, err)
			}
			if n == 0 {
				for { // trailer section
					line, err := r.ReadString('\n')
					if err != nil {
						return m, err
					}
					if strings.TrimRight(line, "\r\n") == "" {
						m.complete = true
						return m, nil
					}
				}
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(r, chunk); err != nil {
				return m, err
			}
			m.body = append(m.body, chunk[:n]...)
		}
	case m.has("Content-Length"):
		n, err := strconv.Atoi(m.value("Content-Length"))
		if err != nil {
			return m, err
		}
		m.body = make([]byte, n)
		if _, err := io.ReadFull(r, m.body); err != nil {
			return m, err
		}
		m.complete = true
	case response:
		m.body, err = io.ReadAll(r)
		m.complete = err == nil
	default:
		m.complete = true
	}
	return m, nil
}

// rawOrigin is a real HTTP/1.1 origin on a loopback port that writes its
// responses byte for byte and records every request as it came on the
// wire, finished or not.
type rawOrigin struct {
	addr    string
	mu      sync.Mutex
	reqs    []*wireMsg
	conns   map[net.Conn]bool
	accepts atomic.Int32
}

// startRawOrigin serves until the test ends; respond returns the raw
// response to a request (nil: the connection is closed unanswered).
func startRawOrigin(t *testing.T, respond func(*wireMsg) []byte) *rawOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &rawOrigin{addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		o.mu.Lock()
		for c := range o.conns {
			c.Close()
		}
		o.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.accepts.Add(1)
			o.mu.Lock()
			o.conns[c] = true
			o.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					m, err := readWireMsg(br, false, false)
					if m != nil {
						o.mu.Lock()
						o.reqs = append(o.reqs, m)
						o.mu.Unlock()
					}
					if err != nil {
						return
					}
					resp := respond(m)
					if resp == nil {
						return
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	return o
}

// requests returns the requests the origin read so far.
func (o *rawOrigin) requests() []*wireMsg {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*wireMsg(nil), o.reqs...)
}

// exchange sends raw on a new connection to addr and reads one response.
func exchange(t *testing.T, addr, raw string) *wireMsg {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	m, err := readWireMsg(bufio.NewReader(c), true, strings.HasPrefix(raw, "HEAD "))
	if err != nil {
		t.Fatalf("reading the response to %q: %v", raw, err)
	}
	return m
}

func okResponse(body string) []byte {
	return []byte("HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}
