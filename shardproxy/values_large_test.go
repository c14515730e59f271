package shardproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// largeValue returns n bytes that differ by key and generation, with bytes
// that look like replies in them.
func largeValue(key uint64, gen string, n int) []byte {
	head := fmt.Sprintf("\r\nEND\r\nVALUE %d %s\r\n", key, gen)
	v := bytes.Repeat([]byte{byte(key), 0xff, '\r', '\n'}, n/4+1)
	copy(v, head)
	return v[:n]
}

// TestLargeValues stores, reads and swaps values of MaxValueLen bytes (four
// times the pipeline's read buffer) on a real memcached, one op at a time
// and in batches whose requests and replies are far more than one round
// may hold: every value comes back whole.
func TestLargeValues(t *testing.T) {
	ps := startShards(t, 1)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()

	big := largeValue(1, "a", MaxValueLen)
	if err := c.Add(ctx, 1, big, time.Minute); err != nil {
		t.Fatalf("Add of %d bytes: %v", len(big), err)
	}
	v, cas, err := c.Gets(ctx, 1)
	if err != nil || !bytes.Equal(v, big) {
		t.Fatalf("Gets of %d bytes: got %d bytes, %v", len(big), len(v), err)
	}
	big2 := largeValue(1, "b", MaxValueLen-1)
	if err := c.CompareAndSwap(ctx, 1, big2, cas, time.Minute); err != nil {
		t.Fatalf("CompareAndSwap of %d bytes: %v", len(big2), err)
	}
	if v, _, err := c.Gets(ctx, 1); err != nil || !bytes.Equal(v, big2) {
		t.Fatalf("Gets after the swap: got %d bytes, %v, want %d", len(v), err, len(big2))
	}
	tooLong := make([]byte, MaxValueLen+1)
	if err := c.Add(ctx, 2, tooLong, time.Minute); err == nil || !strings.Contains(err.Error(), "longer than MaxValueLen") {
		t.Errorf("Add of MaxValueLen+1 bytes: got %v, want refused", err)
	}
	// A longer value stored by someone else is malformed, not read.
	if r := command(t, ps[0].Addr, fmt.Sprintf("set %s 0 60 %d\r\n%s", valueKey(3), MaxValueLen+1, tooLong)); r != "STORED" {
		t.Fatalf("set: got %q", r)
	}
	if _, _, err := c.Gets(ctx, 3); !errors.Is(err, ErrMalformed) {
		t.Errorf("Gets of a value longer than MaxValueLen: got %v, want ErrMalformed", err)
	}

	// Batches: 64 adds of sizes up to MaxValueLen (about 600 KiB), then
	// one call of gets and swaps of those values mixed with adds of new
	// ones, then gets of all.
	const n = 64
	size := func(k int) int { return []int{MaxValueLen, 12 << 10, 4097, 17, 1}[k%5] }
	base := uint64(1) << 40
	adds := make([]ValueOp, n)
	for k := range adds {
		adds[k] = ValueOp{Kind: ValueAdd, Key: base + uint64(k), Value: largeValue(base+uint64(k), "a", size(k)), TTL: time.Minute}
	}
	c.DoValues(ctx, adds)
	for k, op := range adds {
		if op.Err != nil {
			t.Fatalf("add %d of %d bytes: %v", k, len(op.Value), op.Err)
		}
	}
	gets := make([]ValueOp, n)
	for k := range gets {
		gets[k] = ValueOp{Kind: ValueGets, Key: base + uint64(k)}
	}
	c.DoValues(ctx, gets)
	var mixed []ValueOp
	for k, op := range gets {
		if op.Err != nil || !bytes.Equal(op.Value, adds[k].Value) {
			t.Fatalf("gets %d: got %d bytes, %v, want %d", k, len(op.Value), op.Err, len(adds[k].Value))
		}
		key := base + uint64(k)
		mixed = append(mixed,
			ValueOp{Kind: ValueCAS, Key: key, Value: largeValue(key, "b", size(k+1)), CAS: op.CAS, TTL: time.Minute},
			ValueOp{Kind: ValueGets, Key: key},
			ValueOp{Kind: ValueAdd, Key: key + n, Value: largeValue(key+n, "a", size(k+2)), TTL: time.Minute})
	}
	c.DoValues(ctx, mixed)
	for j := 0; j < len(mixed); j += 3 {
		cas, get, add := mixed[j], mixed[j+1], mixed[j+2]
		if cas.Err != nil || add.Err != nil || get.Err != nil || !bytes.Equal(get.Value, cas.Value) {
			t.Fatalf("key %d: cas %v, add %v, gets after the cas: %d bytes, %v, want the %d bytes swapped in",
				j/3, cas.Err, add.Err, len(get.Value), get.Err, len(cas.Value))
		}
	}
	all := make([]ValueOp, 2*n)
	for k := range all {
		all[k] = ValueOp{Kind: ValueGets, Key: base + uint64(k)}
	}
	c.DoValues(ctx, all)
	for k, op := range all {
		want := mixed[3*(k%n)].Value
		if k >= n {
			want = mixed[3*(k-n)+2].Value
		}
		if op.Err != nil || !bytes.Equal(op.Value, want) {
			t.Fatalf("final gets %d: got %d bytes, %v, want %d", k, len(op.Value), op.Err, len(want))
		}
	}
}

