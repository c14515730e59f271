package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/poplimit/poplimit/window"
)

// GCRAParams configures a shared leaky bucket: the fields of
// window.LeakyBucket, with the same meaning and the same bounds (Validate).
type GCRAParams struct {
	Rate     int64         // units that leak out per Per, > 0
	Per      time.Duration // period of Rate, > 0
	Capacity int64         // the bucket's size in units, > 0; Capacity × Per + Rate fits an int64
}

// Validate reports every problem with p, as window.LeakyBucket.Validate.
func (p GCRAParams) Validate() error { return window.LeakyBucket(p).Validate() }

// GCRAResult is the outcome of one GCRA call.
type GCRAResult struct {
	// Allowed: the n units were poured. Always true for an unconditional
	// call and for n ≤ 0 (which pour nothing).
	Allowed bool
	// TAT and Frac are the bucket's state after the call, as
	// window.LeakyBucketState: the theoretical arrival time in Unix
	// nanoseconds and its fraction in units of 1/Rate ns.
	TAT, Frac int64
	// Remaining is the whole units of room left at now.
	Remaining int64
	// ReleaseAt is the earliest instant ≥ now, Unix ns, at which n more
	// units would fit if nothing else arrived: now when they fit,
	// math.MaxInt64 when n > Capacity.
	ReleaseAt int64
}

// GCRAOp is one call of GCRABatch: its arguments, and its Result or Err,
// set by GCRABatch.
type GCRAOp struct {
	Key         uint64 // hash of rule and client key
	Params      GCRAParams
	Now         int64 // Unix ns, the caller's clock
	N           int64 // units
	Conditional bool  // pour only if they fit (sync mode); else pour whatever the level (async flush)

	Result GCRAResult
	Err    error
}

// GCRA runs window.LeakyBucket's arithmetic on the shared bucket of key,
// atomically on the node that holds it, and returns the outcome. With
// conditional set it is LeakyBucket.Allow: the n units are poured only if
// they fit, and the state changes only then. Without it the n units are
// poured whatever the level (units an edge already admitted, sent by its
// flusher), so the bucket may go over Capacity and refuse until it has
// drained. It is GCRABatch with one op.
func (s *Store) GCRA(ctx context.Context, key uint64, p GCRAParams, now, n int64, conditional bool) (GCRAResult, error) {
	ops := [1]GCRAOp{{Key: key, Params: p, Now: now, N: n, Conditional: conditional}}
	s.GCRABatch(ctx, ops[:])
	return ops[0].Result, ops[0].Err
}

// AppendGCRAKey appends to dst the key of key's bucket, pl:{%016x}:gcra.
func AppendGCRAKey(dst []byte, key uint64) []byte {
	return append(appendTag(dst, key), ":gcra"...)
}

// gcraArgs returns the script's derived arguments for op: n × Per and
// (Capacity − n) × Per, the latter −1 when n > Capacity. An unconditional
// pour of n > Capacity must keep n × Per + Rate within an int64.
func gcraArgs(op *GCRAOp) (nPer, room int64, err error) {
	p := op.Params
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	if op.N <= 0 {
		return 0, 0, nil
	}
	per := int64(p.Per)
	if op.N <= p.Capacity {
		return op.N * per, (p.Capacity - op.N) * per, nil // Capacity × Per fits (Validate)
	}
	if op.Conditional {
		return 0, -1, nil // never fits
	}
	if op.N > (math.MaxInt64-p.Rate)/per {
		return 0, 0, fmt.Errorf("n %d × Per %v overflows int64 nanoseconds", op.N, p.Per)
	}
	return op.N * per, -1, nil
}

