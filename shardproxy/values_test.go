package shardproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func valueKey(key uint64) string { return string(AppendValueKey(nil, key)) }

func TestValueKey(t *testing.T) {
	ring := mustRing(t, testServers(7), HashFNV1a64, "{}")
	rng := rand.New(rand.NewPCG(31, 32))
	for range 10_000 {
		k := rng.Uint64()
		vk := AppendValueKey(nil, k)
		if len(vk) != ValueKeyLen || !legalKeyForGomemcache(string(vk)) || !bytes.HasPrefix(vk, []byte("pv:{")) {
			t.Fatalf("AppendValueKey(%x): got %q, want %d legal bytes starting pv:{", k, vk, ValueKeyLen)
		}
		if got, want := ring.Lookup(vk), ring.Lookup(AppendCounterKey(nil, k, rng.Int64())); got != want {
			t.Fatalf("key %x: value on shard %d, counters on shard %d, want the same", k, got, want)
		}
	}
	if got, want := valueKey(0x5eed), "pv:{0000000000005eed}"; got != want {
		t.Errorf("AppendValueKey(0x5eed): got %q, want %q", got, want)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		var buf [ValueKeyLen]byte
		AppendValueKey(buf[:0], 42)
	}); allocs != 0 {
		t.Errorf("AppendValueKey into a buffer with room: got %v allocations, want 0", allocs)
	}
}

