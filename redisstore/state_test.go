package redisstore

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// stoppedClock is a store.Clock that never moves, so nothing a MemStore
// holds expires during a test whose instants are made up.
type stoppedClock struct{}

func (stoppedClock) Now() time.Time { return time.Unix(1_700_000_000, 0) }

// stateOutputs is op's outputs, Err aside, for comparison.
func stateOutputs(op store.StateOp) store.StateOp {
	op.Err = nil
	return op
}

// TestDoStateMatchesMemStore runs one random sequence of StateOps (buckets
// and logs over a few keys, conditional and not, n from 0 to 3, instants
// that mostly move forward by every scale of their rule and sometimes go
// back, a few invalid ops) through the Store's DoState in random batches
// and through store.MemStore's DoState, the reference, and compares every
// op's outputs: Allowed, Remaining and ReleaseAt for both kinds, TAT and
// Frac exactly for buckets.
//
// A log's instant goes back only while the latest instant of all its ops
// is one that logged units: the Store, as algo.SlidingLog, clamps an op
// to the latest instant any op passed, while MemStore stores only what
// logged units (see TestDoStateLogClamp).
func TestDoStateMatchesMemStore(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: 5 * time.Second, ConnTimeout: 10 * time.Second, ClockSkew: time.Hour})
	mem := store.NewMemStore(stoppedClock{})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(11, 12))

	type keyState struct {
		bucket     algo.LeakyBucket
		log        algo.SlidingLog
		now        int64 // the latest instant given to the key
		logMax     int64 // the latest instant of a log op
		logSeen    bool
		memLatest  int64 // the latest instant MemStore's log stored
		memWritten bool
		mark       int64 // the TAT the last pour left, for give-backs
		logAt      int64 // an instant units were logged at, for give-backs
		logUnits   int64 // how many are left there
	}
	rates := []int64{1, 3, 7, 10, 20}
	pers := []time.Duration{100 * time.Millisecond, time.Second, time.Minute}
	keys := make([]keyState, 8)
	for i := range keys {
		keys[i] = keyState{
			bucket: algo.LeakyBucket{Rate: rates[r.IntN(len(rates))], Per: pers[r.IntN(len(pers))], Capacity: 1 + r.Int64N(10)},
			log:    algo.SlidingLog{Limit: 1 + r.Int64N(10), Window: time.Duration(logUniform(r, int64(time.Millisecond), int64(10*time.Second)))},
			now:    1_700_000_000_000_000_000 + r.Int64N(1e12),
		}
	}
	const steps = 3000
	ops := make([]store.StateOp, 0, steps)
	want := make([]store.StateOp, 0, steps)
	back, invalid := 0, 0
	for range steps {
		ki := r.IntN(len(keys))
		k := &keys[ki]
		op := store.StateOp{Key: uint64(ki+1) * 0x9e3779b97f4a7c15, Bucket: k.bucket, Log: k.log, N: r.Int64N(4), Conditional: r.IntN(4) != 0}
		op.Kind = store.StateGCRA
		if r.IntN(2) == 0 {
			op.Kind = store.StateLog
		}
		T := int64(k.bucket.Per) / k.bucket.Rate
		W := int64(k.log.Window)
		var dt int64
		switch r.IntN(7) {
		case 0:
		case 1:
			dt = r.Int64N(T + 1)
		case 2:
			dt = r.Int64N(W/k.log.Limit + 1)
		case 3:
			dt = W // exactly the window: the oldest entry leaves
		case 4:
			dt = k.bucket.Capacity * T // about the bucket's drain
		default:
			dt = r.Int64N(max(T, W/k.log.Limit)/2 + 1)
		}
		canGoBack := op.Kind == store.StateGCRA || k.logSeen == k.memWritten && k.logMax == k.memLatest
		if canGoBack && r.IntN(8) == 0 {
			op.Now = k.now - r.Int64N(max(T, W)+1)
			back++
		} else {
			k.now += dt
			op.Now = k.now
		}
		if op.Kind == store.StateGCRA && k.mark != 0 && r.IntN(5) == 0 {
			// Units of an earlier pour given back (a response that did
			// not count), at the TAT it left or about it.
			op.GiveBack, op.Mark = true, k.mark+r.Int64N(2*T+1)-T
		}
		if op.Kind == store.StateLog && k.logUnits > 0 && r.IntN(4) == 0 && k.logSeen == k.memWritten && k.logMax == k.memLatest &&
			op.Now >= k.logMax && op.Now-k.logAt < W {
			// Units logged at one instant, still in the window, given
			// back: both stores remove them and store the log.
			op.GiveBack, op.Mark, op.N, op.Conditional = true, k.logAt, 1+r.Int64N(k.logUnits), false
			k.logUnits -= op.N
		}
		switch r.IntN(100) {
		case 0:
			op.Kind, op.Log.Limit = store.StateLog, algo.MaxSharedLogLimit+1
		case 1:
			op.Kind, op.Bucket.Rate = store.StateGCRA, 0
		case 2:
			op.Kind = 9
		}
		ref := []store.StateOp{op}
		mem.DoState(ctx, ref)
		if ref[0].Err == nil && op.Kind == store.StateGCRA && !op.GiveBack && op.N > 0 && ref[0].Allowed {
			k.mark = ref[0].TAT
		}
		if ref[0].Err == nil && op.Kind == store.StateLog && !op.GiveBack && op.Conditional && op.N > 0 && ref[0].Allowed &&
			op.Now >= k.memLatest && op.Now >= k.logMax {
			if op.Now != k.logAt {
				k.logAt, k.logUnits = op.Now, 0
			}
			k.logUnits += op.N
		}
		if ref[0].Err != nil {
			invalid++
		} else if op.Kind == store.StateLog {
			if !k.logSeen || op.Now > k.logMax {
				k.logMax = op.Now
			}
			k.logSeen = true
			if op.N > 0 && (ref[0].Allowed || !op.Conditional) {
				k.memLatest, k.memWritten = max(k.memLatest, op.Now), true
			}
		}
		ops = append(ops, op)
		want = append(want, ref[0])
	}
	for i := 0; i < len(ops); {
		j := min(len(ops), i+1+r.IntN(30))
		s.DoState(ctx, ops[i:j])
		i = j
	}
	allowed, refused := 0, 0
	for i := range ops {
		got, w := ops[i], want[i]
		if w.Err != nil {
			if !errors.Is(got.Err, ErrInvalid) {
				t.Errorf("op %d %+v: MemStore refused it (%v); got %v, want ErrInvalid", i, w, w.Err, got.Err)
			}
			continue
		}
		if got.Err != nil || stateOutputs(got) != stateOutputs(w) {
			t.Fatalf("op %d (kind %d, now %d, n %d, conditional %v, bucket %+v, log %+v):\ngot  allowed %v remaining %d release %d tat %d frac %d, %v\nwant allowed %v remaining %d release %d tat %d frac %d",
				i, got.Kind, got.Now, got.N, got.Conditional, got.Bucket, got.Log,
				got.Allowed, got.Remaining, got.ReleaseAt, got.TAT, got.Frac, got.Err,
				w.Allowed, w.Remaining, w.ReleaseAt, w.TAT, w.Frac)
		}
		if got.Allowed {
			allowed++
		} else {
			refused++
		}
	}
	if refused < steps/20 || allowed < steps/4 {
		t.Errorf("%d allowed, %d refused: want a sequence that exercises both", allowed, refused)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "invalid"); n != float64(invalid) {
		t.Errorf("ops_total{result=invalid}: got %v, want %d", n, invalid)
	}
	t.Logf("%d ops matched MemStore: %d allowed, %d refused, %d invalid, %d out of order", steps, allowed, refused, invalid, back)
}

