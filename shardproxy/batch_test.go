package shardproxy

import (
	"testing"
	"time"
)

func TestPlanGroupsReadsPerShard(t *testing.T) {
	c := newClient(t, Config{Servers: testServers(4)})
	ring := c.Ring()
	var ops []Op
	shards := map[int]int{}
	for k := range uint64(300) {
		for _, start := range []int64{0, 60_000} {
			ops = append(ops, Op{Key: k, Start: start})
			shards[ring.Lookup(AppendCounterKey(nil, k, start))]++
		}
	}
	ops = append(ops, Op{Key: 1, Start: 0, Delta: 1, TTL: time.Second}, Op{Key: 2, Start: 0, Delta: -1})
	b := getBatch()
	defer b.release()
	b.plan(c, ring, ops)
	var reads, writes int
	perShard := map[int]int{}
	for _, un := range b.units {
		n := 0
		for _, i := range b.order[un.lo:un.hi] {
			if got := ring.Lookup(b.key(i)); got != int(un.shard) {
				t.Errorf("op %d: in a unit of shard %d, want shard %d", i, un.shard, got)
			}
			if b.ops[i].kind == kindGet {
				n++
			} else {
				writes++
			}
		}
		perShard[int(un.shard)] += n
		reads += (n + maxKeysPerGet - 1) / maxKeysPerGet // multi-gets the unit sends
	}
	wantReads := 0
	for s, n := range shards {
		wantReads += (n + maxKeysPerGet - 1) / maxKeysPerGet
		if perShard[s] != n {
			t.Errorf("shard %d: got %d keys read, want %d", s, perShard[s], n)
		}
	}
	if reads != wantReads || writes != 2 {
		t.Errorf("got %d multi-gets and %d writes, want %d multi-gets (one per shard per %d keys) and 2", reads, writes, wantReads, maxKeysPerGet)
	}
}

func TestTTLSeconds(t *testing.T) {
	tests := []struct {
		ttl     time.Duration
		want    int32
		wantErr bool
	}{
		{0, 1, false}, {-time.Second, 1, false}, {time.Nanosecond, 1, false}, {time.Second, 1, false},
		{time.Second + 1, 2, false}, {2 * time.Minute, 120, false}, {30 * 24 * time.Hour, 2592000, false},
		{30*24*time.Hour + 1, 0, true},
	}
	for _, tt := range tests {
		got, err := ttlSeconds(tt.ttl)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ttlSeconds(%v): got %d, %v, want %d, error %v", tt.ttl, got, err, tt.want, tt.wantErr)
		}
	}
}
