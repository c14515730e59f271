package redisstore

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/poplimit/poplimit/window"
)

var _ window.StateStore = (*Store)(nil)

// DoState implements window.StateStore: each op is one call of the GCRA
// script (window.StateGCRA, the key's bucket pl:{…}:gcra) or of the
// sliding-log script (window.StateLog, the key's log pl:{…}:log and
// pl:{…}:logm), all of a call's ops of both kinds in one pipeline, as
// GCRABatch and SlidingLogBatch run them. Ops on one key take effect in
// the order given. Ops fail independently: arguments that op.Validate or
// this store refuses (a log's Window beyond MaxLogWindow, its Limit beyond
// Config.MaxLogEntries, a pour whose n × Per overflows) fail with
// ErrInvalid and send nothing; an error reply (WRONGTYPE for a key of
// another type) with ErrReply; a stored state or a reply that does not
// decode with ErrBadValue; no answer with ErrTimeout or ErrUnavailable,
// within Timeout. Every op is counted in ops_total under "gcra" or
// "sliding_log" (an op of an unknown Kind under "gcra", as invalid). It
// keeps no reference to ops.
//
// The outputs are window.MemStore's, computed by window.LeakyBucket and
// from the log script's reply: for a bucket TAT and Frac are the state
// after the op, Remaining and ReleaseAt derived from it at Now; for a log
// Now is clamped to the latest Now the key has seen, and TAT and Frac are
// 0. Where the stores differ: a stored bucket whose Frac is Rate or more
// (poured under another rate) reads here as Rate − 1 (MemStore: 0, the TAT
// kept either way), a negative one is ErrBadValue; the log's latest Now is
// advanced by every op, reads and refusals too, as window.SlidingLog
// advances it (MemStore keeps only what a write stored); unconditional
// log ops stop logging at Config.MaxLogEntries units per key.
func (s *Store) DoState(ctx context.Context, ops []window.StateOp) {
	scriptBatch(s, ctx, ops)
}

// stateCodec is window.StateOp's part of scriptBatch (see scripted).
type stateCodec struct{}

// kind is op's "op" label: an op of an unknown Kind, which fails as
// invalid, counts as "gcra".
func (stateCodec) kind(op *window.StateOp) opKind {
	if op.Kind == window.StateLog {
		return kindSlidingLog
	}
	return kindGCRA
}

func (stateCodec) fail(op *window.StateOp) {
	op.Allowed, op.Remaining, op.ReleaseAt, op.TAT, op.Frac = false, 0, 0, 0, 0
}

func (stateCodec) add(s *Store, b *batch, op *window.StateOp) error {
	if err := op.Validate(); err != nil {
		return err
	}
	if op.Kind == window.StateGCRA {
		return s.addGCRA(b, op.Key, op.Bucket, op.Now, op.N, op.Conditional)
	}
	return s.addLog(b, op.Key, SlidingLogParams(op.Log), op.Now, op.N, op.Conditional)
}

func (stateCodec) decode(s *Store, op *window.StateOp, r rueidis.RedisResult) (result, error) {
	if op.Kind == window.StateGCRA {
		st, ok, err := s.gcraState(r, op.Bucket.Rate)
		if err != nil {
			return resultBadValue, err
		}
		lb := op.Bucket
		op.Allowed, op.TAT, op.Frac = ok, st.TAT, st.Frac
		op.Remaining, op.ReleaseAt = lb.Remaining(st, op.Now), lb.Release(st, op.Now, op.N)
		return resultOK, nil
	}
	res, err := s.logResult(r, op.Log.Limit)
	if err != nil {
		return resultBadValue, err
	}
	op.Allowed, op.Remaining, op.ReleaseAt, op.TAT, op.Frac = res.Allowed, res.Remaining, res.ReleaseAt, 0, 0
	return resultOK, nil
}