// TestDoStateLogClamp pins the one difference between the Store's log and
// MemStore's: an op that logs nothing (a read, a refusal) at an instant
// later than any before still advances the latest instant the log has
// seen, so a later op with an earlier instant is clamped to it, as
// algo.SlidingLog does in process. MemStore keeps only what a write
// stored; the test logs whether it differs.
func TestDoStateLogClamp(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: 5 * time.Second, ClockSkew: time.Hour})
	mem := store.NewMemStore(stoppedClock{})
	ctx := context.Background()
	l := algo.SlidingLog{Limit: 1, Window: time.Second}
	t0 := int64(1_700_000_000_000_000_000)
	seq := []struct {
		now, n int64
	}{
		{t0, 1},                               // logged at t0
		{t0 + int64(2*time.Second), 0},        // a read two windows later: the log is empty then
		{t0 + int64(500*time.Millisecond), 1}, // an earlier instant: clamped to t0 + 2s, where it fits
	}
	var ref algo.SlidingLogState
	for i, c := range seq {
		ok, rem, rel := l.Allow(&ref, c.now, c.n)
		op := []store.StateOp{{Kind: store.StateLog, Key: 7, Log: l, Now: c.now, N: c.n, Conditional: true}}
		s.DoState(ctx, op)
		if op[0].Err != nil || op[0].Allowed != ok || op[0].Remaining != rem || op[0].ReleaseAt != rel {
			t.Errorf("step %d: got %+v; want allowed %v, remaining %d, release %d (algo.SlidingLog)", i, op[0], ok, rem, rel)
		}
		mop := []store.StateOp{{Kind: store.StateLog, Key: 7, Log: l, Now: c.now, N: c.n, Conditional: true}}
		mem.DoState(ctx, mop)
		if stateOutputs(mop[0]) != stateOutputs(op[0]) {
			t.Logf("step %d: MemStore gives allowed %v, remaining %d, release %d; the Store and algo.SlidingLog %v, %d, %d",
				i, mop[0].Allowed, mop[0].Remaining, mop[0].ReleaseAt, op[0].Allowed, op[0].Remaining, op[0].ReleaseAt)
		}
	}
}

