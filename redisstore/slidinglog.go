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

// MaxLogWindow is the longest window a shared sliding log takes: its scores
// are nanoseconds since a per-key epoch that the script moves forward every
// 2^52 ns, which keeps every score below 2^53, where doubles are exact, only
// while no entry is older than that.
const MaxLogWindow = time.Duration(1 << 52) // about 52 days

// SlidingLogParams configures a shared sliding log: the fields of
// algo.SlidingLog.
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

// SlidingLog runs algo.SlidingLog on the shared log of key, atomically on
// the node that holds it: with conditional set it is SlidingLog.Allow (log n
// units at now if and only if they fit), without it SlidingLog.Add (log
// them whatever the count, to count attempts). As in algo.SlidingLog, now
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
	err := algo.SlidingLog(p).Validate()
	if p.Window <= MaxLogWindow && p.Limit <= int64(maxEntries) {
		return err // nil on the hot path, without allocating
	}
	errs := []error{err}
	if p.Window > MaxLogWindow {
		errs = append(errs, fmt.Errorf("SlidingLogParams.Window %v: must be at most %v", p.Window, MaxLogWindow))
	}
	if p.Limit > int64(maxEntries) {
		errs = append(errs, fmt.Errorf("SlidingLogParams.Limit %d: must be at most MaxLogEntries (%d)", p.Limit, maxEntries))
	}
	return errors.Join(errs...)
}

// addLog appends the sliding-log script's command for n units at now of
// the log of key, or returns why it cannot run.
func (s *Store) addLog(b *batch, key uint64, p SlidingLogParams, now, n int64, conditional bool) error {
	how := "0"
	if conditional {
		how = "1"
	}
	return s.addLogScript(b, key, p, now, n, how, 0)
}

// addLogGiveBack appends the sliding-log script's command that takes back
// n units logged at the instant mark (algo.SlidingLog.GiveBack).
func (s *Store) addLogGiveBack(b *batch, key uint64, p SlidingLogParams, now, n, mark int64) error {
	return s.addLogScript(b, key, p, now, n, "2", mark)
}

// addLogScript appends the sliding-log script's command: how is "0" (log),
// "1" (log if the units conform) or "2" (give back the units logged at
// mark, the script's one more argument).
func (s *Store) addLogScript(b *batch, key uint64, p SlidingLogParams, now, n int64, how string, mark int64) error {
	if err := p.validate(s.cfg.MaxLogEntries); err != nil {
		return err
	}
	b.begin(scriptSlidingLog, 2)
	b.buf = append(appendTag(b.buf, key), ":log"...)
	b.end()
	b.buf = append(appendTag(b.buf, key), ":logm"...)
	b.end()
	b.pair(now)
	b.int(n)
	b.int(p.Limit)
	b.pair(int64(p.Window))
	b.str(how)
	b.int(int64((p.Window+time.Millisecond-1)/time.Millisecond) + s.cfg.ClockSkew.Milliseconds())
	b.int(int64(s.cfg.MaxLogEntries))
	if how == "2" {
		b.pair(mark)
	}
	return nil
}

// SlidingLogBatch runs every op as SlidingLog does, in one pipeline, and sets
// each op's Result or Err. Ops fail independently; ops on one key take
// effect in the order given. It returns within Timeout and keeps no
// reference to ops.
func (s *Store) SlidingLogBatch(ctx context.Context, ops []SlidingLogOp) {
	scriptBatch(s, ctx, ops)
}

// logCodec is SlidingLogOp's part of scriptBatch (see scripted).
type logCodec struct{}

func (logCodec) add(s *Store, b *batch, op *SlidingLogOp) error {
	return s.addLog(b, op.Key, op.Params, op.Now, op.N, op.Conditional)
}

func (logCodec) decode(s *Store, op *SlidingLogOp, r rueidis.RedisResult) (result, error) {
	res, err := s.logResult(r, op.Params.Limit)
	if err != nil {
		return resultBadValue, err
	}
	op.Result = res
	return resultOK, nil
}

// logResult decodes the sliding-log script's reply r for a log of the
// given limit.
func (s *Store) logResult(r rueidis.RedisResult, limit int64) (SlidingLogResult, error) {
	const k = kindSlidingLog
	arr, err := r.ToArray()
	if err != nil || len(arr) != 4 {
		return SlidingLogResult{}, s.badValue(k, fmt.Errorf("reply of %d elements, want 4 (%v)", len(arr), err))
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
		return SlidingLogResult{}, s.badValue(k, err)
	}
	res, err := DecodeSlidingLog(logged, count, oldest, release, limit)
	if err != nil {
		return SlidingLogResult{}, s.badValue(k, err)
	}
	return res, nil
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
