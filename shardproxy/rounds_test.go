package shardproxy

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOutOfStepRoundKeepsConfirmedOps puts round 2 (the adds of the
// increments that missed) or round 3 (the incrs of the adds that lost a
// race) of a pipeline out of step, through a relay in front of a real
// memcached. The increments memcached confirmed in round 1 keep their
// values: failing them would make the caller send them again and count
// them twice. Only the ops of the broken round fail.
func TestOutOfStepRoundKeepsConfirmedOps(t *testing.T) {
	tests := []struct {
		name  string
		round int
		race  bool
		want  uint64 // what memcached holds for a new counter afterwards
	}{
		{"round 2, the adds", 2, false, 3},
		{"round 3, the incrs after a lost add race", 3, true, 103},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := startShards(t, 1)
			addr := ps[0].Addr
			start := int64(n) * 60_000
			existing := []uint64{11, 12, 13, 14}
			fresh := []uint64{21, 22, 23}
			for _, k := range existing {
				if r := command(t, addr, "set "+counterKey(k, start)+" 0 60 2\r\n40"); r != "STORED" {
					t.Fatalf("set: got %q, want STORED", r)
				}
			}
			c := newClient(t, Config{Servers: []Server{{Addr: skewRelay(t, addr, tt.round, tt.race)}}, Timeout: slow, FailureLimit: 1000})
			var ops []Op
			for _, k := range existing {
				ops = append(ops, Op{Key: k, Start: start, Delta: 2, TTL: time.Minute})
			}
			for _, k := range fresh {
				ops = append(ops, Op{Key: k, Start: start, Delta: 3, TTL: time.Minute})
			}
			c.Do(context.Background(), ops)
			for i, op := range ops {
				if i < len(existing) {
					if op.Err != nil || op.Value != 42 {
						t.Errorf("confirmed incr of key %d: got %d, %v, want 42, nil", op.Key, op.Value, op.Err)
					}
					continue
				}
				if !errors.Is(op.Err, ErrMalformed) || op.Value != 0 {
					t.Errorf("incr of new key %d in the broken round: got %d, %v, want 0, ErrMalformed", op.Key, op.Value, op.Err)
				}
			}
			// memcached counted each confirmed increment once.
			for _, k := range existing {
				if got := getAll(t, addr, []string{counterKey(k, start)})[counterKey(k, start)]; strings.TrimSpace(got) != "42" {
					t.Errorf("key %d in memcached: got %q, want 42", k, got)
				}
			}
			for _, k := range fresh {
				got := getAll(t, addr, []string{counterKey(k, start)})[counterKey(k, start)]
				if strings.TrimSpace(got) != strconv.FormatUint(tt.want, 10) {
					t.Errorf("new key %d in memcached: got %q, want %d", k, got, tt.want)
				}
			}
			// The next call goes on a new connection, which the relay spares.
			again := []Op{{Key: existing[0], Start: start, Delta: 1, TTL: time.Minute}, {Key: fresh[0], Start: start}}
			c.Do(context.Background(), again)
			if again[0].Err != nil || again[0].Value != 43 || again[1].Err != nil || again[1].Value != tt.want {
				t.Errorf("next call: got %d, %v and %d, %v, want 43, nil and %d, nil", again[0].Value, again[0].Err, again[1].Value, again[1].Err, tt.want)
			}
		})
	}
}