// stateStores returns n Stores on the server at addr, each with its own
// connections.
func stateStores(t *testing.T, addr string, n int) []*Store {
	ss := make([]*Store, n)
	for i := range ss {
		ss[i], _ = newStore(t, Config{Addrs: []string{addr}, Timeout: time.Second})
	}
	return ss
}

// hammer runs callers goroutines spread over stores, each calling
// DoState with one op made by mk from its instant until d has passed,
// and returns the admitted ops' instants and call durations, sorted by
// instant. An op that fails fails the test.
func hammer(t *testing.T, stores []*Store, callers int, d time.Duration, mk func(now int64) store.StateOp) (at, took []int64) {
	t.Helper()
	type admit struct{ at, took int64 }
	var (
		mu     sync.Mutex
		admits []admit
		wg     sync.WaitGroup
	)
	ctx := context.Background()
	end := time.Now().Add(d)
	for g := range callers {
		s := stores[g%len(stores)]
		wg.Go(func() {
			ops := make([]store.StateOp, 1)
			for time.Now().Before(end) {
				start := time.Now()
				ops[0] = mk(start.UnixNano())
				s.DoState(ctx, ops)
				if err := ops[0].Err; err != nil {
					t.Error(err)
					return
				}
				if ops[0].Allowed {
					mu.Lock()
					admits = append(admits, admit{start.UnixNano(), int64(time.Since(start))})
					mu.Unlock()
				}
				time.Sleep(time.Duration(rand.Int64N(int64(2 * time.Millisecond))))
			}
		})
	}
	wg.Wait()
	slices.SortFunc(admits, func(a, b admit) int { return int(a.at - b.at) })
	for _, a := range admits {
		at, took = append(at, a.at), append(took, a.took)
	}
	return at, took
}

// TestDoStateGCRAConcurrent has callers on several Stores take units one at
// a time, conditionally, from one shared bucket of burst 20 leaking 10 a
// second, for 2 s by the wall clock: between any two admitted instants
// (the callers' own) at most 20 + 10·Δt + 1 were admitted, whatever order
// the callers' ops reached the server in.
func TestDoStateGCRAConcurrent(t *testing.T) {
	p := startRedis(t)
	stores := stateStores(t, p.Addr, 4)
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 20}
	const d = 2 * time.Second
	at, _ := hammer(t, stores, 12, d, func(now int64) store.StateOp {
		return store.StateOp{Kind: store.StateGCRA, Key: 42, Bucket: lb, Now: now, N: 1, Conditional: true}
	})
	for i := range at {
		for j := i; j < len(at); j++ {
			dt := float64(at[j]-at[i]) / float64(time.Second)
			if n := float64(j - i + 1); n > 20+10*dt+1 {
				t.Fatalf("%v admitted in the %.3fs from instant %d: want at most 20 + 10·Δt + 1 = %.1f", n, dt, i, 20+10*dt+1)
			}
		}
	}
	// 20 at once, then 10 a second: about 40 in 2 s.
	if len(at) < 30 || len(at) > 42 {
		t.Errorf("admitted %d in %v: want about 20 + 10 × 2 = 40", len(at), d)
	}
	t.Logf("%d admitted in %v", len(at), d)
}