// TestValueRoundsBounded plans batches of value ops of every size and
// checks the rounds: at most maxValueRoundOps ops and maxValueRoundBytes of
// request each (or one op), in the call's order; then runs one on a real
// memcached through a connection that records its writes: one write per
// round, none past the bound.
func TestValueRoundsBounded(t *testing.T) {
	ps := startShards(t, 1)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ring := c.Ring()
	sizes := []int{MaxValueLen, 0, 12 << 10, 17, MaxValueLen, MaxValueLen, MaxValueLen, MaxValueLen, 100, 3000}
	var ops []ValueOp
	for k := range 200 {
		key := uint64(k % 50) // repeats: ops on one key stay in order
		switch k % 3 {
		case 0:
			ops = append(ops, ValueOp{Kind: ValueGets, Key: key})
		case 1:
			ops = append(ops, ValueOp{Kind: ValueAdd, Key: key, Value: largeValue(key, "a", sizes[k%len(sizes)]), TTL: time.Minute})
		default:
			ops = append(ops, ValueOp{Kind: ValueCAS, Key: key, CAS: 1, Value: largeValue(key, "b", sizes[(k+3)%len(sizes)]), TTL: time.Minute})
		}
	}
	b := getBatch()
	defer b.release()
	b.ctx, b.parent = context.Background(), context.Background()
	b.planValues(c, ring, ops)
	if len(b.units) != 1 {
		t.Fatalf("got %d units, want 1", len(b.units))
	}
	order := b.order[b.units[0].lo:b.units[0].hi]
	wantRounds := 0
	for j := 0; j < len(order); {
		phase := b.ops[order[j]].phase
		if j > 0 && phase != b.ops[order[j-1]].phase+1 {
			t.Fatalf("op %d: phase %d after %d, want one more", j, phase, b.ops[order[j-1]].phase)
		}
		n, req := 0, 0
		for ; j < len(order) && b.ops[order[j]].phase == phase; j++ {
			if j > 0 && order[j] < order[j-1] {
				t.Fatalf("ops out of the call's order: %d after %d", order[j], order[j-1])
			}
			st := &b.ops[order[j]]
			if st.kind == kindGets {
				req += getsCommandLen
			} else {
				req += valueCommandLen + int(st.valEnd-st.valAt)
			}
			n++
		}
		if n > maxValueRoundOps || n > 1 && req > maxValueRoundBytes {
			t.Fatalf("round %d: %d ops, %d bytes of request, want at most %d and %d", phase, n, req, maxValueRoundOps, maxValueRoundBytes)
		}
		wantRounds++
	}

	nc, err := net.Dial("tcp", ps[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rc := &recordConn{Conn: nc}
	x := exchange{b: b, pc: &pconn{nc: rc, r: bufio.NewReaderSize(rc, readBufSize)}, addr: ps[0].Addr, timeout: slow}
	if err := x.run(order); err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(rc.writes) != wantRounds {
		t.Errorf("got %d writes, want one per round, %d", len(rc.writes), wantRounds)
	}
	for j, n := range rc.writes {
		if n > maxValueRoundBytes+valueCommandLen+MaxValueLen+len(endCommand) {
			t.Errorf("write %d: %d bytes, more than a round may hold", j, n)
		}
	}
	for _, i := range order {
		if st := &b.ops[i]; !st.done {
			t.Fatalf("op %d: no outcome", i)
		}
	}
	t.Logf("%d ops in %d rounds, writes of %v bytes", len(order), wantRounds, rc.writes)
}

// recordConn records the length of each write.
type recordConn struct {
	net.Conn
	mu     sync.Mutex
	writes []int
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, len(p))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// TestLargeValueReplies reads a VALUE longer than the read buffer from a
// replayed stream, whole or truncated.
func TestLargeValueReplies(t *testing.T) {
	c, err := New(Config{Servers: []Server{{Addr: "127.0.0.1:1"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := valueKey(1)
	data := largeValue(1, "x", 3*readBufSize+5)
	whole := fmt.Sprintf("VALUE %s 0 %d 7\r\n%s\r\nEND\r\nVERSION 1.6\r\n", k, len(data), data)
	for _, tt := range []struct {
		name, replies string
		ok            bool
	}{
		{"whole", whole, true},
		{"truncated", whole[:len(whole)/2], false},
		{"no end of block", strings.Replace(whole, string(data)+"\r\n", string(data)+"xx", 1), false},
		{"end of block cut", fmt.Sprintf("VALUE %s 0 %d 7\r\n%s\r", k, len(data), data), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := getBatch()
			defer b.release()
			b.ctx, b.parent = context.Background(), context.Background()
			ops := []ValueOp{{Kind: ValueGets, Key: 1}}
			b.planValues(c, c.Ring(), ops)
			conn := &replayConn{r: strings.NewReader(tt.replies)}
			x := exchange{b: b, pc: &pconn{nc: conn, r: bufio.NewReaderSize(conn, readBufSize)}, addr: "shard", timeout: time.Second}
			err := x.run(b.order[b.units[0].lo:b.units[0].hi])
			st := &b.ops[0]
			if !tt.ok {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("got %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil || !st.done || st.err != nil || st.cas != 7 {
				t.Fatalf("got %v, done %v, op error %v, cas %d, want the value and cas 7", err, st.done, st.err, st.cas)
			}
			if got := b.outs[0][st.valAt:st.valEnd]; !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes, not the %d sent", len(got), len(data))
			}
		})
	}
}
