package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// TestCluster runs the Store over a real three-master Redis Cluster reached
// through the address of one node (TopologyAuto finds the cluster): counters match
// store.MemStore across batches that span every node, a key's windows,
// bucket and log share one slot, the scripts work on every node and come
// back after a SCRIPT FLUSH on one of them, and when a master is killed
// only its keys fail, within Timeout, while the others' keep answering.
func TestCluster(t *testing.T) {
	nodes := startCluster(t, 3)
	s, _ := newStore(t, Config{Addrs: []string{nodes[0].Addr}, Timeout: 500 * time.Millisecond})
	if c, err := s.client(kindGet); err != nil || c.Mode() != "cluster" {
		t.Fatalf("client mode: got %v, %v; want cluster", c, err)
	}
	ctx := context.Background()
	mem := store.NewMemStore(nil)
	r := rand.New(rand.NewPCG(9, 10))
	keys := make([]uint64, 64)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	for batch := range 50 {
		ops := make([]store.Op, 1+r.IntN(100))
		for i := range ops {
			ops[i] = store.Op{Key: keys[r.IntN(len(keys))], Start: int64(r.IntN(2)) * 60_000, TTL: time.Minute}
			if d := r.IntN(3); d > 0 {
				ops[i].Delta = int64(3 - 2*d) // +1 or -1
			}
		}
		want := append([]store.Op(nil), ops...)
		mem.Do(ctx, want)
		s.Do(ctx, ops)
		for i := range ops {
			if ops[i].Err != nil || ops[i].Value != want[i].Value {
				t.Fatalf("batch %d op %d %+v: got %d, %v, want %d", batch, i, ops[i], ops[i].Value, ops[i].Err, want[i].Value)
			}
		}
	}

	// Where the keys went: every node holds some, and one key's keys share a slot.
	for _, n := range nodes {
		if got, _ := strconv.Atoi(cli(t, n.Addr, "dbsize")); got == 0 {
			t.Errorf("node %s holds no counter of 64 keys", n.Addr)
		}
	}
	k := keys[0]
	names := []string{fmtKey(k, 0), fmtKey(k, 60_000), string(AppendGCRAKey(nil, k)),
		string(appendTag(nil, k)) + ":log", string(appendTag(nil, k)) + ":logm"}
	slot := ""
	for _, name := range names {
		got := cli(t, nodes[0].Addr, "cluster", "keyslot", name)
		if slot != "" && got != slot {
			t.Errorf("CLUSTER KEYSLOT %s: got %s, want %s like the key's other keys", name, got, slot)
		}
		slot = got
	}

	params := GCRAParams{Rate: 10, Per: time.Second, Capacity: 5}
	gops := make([]GCRAOp, len(keys))
	lops := make([]SlidingLogOp, len(keys))
	for round := range 3 {
		if round == 2 {
			for _, n := range nodes {
				cli(t, n.Addr, "script", "flush")
			}
		}
		for i, k := range keys {
			gops[i] = GCRAOp{Key: k, Params: params, Now: 1e18 + int64(round), N: 2, Conditional: true}
			lops[i] = SlidingLogOp{Key: k, Params: SlidingLogParams{Limit: 5, Window: time.Minute}, Now: 1e18 + int64(round), N: 2, Conditional: true}
		}
		s.GCRABatch(ctx, gops)
		s.SlidingLogBatch(ctx, lops)
		for i := range keys {
			wantOK := round < 2 // 2 + 2 fit in 5, a third 2 does not
			if gops[i].Err != nil || gops[i].Result.Allowed != wantOK || lops[i].Err != nil || lops[i].Result.Allowed != wantOK {
				t.Fatalf("round %d key %d: gcra %+v %v, log %+v %v; want allowed %v",
					round, i, gops[i].Result, gops[i].Err, lops[i].Result, lops[i].Err, wantOK)
			}
		}
	}

	// A master dies: its keys fail, the others answer.
	victim := nodes[2]
	victimKeys := map[uint64]bool{}
	for _, k := range keys {
		slot := cli(t, nodes[0].Addr, "cluster", "keyslot", fmtKey(k, 0))
		if nodeOf(t, nodes[0].Addr, slot) == victim.Addr {
			victimKeys[k] = true
		}
	}
	if len(victimKeys) == 0 || len(victimKeys) == len(keys) {
		t.Fatalf("the victim holds %d of %d keys; want some", len(victimKeys), len(keys))
	}
	victim.Kill()
	ops := make([]store.Op, len(keys))
	for i, k := range keys {
		ops[i] = store.Op{Key: k, Start: 0}
	}
	start := time.Now()
	s.Do(ctx, ops)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Do with a dead master: took %v, want it ended by the 500ms timeout, not hung", took)
	}
	for i, op := range ops {
		dead := victimKeys[keys[i]]
		if dead && !errors.Is(op.Err, ErrUnavailable) && !errors.Is(op.Err, ErrTimeout) {
			t.Errorf("key %d on the dead master: got %v, want ErrUnavailable or ErrTimeout", i, op.Err)
		}
		if !dead && op.Err != nil {
			t.Errorf("key %d on a live master: got %v, want an answer", i, op.Err)
		}
	}
	if !s.Healthy() {
		t.Errorf("Healthy with two of three masters: got false, want true")
	}
}

// nodeOf returns the address of the master serving slot, from CLUSTER
// NODES as seen by the node at addr.
func nodeOf(t *testing.T, addr, slot string) string {
	t.Helper()
	n, err := strconv.Atoi(slot)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(cli(t, addr, "cluster", "nodes"), "\n")
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		for _, rng := range f[8:] {
			lo, hi, ok := strings.Cut(rng, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && a <= n && n <= b {
				host, _, _ := strings.Cut(f[1], "@")
				return host
			}
		}
	}
	t.Fatalf("no master serves slot %d", n)
	return ""
}