// TestValues goes through every answer of Gets, Add and CompareAndSwap on
// three real memcached shards, with the TTLs they set.
func TestValues(t *testing.T) {
	ps := startShards(t, 3)
	reg := prometheus.NewRegistry()
	c, err := New(Config{Servers: serversOf(ps), Timeout: slow}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const key = 0xabcdef
	addr := ps[c.Ring().Lookup(AppendValueKey(nil, key))].Addr

	if v, cas, err := c.Gets(ctx, key); !errors.Is(err, ErrNotFound) || len(v) != 0 || cas != 0 {
		t.Fatalf("Gets of a missing value: got %q, %d, %v, want empty, 0, ErrNotFound", v, cas, err)
	}
	if err := c.CompareAndSwap(ctx, key, []byte("x"), 1, time.Minute); !errors.Is(err, ErrNotFound) {
		t.Errorf("CompareAndSwap of a missing value: got %v, want ErrNotFound", err)
	}
	// Any bytes, up to MaxValueLen, including what looks like a reply.
	first := append([]byte("\r\nEND\r\nVALUE x 0 1\r\n\x00"), bytes.Repeat([]byte{0xff}, MaxValueLen-21)...)
	if err := c.Add(ctx, key, first, 90*time.Second); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if ttl := ttlOf(t, addr, valueKey(key)); ttl != 90 && ttl != 89 {
		t.Errorf("TTL after Add: got %d, want 90", ttl)
	}
	if err := c.Add(ctx, key, []byte("second"), time.Minute); !errors.Is(err, ErrExists) {
		t.Errorf("Add of an existing value: got %v, want ErrExists", err)
	}
	v, cas, err := c.Gets(ctx, key)
	if err != nil || !bytes.Equal(v, first) || cas == 0 {
		t.Fatalf("Gets: got %d bytes, %d, %v, want the %d bytes added and a token", len(v), cas, err, len(first))
	}
	if err := c.CompareAndSwap(ctx, key, []byte("swapped"), cas, 30*time.Second); err != nil {
		t.Fatalf("CompareAndSwap with the token: %v", err)
	}
	if ttl := ttlOf(t, addr, valueKey(key)); ttl != 30 && ttl != 29 {
		t.Errorf("TTL after CompareAndSwap: got %d, want 30", ttl)
	}
	if err := c.CompareAndSwap(ctx, key, []byte("stale"), cas, time.Minute); !errors.Is(err, ErrCASConflict) {
		t.Errorf("CompareAndSwap with a used token: got %v, want ErrCASConflict", err)
	}
	v2, cas2, err := c.Gets(ctx, key)
	if err != nil || string(v2) != "swapped" || cas2 == cas {
		t.Errorf("Gets after the swap: got %q, %d, %v, want \"swapped\" and a new token", v2, cas2, err)
	}
	if err := c.CompareAndSwap(ctx, key, nil, cas2, time.Minute); err != nil {
		t.Errorf("CompareAndSwap to an empty value: %v", err)
	}
	if v, _, err := c.Gets(ctx, key); err != nil || len(v) != 0 {
		t.Errorf("Gets of an empty value: got %q, %v, want empty, nil", v, err)
	}
	_, cas3, _ := c.Gets(ctx, key)
	if r := command(t, addr, "delete "+valueKey(key)); r != "DELETED" {
		t.Fatalf("delete: got %q", r)
	}
	if err := c.CompareAndSwap(ctx, key, []byte("gone"), cas3, time.Minute); !errors.Is(err, ErrNotFound) {
		t.Errorf("CompareAndSwap of a deleted value: got %v, want ErrNotFound", err)
	}

	// Values and counters of one key do not collide.
	if _, err := c.Incr(ctx, key, 0, 5, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(ctx, key, []byte("7"), time.Minute); err != nil {
		t.Errorf("Add beside a counter of the same key: %v", err)
	}
	if got, err := c.Get(ctx, key, 0); err != nil || got[0] != 5 {
		t.Errorf("the counter after Add of the same key: got %v, %v, want 5", got, err)
	}

	// Rejected before any round trip.
	for _, tt := range []struct {
		name string
		op   ValueOp
		want string
	}{
		{"value too long", ValueOp{Kind: ValueAdd, Key: 1, Value: make([]byte, MaxValueLen+1)}, "longer than MaxValueLen"},
		{"TTL over 30 days", ValueOp{Kind: ValueCAS, Key: 1, CAS: 1, TTL: 31 * 24 * time.Hour}, "30-day"},
		{"unknown kind", ValueOp{Kind: 9, Key: 1}, "not a ValueKind"},
	} {
		ops := []ValueOp{tt.op}
		c.DoValues(ctx, ops)
		if ops[0].Err == nil || !strings.Contains(ops[0].Err.Error(), tt.want) || !strings.HasPrefix(ops[0].Err.Error(), "shardproxy: ") {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, ops[0].Err, tt.want)
		}
	}

	for _, tt := range []struct {
		op, result string
		want       float64
	}{
		{"gets", "miss", 1}, {"gets", "ok", 4}, {"add", "ok", 2}, {"add", "conflict", 1}, {"add", "error", 1},
		{"cas", "ok", 2}, {"cas", "miss", 2}, {"cas", "conflict", 1}, {"cas", "error", 1},
	} {
		if got := testutil.ToFloat64(c.m.opsVec.WithLabelValues(tt.op, tt.result)); got != tt.want {
			t.Errorf("ops_total{op=%q,result=%q}: got %v, want %v", tt.op, tt.result, got, tt.want)
		}
	}
	for i := range ps {
		if got := c.shards[i].fails.Load(); got != 0 || !c.Ring().IsLive(i) {
			t.Errorf("shard %d after answers: got %d failures, live %v, want 0, true", i, got, c.Ring().IsLive(i))
		}
	}
}

// TestCompareAndSwapRace has two goroutines read one value, then both
// swap it with the token they read, fifty times: exactly one wins each
// time, and the other gets ErrCASConflict.
func TestCompareAndSwapRace(t *testing.T) {
	ps := startShards(t, 2)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()
	const key, rounds = 77, 50
	if err := c.Add(ctx, key, []byte("0"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		var read, swapped sync.WaitGroup
		read.Add(2)
		errs := make([]error, 2)
		for g := range 2 {
			swapped.Go(func() {
				v, cas, err := c.Gets(ctx, key)
				read.Done()
				if err != nil {
					errs[g] = err
					return
				}
				read.Wait() // both hold the same token
				n, _ := strconv.Atoi(string(v))
				errs[g] = c.CompareAndSwap(ctx, key, []byte(strconv.Itoa(n+1)), cas, time.Minute)
			})
		}
		swapped.Wait()
		won, lost := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case errors.Is(err, ErrCASConflict):
				lost++
			default:
				t.Fatalf("round %d: got %v, want nil or ErrCASConflict", round, err)
			}
		}
		if won != 1 || lost != 1 {
			t.Fatalf("round %d: got %d swaps won and %d lost, want exactly 1 and 1", round, won, lost)
		}
	}
	if v, _, err := c.Gets(ctx, key); err != nil || string(v) != strconv.Itoa(rounds) {
		t.Errorf("after %d rounds: got %q, %v, want %d (one swap won per round)", rounds, v, err, rounds)
	}
}

