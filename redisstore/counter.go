package redisstore

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/redis/rueidis"
)

// appendTag appends "pl:{<16 hex digits of key>}", the prefix of every key
// the Store writes for key: the hash tag holds the key hash alone, so all of
// a key's windows, its bucket and its log share one cluster slot.
func appendTag(dst []byte, key uint64) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, "pl:{"...)
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hex[(key>>uint(shift))&0xf])
	}
	return append(dst, '}')
}

// AppendCounterKey appends to dst the Redis key of the counter of key for
// the window starting at start (Unix milliseconds), pl:{%016x}:%d, the
// name shardproxy gives it in memcached, and returns the extended slice.
// It does not allocate when dst has room (at most 42 bytes).
func AppendCounterKey(dst []byte, key uint64, start int64) []byte {
	dst = append(appendTag(dst, key), ':')
	return strconv.AppendInt(dst, start, 10)
}

// ttlMillis is a counter's TTL in whole milliseconds, rounded up, and at
// least one second as in memcached and store.MemStore.
func ttlMillis(ttl time.Duration) int64 {
	return max(int64((ttl+time.Millisecond-1)/time.Millisecond), 1000)
}

// errNegative is the decoding error of a counter below zero.
var errNegative = errors.New("counter below zero")

// ParseCounter decodes a stored counter: the decimal digits of an integer
// from 0 to math.MaxInt64 (what INCRBY keeps), nothing else.
func ParseCounter(b string) (uint64, error) {
	if len(b) == 0 || len(b) > 19 {
		return 0, strconv.ErrSyntax
	}
	if b[0] == '-' {
		return 0, errNegative
	}
	for i := 0; i < len(b); i++ {
		if b[i] < '0' || b[i] > '9' {
			return 0, strconv.ErrSyntax
		}
	}
	v, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		return 0, err
	}
	return uint64(v), nil
}

// Do performs ops as one pipeline and sets each op's Value or Err: an
// increment or a decrement is one call of the counter script (an increment
// INCRBY, then PEXPIRE with the op's TTL when that created the counter; a
// decrement clamped at 0, the TTL kept, a missing counter left missing and
// read as 0), a read a GET (a missing counter reads 0). Ops on one counter take
// effect in the order given. Ops fail independently: an error reply, or a
// value that does not decode, fails its op alone; a node that does not
// answer fails its ops with ErrTimeout within Timeout. Do returns within
// Timeout and keeps no reference to ops.
func (s *Store) Do(ctx context.Context, ops []store.Op) {
	if len(ops) == 0 {
		return
	}
	c, err := s.client(kindOfDelta(ops[0].Delta))
	if err != nil {
		var errs [numKinds]error // one error per kind, not per op
		for i := range ops {
			k := kindOfDelta(ops[i].Delta)
			if errs[k] == nil {
				_, errs[k] = s.client(k)
			}
			ops[i].Value, ops[i].Err = 0, errs[k]
			s.m.ops[k][resultUnavailable].Inc()
		}
		return
	}
	b := s.getBatch()
	for i := range ops {
		op := &ops[i]
		if op.Delta == 0 {
			b.begin(scriptGet, 1)
			b.buf = AppendCounterKey(b.buf, op.Key, op.Start)
			b.end()
			continue
		}
		b.begin(scriptCounter, 1)
		b.buf = AppendCounterKey(b.buf, op.Key, op.Start)
		b.end()
		b.int(op.Delta)
		b.int(ttlMillis(op.TTL))
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	d, abandoned, closed := s.exec(cctx, c, b)
	cancel()
	took := d.Seconds()
	answered, failed := false, false
	var memo errMemo
	for i := range ops {
		op := &ops[i]
		k := kindOfDelta(op.Delta)
		var (
			v   uint64
			res result
			err error
		)
		switch {
		case abandoned:
			err, res = s.abandonedErr(ctx, k, &memo)
		case closed:
			err, res = s.closedErr(k, &memo)
		default:
			v, res, err = s.counterReply(ctx, k, op.Delta, b, i, &memo)
		}
		op.Value, op.Err = v, err
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

// counterReply decodes the reply to the i-th op of a Do call.
func (s *Store) counterReply(ctx context.Context, k opKind, delta int64, b *batch, i int, memo *errMemo) (uint64, result, error) {
	r := b.res[i]
	if k == kindGet {
		if rueidis.IsRedisNil(r.Error()) {
			return 0, resultMiss, nil
		}
	}
	if err, res, _ := s.opError(ctx, k, r.Error(), memo); err != nil {
		return 0, res, err
	}
	if k == kindGet {
		str, err := r.ToString()
		if err != nil {
			return 0, resultBadValue, s.badValue(k, err)
		}
		v, err := ParseCounter(str)
		if err != nil {
			return 0, resultBadValue, s.badValue(k, err)
		}
		return v, resultOK, nil
	}
	v, err := r.ToInt64()
	switch {
	case err != nil:
		return 0, resultBadValue, s.badValue(k, err)
	case k == kindDecr && v == -1:
		return 0, resultMiss, nil
	case v < 0:
		return 0, resultBadValue, s.badValue(k, errNegative)
	case k == kindIncr && v == delta:
		return uint64(v), resultMiss, nil
	}
	return uint64(v), resultOK, nil
}

// kindOfDelta returns the kind of a counter op with the given delta.
func kindOfDelta(delta int64) opKind {
	switch {
	case delta > 0:
		return kindIncr
	case delta < 0:
		return kindDecr
	}
	return kindGet
}