// TestDoStateLogConcurrent has callers on several Stores log units one at a
// time, conditionally, in one shared log of 5 per 500 ms, for 2 s: at most
// 5 in any trailing window. The log clamps each op to the latest instant
// the key has seen, which is at most the call's duration after the
// caller's own, so an op's logged instant lies in [its instant, its
// instant + its duration]: a window that holds all of several ops' such
// spans holds their logged instants, and so at most 5 of them.
func TestDoStateLogConcurrent(t *testing.T) {
	p := startRedis(t)
	stores := stateStores(t, p.Addr, 4)
	l := algo.SlidingLog{Limit: 5, Window: 500 * time.Millisecond}
	const d = 2 * time.Second
	at, took := hammer(t, stores, 12, d, func(now int64) store.StateOp {
		return store.StateOp{Kind: store.StateLog, Key: 43, Log: l, Now: now, N: 1, Conditional: true}
	})
	w := int64(l.Window)
	for i := range at {
		end := at[i] + took[i] // a window (end − W, end]
		n := 0
		for j := range at {
			if at[j] > end-w && at[j]+took[j] <= end {
				n++
			}
		}
		if n > 5 {
			t.Fatalf("%d admitted within the window ending %d: want at most 5", n, end)
		}
	}
	// 5 each 500 ms: about 20 in 2 s.
	if len(at) < 15 || len(at) > 25 {
		t.Errorf("admitted %d in %v: want about 5 × 4 = 20", len(at), d)
	}
	t.Logf("%d admitted in %v", len(at), d)
}

