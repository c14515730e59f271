package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/internal/testenv"
)

// srvServer answers every DNS query on a loopback UDP port with the SRV
// records given (priority 10, weight 10, the target's port), until the
// test ends.
func srvServer(t *testing.T, targets ...string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if len(q) < 12 {
				continue
			}
			// The question: the name's labels, then type and class.
			i := 12
			for i < len(q) && q[i] != 0 {
				i += int(q[i]) + 1
			}
			if i+5 > len(q) {
				continue
			}
			question := q[12 : i+5]
			resp := make([]byte, 12, 512)
			binary.BigEndian.PutUint16(resp[0:], binary.BigEndian.Uint16(q[0:])) // id
			binary.BigEndian.PutUint16(resp[2:], 0x8180)                         // a response, recursion desired and available
			binary.BigEndian.PutUint16(resp[4:], 1)                              // one question
			binary.BigEndian.PutUint16(resp[6:], uint16(len(targets)))           // answers
			resp = append(resp, question...)
			for _, tg := range targets {
				host, port, _ := net.SplitHostPort(tg)
				p, _ := strconv.Atoi(port)
				var rdata []byte
				rdata = binary.BigEndian.AppendUint16(rdata, 10)
				rdata = binary.BigEndian.AppendUint16(rdata, 10)
				rdata = binary.BigEndian.AppendUint16(rdata, uint16(p))
				for _, label := range strings.Split(host, ".") {
					rdata = append(append(rdata, byte(len(label))), label...)
				}
				rdata = append(rdata, 0)
				resp = append(resp, 0xc0, 12)                  // the question's name
				resp = binary.BigEndian.AppendUint16(resp, 33) // SRV
				resp = binary.BigEndian.AppendUint16(resp, 1)  // IN
				resp = binary.BigEndian.AppendUint32(resp, 60) // TTL
				resp = binary.BigEndian.AppendUint16(resp, uint16(len(rdata)))
				resp = append(resp, rdata...)
			}
			pc.WriteTo(resp, from)
		}
	}()
	return pc.LocalAddr().String()
}

// MEMCACHE_SRV is looked up once at start (here from a DNS server on
// loopback) and its targets are the memcached servers the edge counts in.
func TestEnvoyEnvMemcacheSRV(t *testing.T) {
	mc := testenv.Memcached(t)
	_, port, _ := net.SplitHostPort(mc.Addr)
	target := net.JoinHostPort("localhost", port) // a name: Go's resolver refuses an address as an SRV target
	dns := srvServer(t, target)
	memcacheResolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", dns)
	}}
	t.Cleanup(func() { memcacheResolver = net.DefaultResolver })
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	env := append(istioEnv("127.0.0.1:1", root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1", "BACKEND_TYPE=memcache", "MEMCACHE_SRV=_memcache._tcp.poplimit.test")
	e := startEnvoyEnv(t, env)
	if !countsInRedis(t, e, e.client) { // counting in the store: memcached here
		t.Fatalf("MEMCACHE_SRV: not counting in memcached\n%s", e.out.String())
	}
	if !strings.Contains(e.out.String(), "MEMCACHE_SRV _memcache._tcp.poplimit.test: memcached servers "+target) {
		t.Errorf("the servers found are not logged:\n%s", e.out.String())
	}
}

// LOG_FORMAT=json logs one JSON object a line, -envoy-env's notes among
// them.
func TestEnvoyEnvLogFormatJSON(t *testing.T) {
	rd := testenv.Redis(t)
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	env := append(istioEnv(rd.Addr, root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1", "LOG_FORMAT=json", "STATSD_HOST=statsd")
	e := startEnvoyEnv(t, env)
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(e.out.String()), "\n")
	var started, noted bool
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		started = started || m["msg"] == "edge: started"
		noted = noted || strings.Contains(fmt.Sprint(m["msg"]), "STATSD_HOST set: not read")
	}
	if !started || !noted {
		t.Errorf("JSON lines without the start line (%v) or the STATSD_HOST note (%v):\n%s", started, noted, e.out.String())
	}
}
