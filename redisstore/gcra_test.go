package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// logUniform returns an int64 in [lo, hi] whose bit length is uniform, so
// every magnitude is drawn as often.
func logUniform(r *rand.Rand, lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	bitsHi := 64 - leadingZeros(uint64(hi))
	for {
		b := 1 + r.IntN(bitsHi)
		v := int64(r.Uint64() >> uint(64-b))
		if v >= lo && v <= hi {
			return v
		}
	}
}

func leadingZeros(x uint64) int {
	n := 0
	for x&(1<<63) == 0 && n < 64 {
		x <<= 1
		n++
	}
	return n
}

// randGCRAParams draws a bucket within algo.LeakyBucket.Validate's bounds
// whose full drain, added to an instant up to maxNow, stays within int64
// (beyond it algo.LeakyBucket's own TAT would wrap).
func randGCRAParams(r *rand.Rand, maxNow int64) GCRAParams {
	for {
		p := GCRAParams{Rate: logUniform(r, 1, 1<<62), Per: time.Duration(logUniform(r, 1, 1<<62))}
		if lim := (math.MaxInt64 - p.Rate) / int64(p.Per); lim >= 1 {
			p.Capacity = logUniform(r, 1, lim)
		} else {
			continue
		}
		drain := new(big.Int).Mul(big.NewInt(p.Capacity), big.NewInt(int64(p.Per)))
		drain.Quo(drain, big.NewInt(p.Rate))
		if p.Validate() == nil && drain.Cmp(big.NewInt(math.MaxInt64-maxNow-2)) < 0 {
			return p
		}
	}
}

// refPour is the unconditional pour in math/big: the update of
// algo.LeakyBucket.Allow without its fits check, the TAT saturating at
// math.MaxInt64.
func refPour(p GCRAParams, st algo.LeakyBucketState, now, n int64) algo.LeakyBucketState {
	if n <= 0 {
		return st
	}
	if st.TAT < now || st.TAT == now && st.Frac == 0 {
		st = algo.LeakyBucketState{TAT: now}
	}
	total := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(p.Per)))
	total.Add(total, big.NewInt(st.Frac))
	q, m := new(big.Int).QuoRem(total, big.NewInt(p.Rate), new(big.Int))
	q.Add(q, big.NewInt(st.TAT))
	if !q.IsInt64() {
		return algo.LeakyBucketState{TAT: math.MaxInt64}
	}
	return algo.LeakyBucketState{TAT: q.Int64(), Frac: m.Int64()}
}

// randStep draws the next instant and units of a sequence over p.
func randStep(r *rand.Rand, p GCRAParams, now int64) (int64, int64) {
	unit := max(int64(p.Per)/p.Rate, 1) // ns per unit, about
	drain := new(big.Int).Mul(big.NewInt(p.Capacity), big.NewInt(int64(p.Per)))
	drain.Quo(drain, big.NewInt(p.Rate))
	var dt int64
	switch r.IntN(8) {
	case 0: // same instant
	case 1:
		dt = r.Int64N(min(unit, 1<<40) + 1)
	case 2:
		dt = unit * (1 + r.Int64N(3))
	case 3:
		if drain.IsInt64() && drain.Int64() > 0 {
			dt = r.Int64N(min(drain.Int64(), 1<<60))
		}
	case 4: // the clock steps back
		dt = -r.Int64N(min(unit*3, 1<<40) + 1)
	default:
		dt = r.Int64N(1e9)
	}
	if dt > 0 && now > math.MaxInt64/2-dt {
		dt = 0
	}
	var n int64
	switch r.IntN(6) {
	case 0:
		n = 0
	case 1:
		n = p.Capacity
	case 2:
		n = p.Capacity + 1 + r.Int64N(3)
	case 3:
		n = logUniform(r, 1, p.Capacity)
	default:
		n = 1 + r.Int64N(min(p.Capacity, 4))
	}
	return now + dt, n
}