// TestCompareAndSwapIncrements has eight goroutines add one to a shared
// value 25 times each by read-modify-write, retrying lost races: no
// increment is lost.
func TestCompareAndSwapIncrements(t *testing.T) {
	ps := startShards(t, 1)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()
	const goroutines, each, key = 8, 25, 99
	var wg sync.WaitGroup
	var mu sync.Mutex
	conflicts := 0
	for range goroutines {
		wg.Go(func() {
			for range each {
				for {
					v, cas, err := c.Gets(ctx, key)
					if errors.Is(err, ErrNotFound) {
						if err = c.Add(ctx, key, []byte("1"), time.Minute); err == nil {
							break
						}
					} else if err == nil {
						n, _ := strconv.Atoi(string(v))
						if err = c.CompareAndSwap(ctx, key, []byte(strconv.Itoa(n+1)), cas, time.Minute); err == nil {
							break
						}
					}
					if !errors.Is(err, ErrCASConflict) && !errors.Is(err, ErrExists) {
						t.Error(err)
						return
					}
					mu.Lock()
					conflicts++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	v, _, err := c.Gets(ctx, key)
	if err != nil || string(v) != strconv.Itoa(goroutines*each) {
		t.Errorf("after %d increments: got %q, %v, want %d", goroutines*each, v, err, goroutines*each)
	}
	t.Logf("%d races lost and retried", conflicts)
}

// TestDoValuesBatch runs batches of value ops over three real shards,
// more than one round and more than one pipeline per shard: adds, gets,
// swaps with the tokens read, and gets again.
func TestDoValuesBatch(t *testing.T) {
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	ctx := context.Background()
	for _, n := range []int{90, 2000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			base := uint64(n) << 32
			value := func(k int, gen string) []byte {
				return []byte(fmt.Sprintf("%s-%d-%s", gen, k, strings.Repeat("x", k%300)))
			}
			ops := make([]ValueOp, n)
			for k := range ops {
				ops[k] = ValueOp{Kind: ValueAdd, Key: base + uint64(k), Value: value(k, "a"), TTL: time.Minute}
			}
			c.DoValues(ctx, ops)
			for k, op := range ops {
				if op.Err != nil {
					t.Fatalf("add %d: %v", k, op.Err)
				}
			}
			gets := make([]ValueOp, n)
			for k := range gets {
				gets[k] = ValueOp{Kind: ValueGets, Key: base + uint64(k)}
			}
			c.DoValues(ctx, gets)
			cas := make([]ValueOp, n)
			for k, op := range gets {
				if op.Err != nil || !bytes.Equal(op.Value, value(k, "a")) {
					t.Fatalf("gets %d: got %q, %v, want %q", k, op.Value, op.Err, value(k, "a"))
				}
				cas[k] = ValueOp{Kind: ValueCAS, Key: op.Key, Value: value(k, "b"), CAS: op.CAS, TTL: time.Minute}
			}
			c.DoValues(ctx, cas)
			for k, op := range cas {
				if op.Err != nil {
					t.Fatalf("cas %d: %v", k, op.Err)
				}
			}
			c.DoValues(ctx, gets) // reusing the ops and their arrays
			for k, op := range gets {
				if op.Err != nil || !bytes.Equal(op.Value, value(k, "b")) {
					t.Fatalf("gets %d after cas: got %q, %v, want %q", k, op.Value, op.Err, value(k, "b"))
				}
			}
		})
	}
	// Ops on one key in one call take effect in order.
	ops := []ValueOp{
		{Kind: ValueGets, Key: 5},
		{Kind: ValueAdd, Key: 5, Value: []byte("one"), TTL: time.Minute},
		{Kind: ValueGets, Key: 5},
		{Kind: ValueAdd, Key: 5, Value: []byte("two"), TTL: time.Minute},
		{Kind: ValueGets, Key: 5},
	}
	c.DoValues(ctx, ops)
	if !errors.Is(ops[0].Err, ErrNotFound) || ops[1].Err != nil || string(ops[2].Value) != "one" || !errors.Is(ops[3].Err, ErrExists) || string(ops[4].Value) != "one" {
		t.Errorf("ops on one key: got %v; %v; %q, %v; %v; %q, %v, want not found, added, one, exists, one",
			ops[0].Err, ops[1].Err, ops[2].Value, ops[2].Err, ops[3].Err, ops[4].Value, ops[4].Err)
	}
}

// TestValuesHungShard: value ops on a hung shard time out within Timeout
// and count against its health, as counters do.
func TestValuesHungShard(t *testing.T) {
	const timeout = 100 * time.Millisecond
	c := newClient(t, Config{Servers: []Server{{Addr: hungServer(t)}}, Timeout: timeout, FailureLimit: 2, RetryTimeout: time.Minute})
	ctx := context.Background()
	for i := range 2 {
		begin := time.Now()
		_, _, err := c.Gets(ctx, 1)
		if elapsed := time.Since(begin); !errors.Is(err, ErrTimeout) || elapsed > timeout+DefaultBatchGrace+100*time.Millisecond {
			t.Fatalf("Gets %d on a hung shard: got %v after %v, want ErrTimeout within about %v", i, err, elapsed, timeout)
		}
	}
	if err := c.Add(ctx, 1, []byte("x"), time.Minute); !errors.Is(err, ErrNoServers) {
		t.Errorf("Add after FailureLimit timeouts: got %v, want ErrNoServers (the shard ejected)", err)
	}
}

// TestDoValuesAllocs checks that a batch of gets hits and swaps reusing
// its ops allocates a few objects per call, none per op.
func TestDoValuesAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	ps := startShards(t, 3)
	c := newClient(t, Config{Servers: serversOf(ps), Timeout: slow})
	allocs := func(n int) float64 {
		base := uint64(n) << 40
		ops := make([]ValueOp, n)
		for k := range ops {
			ops[k] = ValueOp{Kind: ValueAdd, Key: base + uint64(k), Value: []byte("0123456789"), TTL: time.Minute}
		}
		c.DoValues(context.Background(), ops)
		gets := make([]ValueOp, n)
		for k := range gets {
			gets[k] = ValueOp{Kind: ValueGets, Key: base + uint64(k), Value: make([]byte, 0, 16)}
		}
		cas := make([]ValueOp, n)
		return testing.AllocsPerRun(20, func() {
			c.DoValues(context.Background(), gets)
			for k, op := range gets {
				if op.Err != nil {
					t.Fatal(op.Err)
				}
				cas[k] = ValueOp{Kind: ValueCAS, Key: op.Key, Value: op.Value, CAS: op.CAS, TTL: time.Minute}
			}
			c.DoValues(context.Background(), cas)
			for _, op := range cas {
				if op.Err != nil {
					t.Fatal(op.Err)
				}
			}
		})
	}
	small, large := allocs(10), allocs(300)
	t.Logf("allocations per gets and cas calls: %v for 10 keys, %v for 300", small, large)
	if large > small+8 || large > 48 {
		t.Errorf("allocations: got %v for 300 keys and %v for 10, want a few per call, none per op", large, small)
	}
}

// FuzzValueReplies feeds arbitrary reply streams to a pipeline of a gets,
// an add and a cas: never a panic, every op ends with an outcome or the
// stream's error, of the kinds the package reports, and a value read is
// at most MaxValueLen bytes.
func FuzzValueReplies(f *testing.F) {
	c, err := New(Config{Servers: []Server{{Addr: "127.0.0.1:1"}}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	ring := c.Ring()
	ops := []ValueOp{{Kind: ValueGets, Key: 1}, {Kind: ValueAdd, Key: 2, Value: []byte("v"), TTL: time.Minute}, {Kind: ValueCAS, Key: 3, Value: []byte("w"), CAS: 9, TTL: time.Minute}}
	k1 := valueKey(1)
	f.Add([]byte("VALUE " + k1 + " 0 3 42\r\nabc\r\nEND\r\nSTORED\r\nSTORED\r\nVERSION 1.6\r\n"))
	f.Add([]byte("END\r\nNOT_STORED\r\nEXISTS\r\nVERSION 1.6\r\n"))
	f.Add([]byte("END\r\nSTORED\r\nNOT_FOUND\r\nVERSION 1.6\r\n"))
	f.Add([]byte("VALUE " + k1 + " 0 3\r\nabc\r\nEND\r\nSTORED\r\nSTORED\r\nVERSION 1.6\r\n"))
	f.Add([]byte("VALUE " + k1 + " 0 1025 1\r\n"))
	f.Add([]byte("VALUE pv:{0}} 0 1 1\r\na\r\nEND\r\n"))
	f.Add([]byte("VALUE " + k1 + " 0 1 1\r\na\r\nVALUE " + k1 + " 0 1 1\r\na\r\nEND\r\n"))
	f.Add([]byte("END\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\nVERSION 1\r\n"))
	f.Add([]byte("END\r\nSTORED\r\nSTORED\r\nSTORED\r\nVERSION 1\r\n"))
	f.Fuzz(func(t *testing.T, replies []byte) {
		b := getBatch()
		defer b.release()
		b.ctx, b.parent = context.Background(), context.Background()
		batch := append([]ValueOp(nil), ops...)
		b.planValues(c, ring, batch)
		if len(b.units) != 1 || !b.units[0].pipe {
			t.Fatalf("got units %+v, want one pipeline", b.units)
		}
		conn := &replayConn{r: bytes.NewReader(replies)}
		x := exchange{b: b, pc: &pconn{nc: conn, r: bufio.NewReaderSize(conn, readBufSize)}, addr: "shard", timeout: time.Second}
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
			st := &b.ops[i]
			if !st.done {
				t.Fatalf("op %d: no outcome after a clean run", i)
			}
			if st.err == nil && st.kind == kindGets && st.valEnd-st.valAt > MaxValueLen {
				t.Fatalf("gets read %d bytes, more than MaxValueLen", st.valEnd-st.valAt)
			}
		}
	})
}
