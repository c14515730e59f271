package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
)

// Several limiters' worth of conditional ops on one store admit at most
// Capacity + Rate·t in any interval, and the log's state survives its
// encoding: the store's answers equal the in-memory algorithm's.
func TestStateApplyMatchesAlgorithms(t *testing.T) {
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	sl := algo.SlidingLog{Limit: 5, Window: time.Second}
	var val, logVal []byte
	var ref algo.LeakyBucketState
	var refLog algo.SlidingLogState
	now := int64(1e18)
	for i := range 500 {
		now += int64(i%7) * int64(time.Millisecond) * 13
		op := StateOp{Kind: StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: i%5 != 0}
		nv, _, write, err := op.Apply(val, nil)
		if err != nil {
			t.Fatal(err)
		}
		if write {
			val = nv
		}
		var ok bool
		if op.Conditional {
			ok, _, _ = lb.Allow(&ref, now, 1)
		} else {
			lb.Pour(&ref, now, 1)
			ok = true
		}
		if ok != op.Allowed || ref.TAT != op.TAT || ref.Frac != op.Frac {
			t.Fatalf("op %d: store %v %d/%d, algorithm %v %d/%d", i, op.Allowed, op.TAT, op.Frac, ok, ref.TAT, ref.Frac)
		}
		lop := StateOp{Kind: StateLog, Key: 1, Log: sl, Now: now, N: 1, Conditional: i%5 != 0}
		nv, _, write, err = lop.Apply(logVal, nil)
		if err != nil {
			t.Fatal(err)
		}
		if write {
			logVal = nv
		}
		if lop.Conditional {
			ok, _, _ = sl.Allow(&refLog, now, 1)
		} else {
			sl.Add(&refLog, now, 1)
			ok = true
		}
		if ok != lop.Allowed || sl.Count(&refLog, now) != sl.Limit-lop.Remaining && lop.Remaining > 0 {
			t.Fatalf("log op %d: store %v remaining %d, algorithm %v count %d", i, lop.Allowed, lop.Remaining, ok, sl.Count(&refLog, now))
		}
	}
}

func TestStateApplyRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		kind StateKind
		val  string
	}{
		{StateGCRA, "G123"}, {StateGCRA, "L" + string(make([]byte, 16))},
		{StateLog, "G"}, {StateLog, "L\x01\x05"}, {StateLog, "L\x05\x01\x06\x01"}, {StateLog, "L\x05\x00x"},
	} {
		op := StateOp{Kind: tc.kind, Bucket: algo.LeakyBucket{Rate: 1, Per: time.Second, Capacity: 1}, Log: algo.SlidingLog{Limit: 1, Window: time.Second}, Now: 10, N: 1, Conditional: true}
		if _, _, write, err := op.Apply([]byte(tc.val), nil); !errors.Is(err, algo.ErrBadState) || write {
			t.Errorf("%d %q: write %v err %v, want algo.ErrBadState", tc.kind, tc.val, write, err)
		}
	}
	op := StateOp{Kind: StateLog, Log: algo.SlidingLog{Limit: algo.MaxSharedLogLimit + 1, Window: time.Second}, N: 1}
	if err := op.Validate(); err == nil {
		t.Error("a log above algo.MaxSharedLogLimit was accepted")
	}
}

func TestMemStoreDoState(t *testing.T) {
	clk := &simClock{}
	clk.t.Store(1000e9)
	s := NewMemStore(clk)
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	admitted := 0
	for range 60 {
		ops := []StateOp{{Kind: StateGCRA, Key: 7, Bucket: lb, Now: clk.Now().UnixNano(), N: 1, Conditional: true}}
		s.DoState(context.Background(), ops)
		if ops[0].Err != nil {
			t.Fatal(ops[0].Err)
		}
		if ops[0].Allowed {
			admitted++
		}
	}
	if admitted != 20 {
		t.Fatalf("admitted %d of 60 at one instant, want the burst of 20", admitted)
	}
}