// TestDoStateFaults: after SCRIPT FLUSH every DoState call still succeeds
// through EVAL, in order, counted as fallbacks of both scripts; keys of
// another type (a string, a list) and states that do not decode fail their
// op alone with ErrReply or ErrBadValue, and invalid ops with ErrInvalid,
// all counted, while the good ops of the same call succeed.
func TestDoStateFaults(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}, ClockSkew: time.Hour})
	mem := store.NewMemStore(stoppedClock{})
	ctx := context.Background()
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 3}
	l := algo.SlidingLog{Limit: 3, Window: time.Second}
	now := int64(1_700_000_000_000_000_000)
	for round := range 4 {
		cli(t, p.Addr, "script", "flush")
		now += int64(100 * time.Millisecond)
		ops := []store.StateOp{
			{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 2, Conditional: true},
			{Kind: store.StateLog, Key: 1, Log: l, Now: now, N: 1, Conditional: true},
			{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 2, Conditional: true},
			{Kind: store.StateLog, Key: 1, Log: l, Now: now, N: 2, Conditional: false},
			{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now},
			{Kind: store.StateLog, Key: 1, Log: l, Now: now, N: 1, Conditional: true},
		}
		want := slices.Clone(ops)
		mem.DoState(ctx, want)
		s.DoState(ctx, ops)
		for i := range ops {
			if ops[i].Err != nil || stateOutputs(ops[i]) != stateOutputs(want[i]) {
				t.Fatalf("round %d op %d after SCRIPT FLUSH: got %+v; want %+v", round, i, ops[i], want[i])
			}
		}
		cli(t, p.Addr, "script", "flush")
		one := []store.StateOp{{Kind: store.StateGCRA, Key: 2, Bucket: lb, Now: now, N: 1, Conditional: true}}
		s.DoState(ctx, one) // a single op: on the caller's goroutine
		if one[0].Err != nil || !one[0].Allowed {
			t.Fatalf("round %d: single op after SCRIPT FLUSH: got %+v", round, one[0])
		}
	}
	for _, sc := range []string{"gcra", "sliding_log"} {
		if n := testenv.MetricSum(t, reg, "poplimit_redis_script_fallbacks_total", "script", sc); n < 4 {
			t.Errorf("script_fallbacks_total{script=%s}: got %v, want at least 4", sc, n)
		}
	}

	cli(t, p.Addr, "set", "pl:{0000000000000003}:gcra", "a string")
	cli(t, p.Addr, "rpush", "pl:{0000000000000004}:gcra", "a", "list")
	cli(t, p.Addr, "hset", "pl:{0000000000000005}:gcra", "tat", "12x", "frac", "0")
	cli(t, p.Addr, "set", "pl:{0000000000000003}:logm", "a string")
	// bookkeeping that reads, over a log that is a list (an epoch far
	// behind would make the script DEL the log rather than read it)
	cli(t, p.Addr, "hset", "pl:{0000000000000004}:logm", "e", strconv.FormatInt(now-10, 10), "t", strconv.FormatInt(now-5, 10), "s", "0")
	cli(t, p.Addr, "rpush", "pl:{0000000000000004}:log", "a", "list")
	cli(t, p.Addr, "hset", "pl:{0000000000000005}:logm", "e", "5", "t", "2", "s", "0")
	ops := []store.StateOp{
		{Kind: store.StateGCRA, Key: 3, Bucket: lb, Now: now, N: 1, Conditional: true},  // a string
		{Kind: store.StateGCRA, Key: 4, Bucket: lb, Now: now, N: 1, Conditional: false}, // a list
		{Kind: store.StateGCRA, Key: 5, Bucket: lb, Now: now, N: 1, Conditional: true},  // a bad TAT
		{Kind: store.StateLog, Key: 3, Log: l, Now: now, N: 1, Conditional: true},       // bookkeeping a string
		{Kind: store.StateLog, Key: 4, Log: l, Now: now, N: 0},                          // the log a list
		{Kind: store.StateLog, Key: 5, Log: l, Now: now, N: 1, Conditional: true},       // epoch after latest
		{Kind: store.StateGCRA, Key: 6, Bucket: lb, Now: now, N: 1, Conditional: true},  // good
		{Kind: store.StateLog, Key: 6, Log: algo.SlidingLog{Limit: algo.MaxSharedLogLimit + 1, Window: time.Second}, Now: now, N: 1},
		{Kind: store.StateLog, Key: 6, Log: algo.SlidingLog{Limit: 3, Window: MaxLogWindow + 1}, Now: now, N: 1},
		{Kind: store.StateGCRA, Key: 6, Bucket: algo.LeakyBucket{Rate: 1, Per: time.Second}, Now: now, N: 1},
		{Kind: 0, Key: 6, Now: now, N: 1},
		{Kind: store.StateLog, Key: 6, Log: l, Now: now, N: 1, Conditional: true}, // good
	}
	s.DoState(ctx, ops)
	wantErr := []error{ErrReply, ErrReply, ErrBadValue, ErrReply, ErrReply, ErrBadValue, nil, ErrInvalid, ErrInvalid, ErrInvalid, ErrInvalid, nil}
	for i, op := range ops {
		if w := wantErr[i]; w == nil && (op.Err != nil || !op.Allowed) || w != nil && (!errors.Is(op.Err, w) || op.Allowed) {
			t.Errorf("op %d (kind %d, key %d): got %+v; want error %v", i, op.Kind, op.Key, op, w)
		}
	}
	for _, c := range []struct {
		op, result string
		want       float64
	}{
		{"gcra", "reply_error", 2}, {"gcra", "bad_value", 1}, {"gcra", "invalid", 2},
		{"sliding_log", "reply_error", 2}, {"sliding_log", "bad_value", 1}, {"sliding_log", "invalid", 2},
	} {
		if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "op", c.op, "result", c.result); n != c.want {
			t.Errorf("ops_total{op=%s,result=%s}: got %v, want %v", c.op, c.result, n, c.want)
		}
	}
	if got := cli(t, p.Addr, "type", "pl:{0000000000000003}:gcra"); got != "string" {
		t.Errorf("TYPE of the string under a bucket's name after the calls: got %s, want string (untouched)", got)
	}
	if !s.Healthy() {
		t.Errorf("Healthy after error replies: got false, want true (the server answered)")
	}
}