// GCRABatch runs every op as GCRA does, in one pipeline, and sets each op's
// Result or Err. Ops fail independently; ops on one key take effect in the
// order given. It returns within Timeout and keeps no reference to ops.
func (s *Store) GCRABatch(ctx context.Context, ops []GCRAOp) {
	if len(ops) == 0 {
		return
	}
	c, err := s.client(kindGCRA)
	if err != nil {
		for i := range ops {
			ops[i].Result, ops[i].Err = GCRAResult{}, err
			s.m.ops[kindGCRA][resultUnavailable].Inc()
		}
		return
	}
	b := s.getBatch()
	for i := range ops {
		op := &ops[i]
		nPer, room, err := gcraArgs(op)
		if err != nil {
			op.Result, op.Err = GCRAResult{}, fmt.Errorf("redisstore: gcra %s: %w: %w", s.addr, ErrInvalid, err)
			s.m.ops[kindGCRA][resultInvalid].Inc()
			continue
		}
		b.begin(scriptGCRA, 1)
		op.Err = errPending
		b.buf = AppendGCRAKey(b.buf, op.Key)
		b.end()
		b.pair(op.Now)
		b.int(op.N)
		b.pair(op.Params.Rate)
		b.pair(nPer)
		b.pair(room)
		if op.Conditional {
			b.str("1")
		} else {
			b.str("0")
		}
		b.int(s.cfg.ClockSkew.Milliseconds())
	}
	if len(b.reqs) == 0 {
		s.putBatch(b)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	d, abandoned, closed := s.exec(cctx, c, b)
	cancel()
	took := d.Seconds()
	answered, failed := false, false
	var memo errMemo
	j := 0 // the command of the next op sent
	for i := range ops {
		op := &ops[i]
		if op.Err != errPending {
			continue // invalid: failed above
		}
		j++
		var (
			res result
			err error
		)
		switch {
		case abandoned:
			err, res = s.abandonedErr(ctx, kindGCRA, &memo)
		case closed:
			err, res = s.closedErr(kindGCRA, &memo)
		default:
			res, err = s.gcraReply(ctx, op, b.res[j-1], &memo)
		}
		if err != nil {
			op.Result, op.Err = GCRAResult{}, err
		} else {
			op.Err = nil
		}
		answered = answered || res != resultTimeout && res != resultUnavailable
		failed = failed || (res == resultTimeout || res == resultUnavailable) && !cancelled(ctx)
		s.m.ops[kindGCRA][res].Inc()
		s.m.latency[kindGCRA].Observe(took)
	}
	if !abandoned {
		s.putBatch(b)
	}
	s.settled(answered, failed)
}

// gcraReply decodes the script's reply to op into op.Result.
func (s *Store) gcraReply(ctx context.Context, op *GCRAOp, r rueidis.RedisResult, memo *errMemo) (result, error) {
	if err, res, _ := s.opError(ctx, kindGCRA, r.Error(), memo); err != nil {
		return res, err
	}
	arr, err := r.ToArray()
	if err != nil || len(arr) != 3 {
		return resultBadValue, s.badValue(kindGCRA, fmt.Errorf("reply of %d elements, want 3 (%v)", len(arr), err))
	}
	poured, err1 := arr[0].ToInt64()
	tat, err2 := arr[1].ToString()
	frac, err3 := arr[2].ToString()
	if err := errors.Join(err1, err2, err3); err != nil {
		return resultBadValue, s.badValue(kindGCRA, err)
	}
	st, ok, err := DecodeGCRAState(poured, tat, frac, op.Params.Rate)
	if err != nil {
		return resultBadValue, s.badValue(kindGCRA, err)
	}
	lb := window.LeakyBucket(op.Params)
	op.Result = GCRAResult{
		Allowed:   ok,
		TAT:       st.TAT,
		Frac:      st.Frac,
		Remaining: lb.Remaining(st, op.Now),
		ReleaseAt: lb.Release(st, op.Now, op.N),
	}
	return resultOK, nil
}

// DecodeGCRAState decodes the GCRA script's reply: poured is 1 or 0, tat
// and frac decimal int64s with 0 ≤ frac < rate.
func DecodeGCRAState(poured int64, tat, frac string, rate int64) (window.LeakyBucketState, bool, error) {
	if poured != 0 && poured != 1 {
		return window.LeakyBucketState{}, false, fmt.Errorf("poured %d, want 0 or 1", poured)
	}
	t, err := strconv.ParseInt(tat, 10, 64)
	if err != nil {
		return window.LeakyBucketState{}, false, fmt.Errorf("tat: %w", err)
	}
	f, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return window.LeakyBucketState{}, false, fmt.Errorf("frac: %w", err)
	}
	if f < 0 || f >= rate {
		return window.LeakyBucketState{}, false, fmt.Errorf("frac %d outside [0, %d)", f, rate)
	}
	return window.LeakyBucketState{TAT: t, Frac: f}, poured == 1, nil
}
