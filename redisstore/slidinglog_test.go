package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
)

// TestSlidingLogMatchesWindow compares the script with algo.SlidingLog
// on random sequences of Allow (conditional) and Add (unconditional) calls:
// logged, count, remaining, release time and the oldest entry after every
// step. Limits run from 1 to 50, windows from a nanosecond to
// MaxLogWindow, instants step forward by every scale and sometimes back
// (the log clamps them to the latest seen); some sequences take steps of
// 2^50 ns under a window of 2^52 ns, so the script's epoch moves while
// entries are in the log.
func TestSlidingLogMatchesWindow(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: 5 * time.Second, ConnTimeout: 10 * time.Second, ClockSkew: time.Hour})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 8))
	const seqs, steps = 40, 150
	total, logged, refused, rebases := 0, 0, 0, 0
	for seq := range seqs {
		params := SlidingLogParams{Limit: 1 + r.Int64N(50), Window: time.Duration(logUniform(r, 1, int64(MaxLogWindow)))}
		longJumps := seq%5 == 0
		if longJumps {
			params.Window = MaxLogWindow
		}
		if seq%7 == 1 {
			params = SlidingLogParams{Limit: 5, Window: time.Minute} // a login rule
		}
		sl := algo.SlidingLog(params)
		var ref algo.SlidingLogState
		key := uint64(1000 + seq)
		now := int64(1_700_000_000_000_000_000) + r.Int64N(1e15)
		w := int64(params.Window)
		ops := make([]SlidingLogOp, 0, steps)
		for range steps {
			var dt int64
			switch r.IntN(7) {
			case 0:
			case 1:
				dt = r.Int64N(w/max(params.Limit, 1) + 1)
			case 2:
				dt = w
			case 3:
				dt = w + 1 - r.Int64N(3)
			case 4:
				dt = -r.Int64N(w/4 + 1)
			default:
				dt = r.Int64N(w/8 + 1)
			}
			if longJumps && r.IntN(2) == 0 {
				dt = 1 << 50
				rebases++
			}
			now += dt
			var n int64
			switch r.IntN(5) {
			case 0:
				n = 0
			case 1:
				n = params.Limit + 1
			case 2:
				n = 1 + r.Int64N(params.Limit)
			default:
				n = 1
			}
			ops = append(ops, SlidingLogOp{Key: key, Params: params, Now: now, N: n, Conditional: r.IntN(5) != 0})
		}
		for i := 0; i < len(ops); {
			j := min(len(ops), i+1+r.IntN(40))
			if j == i+1 && r.IntN(2) == 0 {
				op := &ops[i]
				op.Result, op.Err = s.SlidingLog(ctx, op.Key, op.Params, op.Now, op.N, op.Conditional)
			} else {
				s.SlidingLogBatch(ctx, ops[i:j])
			}
			i = j
		}
		for i, op := range ops {
			total++
			var want SlidingLogResult
			if op.Conditional {
				ok, rem, rel := sl.Allow(&ref, op.Now, op.N)
				want = SlidingLogResult{Allowed: ok, Remaining: rem, ReleaseAt: rel}
				if ok && op.N > 0 {
					logged++
				} else if !ok {
					refused++
				}
			} else {
				sl.Add(&ref, op.Now, op.N)
				want = SlidingLogResult{Allowed: true, Remaining: sl.Remaining(&ref, op.Now), ReleaseAt: sl.Release(&ref, op.Now, op.N)}
			}
			want.Count = sl.Count(&ref, op.Now)
			if c := want.Count; c > 0 && c <= params.Limit {
				// The oldest entry leaves the window first: the release
				// of the units that need exactly one to leave.
				want.Oldest = sl.Release(&ref, op.Now, params.Limit-c+1) - w
			} else {
				want.Oldest = op.Result.Oldest // not derivable from the window's API
			}
			if op.Err != nil || op.Result != want {
				t.Fatalf("log %+v, step %d (now %d, n %d, conditional %v): got %+v, %v; want %+v",
					params, i, op.Now, op.N, op.Conditional, op.Result, op.Err, want)
			}
		}
	}
	t.Logf("%d steps over %d logs matched: %d logged, %d refused, %d jumps of 2^50 ns", total, seqs, logged, refused, rebases)
}

// TestSlidingLogEpoch drives one key's log across many multiples of 2^52
// ns with entries in it all along, so its epoch moves and every score is
// shifted, and checks the instants that come back against algo.SlidingLog.
func TestSlidingLogEpoch(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, ClockSkew: time.Hour})
	ctx := context.Background()
	params := SlidingLogParams{Limit: 3, Window: MaxLogWindow}
	sl := algo.SlidingLog(params)
	var ref algo.SlidingLogState
	now := int64(1 << 40)
	for i := range 40 {
		now += 1<<51 + int64(i) // odd offsets, so a lost nanosecond would show
		res, err := s.SlidingLog(ctx, 5, params, now, 1, true)
		ok, rem, rel := sl.Allow(&ref, now, 1)
		if err != nil || res.Allowed != ok || res.Remaining != rem || res.ReleaseAt != rel {
			t.Fatalf("call %d at %d: got %+v, %v; want allowed %v, remaining %d, release %d", i, now, res, err, ok, rem, rel)
		}
	}
	e, err := strconv.ParseInt(cli(t, p.Addr, "hget", "pl:{0000000000000005}:logm", "e"), 10, 64)
	if err != nil || e <= 1<<52 {
		t.Errorf("epoch after 40 × 2^51 ns: got %d, %v; want it moved well past 2^52", e, err)
	}
}

func TestSlidingLogInvalid(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, MaxLogEntries: 100})
	ctx := context.Background()
	for _, params := range []SlidingLogParams{
		{Limit: 0, Window: time.Minute},
		{Limit: 5, Window: 0},
		{Limit: 5, Window: MaxLogWindow + 1},
		{Limit: 101, Window: time.Minute},
	} {
		if _, err := s.SlidingLog(ctx, 1, params, 0, 1, true); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", params, err)
		}
	}
	if got := cli(t, p.Addr, "dbsize"); got != "0" {
		t.Errorf("DBSIZE after invalid calls: got %s, want 0", got)
	}
}

// TestSlidingLogCap checks that unconditional calls stop logging at
// MaxLogEntries, and that a log and its bookkeeping expire one window (plus
// ClockSkew) after the last call.
func TestSlidingLogCap(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, MaxLogEntries: 50, ClockSkew: 100 * time.Millisecond})
	ctx := context.Background()
	params := SlidingLogParams{Limit: 10, Window: 200 * time.Millisecond}
	now := time.Now().UnixNano()
	var res SlidingLogResult
	var err error
	for range 8 {
		res, err = s.SlidingLog(ctx, 3, params, now, 9, false)
		if err != nil {
			t.Fatal(err)
		}
	}
	if res.Count != 50 || res.ReleaseAt != now+int64(params.Window) || res.Oldest != now {
		t.Errorf("after 8 × 9 unconditional units with MaxLogEntries 50: got %+v, want count 50, oldest now, release now + window", res)
	}
	if got := cli(t, p.Addr, "zcard", "pl:{0000000000000003}:log"); got != "50" {
		t.Errorf("ZCARD: got %s, want 50", got)
	}
	time.Sleep(400 * time.Millisecond)
	if got := cli(t, p.Addr, "exists", "pl:{0000000000000003}:log", "pl:{0000000000000003}:logm"); got != "0" {
		t.Errorf("EXISTS after window + ClockSkew: got %s, want 0 (both keys expired)", got)
	}
}
