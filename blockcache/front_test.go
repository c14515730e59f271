package blockcache

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sameSlot returns n keys that share a front slot.
func sameSlot(n int) []uint64 {
	var keys []uint64
	want := slot(1)
	for k := uint64(1); len(keys) < n; k++ {
		if slot(k) == want {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestFrontSlotSharedByKeys blocks two keys of one slot: the later one owns
// the slot and the earlier is still found (through ristretto); an Unblock of
// either leaves the other blocked.
func TestFrontSlotSharedByKeys(t *testing.T) {
	c, err := New(Config{MaxEntries: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := time.Now().UnixNano()
	ks := sameSlot(2)
	a, b := ks[0], ks[1]
	ra, rb := now+int64(time.Minute), now+int64(time.Second)
	c.Block(a, ra, now)
	c.Block(b, rb, now)
	c.Wait()
	f := &c.front[slot(a)]
	if got, ok := f.own(b, now); !ok || got != rb {
		t.Fatalf("slot's own key: own(b) = %d, %v; want %d", got, ok, rb)
	}
	if f.max.Load() != ra {
		t.Fatalf("slot max = %d, want the later release %d", f.max.Load(), ra)
	}
	for _, tc := range []struct {
		key uint64
		at  int64
		rel int64
		ok  bool
	}{{a, now, ra, true}, {b, now, rb, true}, {b, rb, 0, false}, {a, rb, ra, true}, {a, ra, 0, false}} {
		if got, ok := c.Blocked(tc.key, tc.at); ok != tc.ok || got != tc.rel {
			t.Errorf("Blocked(%d, +%v) = %d, %v; want %d, %v", tc.key, time.Duration(tc.at-now), got, ok, tc.rel, tc.ok)
		}
	}
	c.Unblock(b)
	c.Wait()
	if _, ok := c.Blocked(b, now); ok {
		t.Error("b blocked after Unblock")
	}
	if got, ok := c.Blocked(a, now); !ok || got != ra {
		t.Errorf("a after b's Unblock: %d, %v; want %d", got, ok, ra)
	}
	c.Block(b, rb, now)
	c.Unblock(a)
	c.Wait()
	if _, ok := c.Blocked(a, now); ok {
		t.Error("a blocked after Unblock")
	}
	if got, ok := c.Blocked(b, now); !ok || got != rb {
		t.Errorf("b after a's Unblock: %d, %v; want %d", got, ok, rb)
	}
}

// TestFrontSlotNeverMixesKeys has writers block and unblock keys of one
// slot, each always with its own release time, while readers look them up:
// a lookup must answer a key's own release or a miss, never another key's.
func TestFrontSlotNeverMixesKeys(t *testing.T) {
	c, err := New(Config{MaxEntries: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := time.Now().UnixNano()
	keys := sameSlot(4)
	rel := func(k uint64) int64 { return now + int64(k)*int64(time.Millisecond) + 1 }
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := keys[(i+w)%len(keys)]
				if i%3 == 0 {
					c.Unblock(k)
				} else {
					c.Block(k, rel(k), now)
				}
			}
		})
	}
	var bad atomic.Int64
	for range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := keys[i%len(keys)]
				if got, ok := c.Blocked(k, now); ok && got != rel(k) {
					bad.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d lookups answered another key's release", n)
	}
}