// TestDoStateKilledServer kills the server under a Store: every DoState
// call, of one op or of both kinds at once, fails each op within Timeout
// with ErrUnavailable or ErrTimeout, counted; after Close ops fail with
// ErrClosed.
func TestDoStateKilledServer(t *testing.T) {
	p := startRedis(t)
	const timeout = 100 * time.Millisecond
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: timeout, DialTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	lb := algo.LeakyBucket{Rate: 10, Per: time.Second, Capacity: 3}
	l := algo.SlidingLog{Limit: 3, Window: time.Second}
	mk := func(n int) []store.StateOp {
		now := time.Now().UnixNano()
		ops := []store.StateOp{
			{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: true},
			{Kind: store.StateLog, Key: 1, Log: l, Now: now, N: 1, Conditional: true},
			{Kind: store.StateGCRA, Key: 2, Bucket: lb, Now: now, N: 1},
		}
		return ops[:n]
	}
	ops := mk(3)
	s.DoState(ctx, ops)
	for _, op := range ops {
		if op.Err != nil {
			t.Fatal(op.Err)
		}
	}
	p.Kill()
	calls, failed := 0, 0
	for i := range 6 {
		ops := mk(1 + 2*(i%2))
		start := time.Now()
		s.DoState(ctx, ops)
		took := time.Since(start)
		calls++
		if took > 10*timeout {
			t.Errorf("call %d of %d ops on a killed server: took %v, want it ended by the %v timeout, not hung", i, len(ops), took, timeout)
		}
		for _, op := range ops {
			failed++
			if !errors.Is(op.Err, ErrUnavailable) && !errors.Is(op.Err, ErrTimeout) || op.Allowed {
				t.Errorf("call %d: got %+v, want ErrUnavailable or ErrTimeout, not allowed", i, op)
			}
		}
	}
	if s.Healthy() {
		t.Errorf("Healthy after %d unanswered calls: got true, want false", calls)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "unavailable") +
		testenv.MetricSum(t, reg, "poplimit_redis_ops_total", "result", "timeout"); n != float64(failed) {
		t.Errorf("ops_total{result=unavailable|timeout}: got %v, want %d", n, failed)
	}
	s.Close()
	ops = mk(2)
	s.DoState(ctx, ops)
	for _, op := range ops {
		if !errors.Is(op.Err, ErrClosed) {
			t.Errorf("after Close: got %v, want ErrClosed", op.Err)
		}
	}
}

// TestDoStateAllocs bounds a sync decision through DoState, one
// conditional bucket op: as TestGCRAAllocs.
func TestDoStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: time.Second})
	ctx := context.Background()
	ops := make([]store.StateOp, 1)
	lb := algo.LeakyBucket{Rate: 100, Per: time.Minute, Capacity: 20}
	now := int64(1_700_000_000_000_000_000)
	call := func() {
		now += int64(time.Second)
		ops[0] = store.StateOp{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: true}
		s.DoState(ctx, ops)
		if ops[0].Err != nil || !ops[0].Allowed {
			t.Fatalf("got %+v", ops[0])
		}
	}
	for range 100 {
		call()
	}
	got := testing.AllocsPerRun(100, call)
	t.Logf("DoState of one conditional bucket op: %.1f allocations", got)
	if got > 15 {
		t.Errorf("DoState of one conditional bucket op: got %.1f allocations a call, want at most 15", got)
	}
}

// BenchmarkRedisStateSync is the sync path of a shared bucket: one
// conditional GCRA op per DoState call, one round trip to a real
// redis-server on loopback.
//
//	go test -run '^$' -bench BenchmarkRedisStateSync -benchmem ./redisstore/
func BenchmarkRedisStateSync(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	ops := make([]store.StateOp, 1)
	lb := algo.LeakyBucket{Rate: 100, Per: time.Minute, Capacity: 20}
	now := int64(1_700_000_000_000_000_000)
	b.ReportAllocs()
	for b.Loop() {
		now += int64(time.Second)
		ops[0] = store.StateOp{Kind: store.StateGCRA, Key: 1, Bucket: lb, Now: now, N: 1, Conditional: true}
		s.DoState(ctx, ops)
		if ops[0].Err != nil || !ops[0].Allowed || ops[0].ReleaseAt == math.MaxInt64 {
			b.Fatalf("got %+v", ops[0])
		}
	}
}
