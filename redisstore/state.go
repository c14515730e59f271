package redisstore

import (
	"context"

	"github.com/poplimit/poplimit/store"
	"github.com/redis/rueidis"
)

var _ store.StateStore = (*Store)(nil)

// DoState implements store.StateStore: each op is one call of the GCRA
// script (store.StateGCRA, the key's bucket pl:{…}:gcra) or of the
// sliding-log script (store.StateLog, the key's log pl:{…}:log and
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
// The outputs are store.MemStore's, computed by algo.LeakyBucket and
// from the log script's reply: for a bucket TAT and Frac are the state
// after the op, Remaining and ReleaseAt derived from it at Now; for a log
// Now is clamped to the latest Now the key has seen, and TAT and Frac are
// 0. Where the stores differ: a stored bucket whose Frac is Rate or more
// (poured under another rate) reads here as Rate − 1 (MemStore: 0, the TAT
// kept either way), a negative one is ErrBadValue; the log's latest Now is
// advanced by every op, reads and refusals too, as algo.SlidingLog
// advances it (MemStore keeps only what a write stored); unconditional
// log ops stop logging at Config.MaxLogEntries units per key.
func (s *Store) DoState(ctx context.Context, ops []store.StateOp) {
	scriptBatch(s, ctx, ops)
}

// stateCodec is store.StateOp's part of scriptBatch (see scripted).
type stateCodec struct{}

// kind is op's "op" label: an op of an unknown Kind, which fails as
// invalid, counts as "gcra".
func (stateCodec) kind(op *store.StateOp) opKind {
	if op.Kind == store.StateLog {
		return kindSlidingLog
	}
	return kindGCRA
}

func (stateCodec) fail(op *store.StateOp) {
	op.Allowed, op.Remaining, op.ReleaseAt, op.TAT, op.Frac = false, 0, 0, 0, 0
}

func (stateCodec) add(s *Store, b *batch, op *store.StateOp) error {
	if err := op.Validate(); err != nil {
		return err
	}
	if op.Kind == store.StateGCRA && op.GiveBack {
		return s.addGCRAGiveBack(b, op.Key, op.Bucket, op.Now, op.N, op.Mark)
	}
	if op.Kind == store.StateGCRA {
		return s.addGCRA(b, op.Key, op.Bucket, op.Now, op.N, op.Conditional)
	}
	if op.GiveBack {
		return s.addLogGiveBack(b, op.Key, SlidingLogParams(op.Log), op.Now, op.N, op.Mark)
	}
	return s.addLog(b, op.Key, SlidingLogParams(op.Log), op.Now, op.N, op.Conditional)
}

func (stateCodec) decode(s *Store, op *store.StateOp, r rueidis.RedisResult) (result, error) {
	if op.Kind == store.StateGCRA {
		st, ok, err := s.gcraState(r, op.Bucket.Rate)
		if err != nil {
			return resultBadValue, err
		}
		lb := op.Bucket
		op.Allowed, op.TAT, op.Frac = ok, st.TAT, st.Frac
		op.Remaining, op.ReleaseAt = lb.Remaining(st, op.Now), lb.Release(st, op.Now, op.N)
		if op.GiveBack {
			op.ReleaseAt = lb.Release(st, op.Now, 1)
		}
		return resultOK, nil
	}
	res, err := s.logResult(r, op.Log.Limit)
	if err != nil {
		return resultBadValue, err
	}
	op.Allowed, op.Remaining, op.ReleaseAt, op.TAT, op.Frac = res.Allowed, res.Remaining, res.ReleaseAt, 0, 0
	return resultOK, nil
}
