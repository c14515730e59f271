package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/redis/rueidis"
)

// GCRAParams configures a shared leaky bucket: the fields of
// algo.LeakyBucket, with the same meaning and the same bounds (Validate).
type GCRAParams struct {
	Rate     int64         // units that leak out per Per, > 0
	Per      time.Duration // period of Rate, > 0
	Capacity int64         // the bucket's size in units, > 0; Capacity × Per + Rate fits an int64
}

// Validate reports every problem with p, as algo.LeakyBucket.Validate.
func (p GCRAParams) Validate() error { return algo.LeakyBucket(p).Validate() }

// GCRAResult is the outcome of one GCRA call.
type GCRAResult struct {
	// Allowed: the n units were poured. Always true for an unconditional
	// call and for n ≤ 0 (which pour nothing).
	Allowed bool
	// TAT and Frac are the bucket's state after the call, as
	// algo.LeakyBucketState: the theoretical arrival time in Unix
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

// GCRA runs algo.LeakyBucket's arithmetic on the shared bucket of key,
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

// gcraArgs returns the script's derived arguments for n units of a valid
// bucket lb: n × Per and (Capacity − n) × Per, the latter −1 when n >
// Capacity. An unconditional pour of n > Capacity must keep n × Per + Rate
// within an int64.
func gcraArgs(lb algo.LeakyBucket, n int64, conditional bool) (nPer, room int64, err error) {
	if n <= 0 {
		return 0, 0, nil
	}
	per := int64(lb.Per)
	if n <= lb.Capacity {
		return n * per, (lb.Capacity - n) * per, nil // Capacity × Per fits (Validate)
	}
	if conditional {
		return 0, -1, nil // never fits
	}
	if n > (math.MaxInt64-lb.Rate)/per {
		return 0, 0, fmt.Errorf("n %d × Per %v overflows int64 nanoseconds", n, lb.Per)
	}
	return n * per, -1, nil
}

// addGCRA appends the GCRA script's command for n units at now of the
// bucket of key, lb valid, or returns why it cannot run.
func (s *Store) addGCRA(b *batch, key uint64, lb algo.LeakyBucket, now, n int64, conditional bool) error {
	nPer, room, err := gcraArgs(lb, n, conditional)
	if err != nil {
		return err
	}
	how := "0"
	if conditional {
		how = "1"
	}
	s.addGCRAScript(b, key, lb, now, n, nPer, room, how, 0)
	return nil
}

// addGCRAGiveBack appends the GCRA script's command that takes back n
// units an earlier pour left the bucket's TAT at mark with
// (algo.LeakyBucket.GiveBack), lb valid.
func (s *Store) addGCRAGiveBack(b *batch, key uint64, lb algo.LeakyBucket, now, n, mark int64) error {
	var nPer int64
	if n > 0 {
		if n > math.MaxInt64/int64(lb.Per) {
			return fmt.Errorf("n %d × Per %v overflows int64 nanoseconds", n, lb.Per)
		}
		nPer = n * int64(lb.Per)
	}
	s.addGCRAScript(b, key, lb, now, n, nPer, 0, "2", mark)
	return nil
}

// addGCRAScript appends the GCRA script's command: how is "0" (pour), "1"
// (pour if the units conform) or "2" (give back the units of the pour
// that left the TAT at mark, the script's one more argument).
func (s *Store) addGCRAScript(b *batch, key uint64, lb algo.LeakyBucket, now, n, nPer, room int64, how string, mark int64) {
	b.begin(scriptGCRA, 1)
	b.buf = AppendGCRAKey(b.buf, key)
	b.end()
	b.pair(now)
	b.int(n)
	b.pair(lb.Rate)
	b.pair(nPer)
	b.pair(room)
	b.str(how)
	b.int(s.cfg.ClockSkew.Milliseconds())
	if how == "2" {
		b.pair(mark)
	}
}

// gcraState decodes the GCRA script's reply r for a bucket of the given
// rate: the state after the call, and whether the units were poured.
func (s *Store) gcraState(r rueidis.RedisResult, rate int64) (algo.LeakyBucketState, bool, error) {
	arr, err := r.ToArray()
	if err != nil || len(arr) != 3 {
		return algo.LeakyBucketState{}, false, s.badValue(kindGCRA, fmt.Errorf("reply of %d elements, want 3 (%v)", len(arr), err))
	}
	poured, err1 := arr[0].ToInt64()
	tat, err2 := arr[1].ToString()
	frac, err3 := arr[2].ToString()
	if err := errors.Join(err1, err2, err3); err != nil {
		return algo.LeakyBucketState{}, false, s.badValue(kindGCRA, err)
	}
	st, ok, err := DecodeGCRAState(poured, tat, frac, rate)
	if err != nil {
		return algo.LeakyBucketState{}, false, s.badValue(kindGCRA, err)
	}
	return st, ok, nil
}

// GCRABatch runs every op as GCRA does, in one pipeline, and sets each op's
// Result or Err. Ops fail independently; ops on one key take effect in the
// order given. It returns within Timeout and keeps no reference to ops.
func (s *Store) GCRABatch(ctx context.Context, ops []GCRAOp) {
	scriptBatch(s, ctx, ops)
}

// gcraCodec is GCRAOp's part of scriptBatch (see scripted).
type gcraCodec struct{}

func (gcraCodec) add(s *Store, b *batch, op *GCRAOp) error {
	if err := op.Params.Validate(); err != nil {
		return err
	}
	return s.addGCRA(b, op.Key, algo.LeakyBucket(op.Params), op.Now, op.N, op.Conditional)
}

func (gcraCodec) decode(s *Store, op *GCRAOp, r rueidis.RedisResult) (result, error) {
	st, ok, err := s.gcraState(r, op.Params.Rate)
	if err != nil {
		return resultBadValue, err
	}
	lb := algo.LeakyBucket(op.Params)
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
func DecodeGCRAState(poured int64, tat, frac string, rate int64) (algo.LeakyBucketState, bool, error) {
	if poured != 0 && poured != 1 {
		return algo.LeakyBucketState{}, false, fmt.Errorf("poured %d, want 0 or 1", poured)
	}
	t, err := strconv.ParseInt(tat, 10, 64)
	if err != nil {
		return algo.LeakyBucketState{}, false, fmt.Errorf("tat: %w", err)
	}
	f, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return algo.LeakyBucketState{}, false, fmt.Errorf("frac: %w", err)
	}
	if f < 0 || f >= rate {
		return algo.LeakyBucketState{}, false, fmt.Errorf("frac %d outside [0, %d)", f, rate)
	}
	return algo.LeakyBucketState{TAT: t, Frac: f}, poured == 1, nil
}