// TestGCRAMatchesLeakyBucket is the exactness proof: random sequences of
// conditional and unconditional calls over random buckets spanning
// algo.LeakyBucket.Validate's range (rates and periods from 1 to 2^62,
// capacities up to the int64 bound), through the script on a real
// redis-server, compared after every step with algo.LeakyBucket.Allow
// (conditional) and with the same update in math/big (unconditional):
// admitted, TAT and fraction, remaining and release time. Calls go in
// pipelined batches of random sizes, so ordering within a batch is checked
// too.
func TestGCRAMatchesLeakyBucket(t *testing.T) {
	p := startRedis(t)
	// The sequences' instants are not the server's clock: a ClockSkew of an
	// hour keeps every bucket until the test is done with it.
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Timeout: 5 * time.Second, ConnTimeout: 10 * time.Second, ClockSkew: time.Hour})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	const seqs, steps = 40, 150
	const base = int64(1_700_000_000_000_000_000)
	total, admitted, refused, poured, wide := 0, 0, 0, 0, 0
	for seq := range seqs {
		params := randGCRAParams(r, math.MaxInt64/2) // randStep keeps now below that
		if seq%8 == 0 {                              // and everyday buckets: 100 per minute, 10 per second
			params = []GCRAParams{{Rate: 100, Per: time.Minute, Capacity: 20}, {Rate: 10, Per: time.Second, Capacity: 20}, {Rate: 3, Per: time.Second, Capacity: 7}}[seq/8%3]
		}
		lb := algo.LeakyBucket(params)
		if params.Capacity > (1<<53)/int64(params.Per) {
			wide++ // levels beyond 2^53: the doubles alone would not be exact
		}
		key := uint64(seq + 1)
		var ref algo.LeakyBucketState
		now := base + r.Int64N(1e15)
		ops := make([]GCRAOp, 0, steps)
		for range steps {
			var n int64
			now, n = randStep(r, params, now)
			cond := r.IntN(4) != 0
			if !cond && n > params.Capacity {
				n = params.Capacity // pours over Capacity are checked in TestGCRAUnconditionalBounds
			}
			ops = append(ops, GCRAOp{Key: key, Params: params, Now: now, N: n, Conditional: cond})
		}
		for i := 0; i < len(ops); {
			j := min(len(ops), i+1+r.IntN(50))
			if j == i+1 && r.IntN(2) == 0 {
				op := &ops[i]
				op.Result, op.Err = s.GCRA(ctx, op.Key, op.Params, op.Now, op.N, op.Conditional)
			} else {
				s.GCRABatch(ctx, ops[i:j])
			}
			i = j
		}
		for i, op := range ops {
			total++
			var want GCRAResult
			if op.Conditional {
				ok, rem, rel := lb.Allow(&ref, op.Now, op.N)
				want = GCRAResult{Allowed: ok, TAT: ref.TAT, Frac: ref.Frac, Remaining: rem, ReleaseAt: rel}
			} else {
				ref = refPour(params, ref, op.Now, op.N)
				want = GCRAResult{Allowed: true, TAT: ref.TAT, Frac: ref.Frac, Remaining: lb.Remaining(ref, op.Now), ReleaseAt: lb.Release(ref, op.Now, op.N)}
			}
			switch {
			case !op.Conditional:
				poured++
			case want.Allowed:
				admitted++
			default:
				refused++
			}
			if op.Err != nil || op.Result != want {
				t.Fatalf("bucket %+v, step %d (now %d, n %d, conditional %v): got %+v, %v; want %+v",
					params, i, op.Now, op.N, op.Conditional, op.Result, op.Err, want)
			}
		}
	}
	t.Logf("%d steps over %d buckets (%d with levels beyond 2^53) matched: %d admitted, %d refused, %d unconditional",
		total, seqs, wide, admitted, refused, poured)
}

