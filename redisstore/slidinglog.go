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

// MaxLogWindow is the longest window a shared sliding log takes: its scores
// are nanoseconds since a per-key epoch that the script moves forward every
// 2^52 ns, which keeps every score below 2^53, where doubles are exact, only
// while no entry is older than that.
const MaxLogWindow = time.Duration(1 << 52) // about 52 days

// SlidingLogParams configures a shared sliding log: the fields of
// window.SlidingLog.
type SlidingLogParams struct {
	Limit  int64         // the most units Allow admits in any window, > 0
	Window time.Duration // the window's length, > 0 and at most MaxLogWindow
}

// SlidingLogResult is the outcome of one SlidingLog call.
type SlidingLogResult struct {
	// Allowed: the n units were logged. Always true for an unconditional
	// call (which logs them, up to Config.MaxLogEntries per key) and for
	// n ≤ 0 (which log nothing).
	Allowed bool
	// Count is the units in the window (now − Window, now] after the call.
	Count int64
	// Oldest is the instant of the oldest unit in the window, Unix ns; 0
	// when Count is 0.
	Oldest int64
	// Remaining is max(0, Limit − Count).
	Remaining int64
	// ReleaseAt is the first instant ≥ now, Unix ns, at which n more units
	// would fit if nothing more were logged: now (clamped, as below) when
	// they fit, the instant enough logged units leave the window otherwise,
	// math.MaxInt64 when n > Limit.
	ReleaseAt int64
}

// SlidingLogOp is one call of SlidingLogBatch: its arguments, and its Result
// or Err, set by SlidingLogBatch.
type SlidingLogOp struct {
	Key         uint64 // hash of rule and client key
	Params      SlidingLogParams
	Now         int64 // Unix ns, the caller's clock
	N           int64 // units
	Conditional bool  // log only if they fit (Allow); else log them whatever the count (Add)

	Result SlidingLogResult
	Err    error
}

// SlidingLog runs window.SlidingLog on the shared log of key, atomically on
// the node that holds it: with conditional set it is SlidingLog.Allow (log n
// units at now if and only if they fit), without it SlidingLog.Add (log
// them whatever the count, to count attempts). As in window.SlidingLog, now
// is clamped to the latest now any caller passed for the key, so a caller
// whose clock is behind logs at the latest instant seen. Each unit is one
// member of a sorted set, so a key holds at most max(Limit,
// Config.MaxLogEntries) members: the exact log is for small limits such as
// logins. It is SlidingLogBatch with one op.
func (s *Store) SlidingLog(ctx context.Context, key uint64, p SlidingLogParams, now, n int64, conditional bool) (SlidingLogResult, error) {
	ops := [1]SlidingLogOp{{Key: key, Params: p, Now: now, N: n, Conditional: conditional}}
	s.SlidingLogBatch(ctx, ops[:])
	return ops[0].Result, ops[0].Err
}

// validate reports why p cannot run with a store of at most maxEntries
// members per key.
func (p SlidingLogParams) validate(maxEntries int) error {
	errs := []error{window.SlidingLog(p).Validate()}
	if p.Window > MaxLogWindow {
		errs = append(errs, fmt.Errorf("SlidingLogParams.Window %v: must be at most %v", p.Window, MaxLogWindow))
	}
	if p.Limit > int64(maxEntries) {
		errs = append(errs, fmt.Errorf("SlidingLogParams.Limit %d: must be at most MaxLogEntries (%d)", p.Limit, maxEntries))
	}
	return errors.Join(errs...)
}