// TestGCRAUnconditionalBounds checks pours above Capacity: accepted while n
// × Per + Rate fits an int64 (the bucket then refuses conditional calls
// until it has drained), refused with ErrInvalid beyond, with nothing sent.
func TestGCRAUnconditionalBounds(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	params := GCRAParams{Rate: 10, Per: time.Second, Capacity: 5}
	now := int64(1_700_000_000_000_000_000)
	res, err := s.GCRA(ctx, 7, params, now, 20, false)
	if err != nil || !res.Allowed || res.TAT != now+2*int64(time.Second) || res.Remaining != 0 {
		t.Fatalf("pour of 20 into 5: got %+v, %v; want poured, TAT now+2s, 0 remaining", res, err)
	}
	res, err = s.GCRA(ctx, 7, params, now+1500*int64(time.Millisecond), 1, true)
	if err != nil || res.Allowed || res.ReleaseAt != now+1600*int64(time.Millisecond) {
		t.Fatalf("conditional 1 at +1.5s: got %+v, %v; want refused until +1.6s", res, err)
	}
	_, err = s.GCRA(ctx, 7, params, now, math.MaxInt64/int64(time.Second)+1, false)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("pour whose n × Per overflows: got %v, want ErrInvalid", err)
	}
	_, err = s.GCRA(ctx, 7, GCRAParams{Rate: 0, Per: time.Second, Capacity: 1}, now, 1, true)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Rate 0: got %v, want ErrInvalid", err)
	}
}

// TestGCRATTL checks that a pour sets the bucket's TTL to its drain time in
// ms, rounded up, and that a refused call leaves the bucket as it was.
func TestGCRATTL(t *testing.T) {
	p := startRedis(t)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	now := time.Now().UnixNano()
	params := GCRAParams{Rate: 3, Per: time.Second, Capacity: 30}
	if _, err := s.GCRA(ctx, 9, params, now, 10, true); err != nil { // drains in 3.333… s
		t.Fatal(err)
	}
	ttl, err := strconv.ParseInt(cli(t, p.Addr, "pttl", "pl:{0000000000000009}:gcra"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 4000 || ttl > 4334 {
		t.Errorf("PTTL after pouring 10 at 3/s: got %d ms, want at most 3334 + 1000 (ClockSkew) and a little less", ttl)
	}
	before := cli(t, p.Addr, "hgetall", "pl:{0000000000000009}:gcra")
	res, err := s.GCRA(ctx, 9, params, now, 25, true)
	if err != nil || res.Allowed {
		t.Fatalf("25 more: got %+v, %v; want refused", res, err)
	}
	if after := cli(t, p.Addr, "hgetall", "pl:{0000000000000009}:gcra"); after != before {
		t.Errorf("state after a refusal: got %q, want %q unchanged", after, before)
	}
}

// TestGCRANoScript flushes the script cache between calls: each call after
// a flush is answered NOSCRIPT, sent again as EVAL, and counted.
func TestGCRANoScript(t *testing.T) {
	p := startRedis(t)
	s, reg := newStore(t, Config{Addrs: []string{p.Addr}})
	ctx := context.Background()
	params := GCRAParams{Rate: 10, Per: time.Second, Capacity: 3}
	lb := algo.LeakyBucket(params)
	var ref algo.LeakyBucketState
	now := int64(1_700_000_000_000_000_000)
	for i := range 6 {
		cli(t, p.Addr, "script", "flush")
		res, err := s.GCRA(ctx, 11, params, now, 1, true)
		ok, _, _ := lb.Allow(&ref, now, 1)
		if err != nil || res.Allowed != ok || res.TAT != ref.TAT {
			t.Fatalf("call %d after SCRIPT FLUSH: got %+v, %v; want allowed %v, TAT %d", i, res, err, ok, ref.TAT)
		}
		ops := []store.Op{{Key: 11, Start: 1, Delta: 1, TTL: time.Minute}}
		s.Do(ctx, ops)
		if ops[0].Err != nil || ops[0].Value != uint64(i+1) {
			t.Fatalf("incr %d after SCRIPT FLUSH: got %d, %v", i, ops[0].Value, ops[0].Err)
		}
	}
	for _, name := range []string{"gcra", "counter"} {
		if n := testenv.MetricSum(t, reg, "poplimit_redis_script_fallbacks_total", "script", name); n != 6 {
			t.Errorf("script_fallbacks_total{script=%s}: got %v, want 6", name, n)
		}
	}
}

// ExampleGCRAParams shows that a bucket's parameters have
// algo.LeakyBucket's bounds: Capacity × Per must fit in int64 nanoseconds.
func ExampleGCRAParams() {
	p := GCRAParams{Rate: 100, Per: time.Minute, Capacity: 20}
	fmt.Println(p.Validate())
	fmt.Println(GCRAParams{Rate: 1, Per: time.Hour, Capacity: math.MaxInt64}.Validate() != nil)
	// Output:
	// <nil>
	// true
}