// SlidingLogBatch runs every op as SlidingLog does, in one pipeline, and sets
// each op's Result or Err. Ops fail independently; ops on one key take
// effect in the order given. It returns within Timeout and keeps no
// reference to ops.
func (s *Store) SlidingLogBatch(ctx context.Context, ops []SlidingLogOp) {
	if len(ops) == 0 {
		return
	}
	const k = kindSlidingLog
	c, err := s.client(k)
	if err != nil {
		for i := range ops {
			ops[i].Result, ops[i].Err = SlidingLogResult{}, err
			s.m.ops[k][resultUnavailable].Inc()
		}
		return
	}
	b := s.getBatch()
	for i := range ops {
		op := &ops[i]
		if err := op.Params.validate(s.cfg.MaxLogEntries); err != nil {
			op.Result, op.Err = SlidingLogResult{}, fmt.Errorf("redisstore: %s %s: %w: %w", k, s.addr, ErrInvalid, err)
			s.m.ops[k][resultInvalid].Inc()
			continue
		}
		b.begin(scriptSlidingLog, 2)
		op.Err = errPending
		b.buf = append(appendTag(b.buf, op.Key), ":log"...)
		b.end()
		b.buf = append(appendTag(b.buf, op.Key), ":logm"...)
		b.end()
		b.pair(op.Now)
		b.int(op.N)
		b.int(op.Params.Limit)
		b.pair(int64(op.Params.Window))
		if op.Conditional {
			b.str("1")
		} else {
			b.str("0")
		}
		b.int(int64((op.Params.Window+time.Millisecond-1)/time.Millisecond) + s.cfg.ClockSkew.Milliseconds())
		b.int(int64(s.cfg.MaxLogEntries))
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
			err, res = s.abandonedErr(ctx, k, &memo)
		case closed:
			err, res = s.closedErr(k, &memo)
		default:
			res, err = s.logReply(ctx, op, b.res[j-1], &memo)
		}
		if err != nil {
			op.Result = SlidingLogResult{}
		}
		op.Err = err
		answered = answered || res != resultTimeout && res != resultUnavailable
		failed = failed || (res == resultTimeout || res == resultUnavailable) && !cancelled(ctx)
		s.m.ops[k][res].Inc()
		s.m.latency[k].Observe(took)
	}
	if !abandoned {
		s.putBatch(b)
	}
	s.settled(answered, failed)
}

// logReply decodes the script's reply to op into op.Result.
func (s *Store) logReply(ctx context.Context, op *SlidingLogOp, r rueidis.RedisResult, memo *errMemo) (result, error) {
	const k = kindSlidingLog
	if err, res, _ := s.opError(ctx, k, r.Error(), memo); err != nil {
		return res, err
	}
	arr, err := r.ToArray()
	if err != nil || len(arr) != 4 {
		return resultBadValue, s.badValue(k, fmt.Errorf("reply of %d elements, want 4 (%v)", len(arr), err))
	}
	logged, err1 := arr[0].ToInt64()
	count, err2 := arr[1].ToInt64()
	oldest := ""
	var err3 error
	if !arr[2].IsNil() {
		oldest, err3 = arr[2].ToString()
	}
	release, err4 := arr[3].ToString()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return resultBadValue, s.badValue(k, err)
	}
	res, err := DecodeSlidingLog(logged, count, oldest, release, op.Params.Limit)
	if err != nil {
		return resultBadValue, s.badValue(k, err)
	}
	op.Result = res
	return resultOK, nil
}

// DecodeSlidingLog decodes the sliding-log script's reply: logged is 1 or
// 0, count the units in the window (0 to at most 2^53), oldest the oldest
// entry's instant in decimal (empty when count is 0), release the release
// instant in decimal, or "never".
func DecodeSlidingLog(logged, count int64, oldest, release string, limit int64) (SlidingLogResult, error) {
	var r SlidingLogResult
	if logged != 0 && logged != 1 {
		return r, fmt.Errorf("logged %d, want 0 or 1", logged)
	}
	if count < 0 || count > 1<<53 {
		return r, fmt.Errorf("count %d out of range", count)
	}
	if (oldest == "") != (count == 0) {
		return r, fmt.Errorf("oldest %q with count %d", oldest, count)
	}
	if oldest != "" {
		v, err := strconv.ParseInt(oldest, 10, 64)
		if err != nil {
			return r, fmt.Errorf("oldest: %w", err)
		}
		r.Oldest = v
	}
	if release == "never" {
		r.ReleaseAt = math.MaxInt64
	} else {
		v, err := strconv.ParseInt(release, 10, 64)
		if err != nil {
			return r, fmt.Errorf("release: %w", err)
		}
		r.ReleaseAt = v
	}
	r.Allowed, r.Count, r.Remaining = logged == 1, count, max(0, limit-count)
	return r, nil
}
