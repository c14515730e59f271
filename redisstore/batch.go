package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/store"
	"github.com/redis/rueidis"
)

// batch is one call's commands under construction and their replies. The
// keys and arguments of every command are appended to buf; exec copies buf
// into one string and slices each command's strings out of it, so a call
// costs one allocation for all of them, and buf is reused from call to call.
// (The string, not buf, is what rueidis may still hold after a call that
// timed out, so reusing buf is safe.)
type batch struct {
	buf  []byte
	ends []int32 // end offset in buf of each string
	reqs []req
	strs []string // scratch: one command's strings
	cmds rueidis.Commands
	res  []rueidis.RedisResult
	redo []int32 // indices of commands answered NOSCRIPT
	all  string  // buf, as built for the call

	// state hands the batch between the caller and the goroutine that
	// runs its round trips (Store.exec): whoever loses the race to set it
	// from callRunning no longer owns the batch.
	state atomic.Int32
	done  chan struct{} // the goroutine's "finished", cap 1
}

const (
	callRunning int32 = iota
	callFinished
	callAbandoned
)

// req is one command: a script (or a GET), its strings ends[first:first+n],
// the first nkeys of them keys.
type req struct {
	id    scriptID
	nkeys uint8
	n     uint8
	first int32
}

// maxPooledBytes is the largest buf a batch keeps when it goes back to the
// pool: a call far larger than the flusher's does not pin its memory.
const maxPooledBytes = 1 << 20

func (s *Store) getBatch() *batch {
	if b, _ := s.batches.Get().(*batch); b != nil {
		return b
	}
	return &batch{done: make(chan struct{}, 1)}
}

func (s *Store) putBatch(b *batch) {
	if cap(b.buf) > maxPooledBytes {
		return
	}
	clear(b.cmds[:cap(b.cmds)])
	clear(b.res[:cap(b.res)])
	clear(b.strs[:cap(b.strs)])
	b.buf, b.ends, b.reqs, b.strs = b.buf[:0], b.ends[:0], b.reqs[:0], b.strs[:0]
	b.cmds, b.res, b.redo, b.all = b.cmds[:0], b.res[:0], b.redo[:0], ""
	s.batches.Put(b)
}

// begin starts a command; its strings follow, each closed by end.
func (b *batch) begin(id scriptID, nkeys int) {
	b.reqs = append(b.reqs, req{id: id, nkeys: uint8(nkeys), first: int32(len(b.ends))})
}

// end closes the string appended to buf since the previous one.
func (b *batch) end() {
	b.ends = append(b.ends, int32(len(b.buf)))
	b.reqs[len(b.reqs)-1].n++
}

func (b *batch) int(v int64) {
	b.buf = strconv.AppendInt(b.buf, v, 10)
	b.end()
}

// pair appends v as the two arguments the scripts read an int64 from (arg
// in luaInt64): h = ⌊v / 10^9⌋ and l = v − h × 10^9, each exact in a double.
func (b *batch) pair(v int64) {
	h, l := v/1e9, v%1e9
	if l < 0 {
		h, l = h-1, l+1e9
	}
	b.int(h)
	b.int(l)
}

func (b *batch) str(v string) {
	b.buf = append(b.buf, v...)
	b.end()
}

// strings returns the strings of r, sliced out of b.all.
func (b *batch) strings(r req) []string {
	b.strs = b.strs[:0]
	for i := r.first; i < r.first+int32(r.n); i++ {
		lo := int32(0)
		if i > 0 {
			lo = b.ends[i-1]
		}
		b.strs = append(b.strs, b.all[lo:b.ends[i]])
	}
	return b.strs
}

// build returns the command of r: GET, EVALSHA, or EVAL when eval is set.
func (b *batch) build(c rueidis.Client, r req, eval bool) rueidis.Completed {
	ss := b.strings(r)
	if r.id == scriptGet {
		return c.B().Get().Key(ss[0]).Build()
	}
	sc := &scripts[r.id]
	keys, args := ss[:r.nkeys], ss[r.nkeys:]
	if eval {
		return c.B().Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// exec runs the batch's commands within ctx and returns how long that took.
// It returns abandoned true when ctx ended first: the round trips go on,
// bounded by rueidis' own timeouts, on a goroutine that now owns b and puts
// it back in the pool when done, so the caller must not touch b again. It
// returns closed true, having sent nothing, after Close.
//
// The goroutine is there because rueidis does not always return at the
// caller's deadline: a call that finds its connection being dialled by
// another goroutine waits for that dial, whatever its own context says; a
// dial that a caller started is bounded by that caller's deadline, but one
// that rueidis starts itself (a cluster's topology refresh) only by
// DialTimeout. Its owner is the call, and Close waits for it. A goroutine
// costs the call two hand-overs between goroutines, which on a small busy
// machine is a good part of a loopback round trip, so a call of one command
// on a steady Store (no call has gone unanswered for ConnTimeout +
// DialTimeout) runs on the caller's goroutine instead: its connections are
// up, and a connection that breaks is dialled again by the caller that
// finds it broken, within that caller's deadline. See steady.
func (s *Store) exec(ctx context.Context, c rueidis.Client, b *batch) (took time.Duration, abandoned, closed bool) {
	start := time.Now()
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return 0, false, true
	}
	s.wg.Add(1)
	s.closeMu.RUnlock()
	b.state.Store(callRunning)
	if len(b.reqs) == 1 && s.steady(start) {
		s.run(ctx, c, b)
		<-b.done
		return time.Since(start), false, false
	}
	go s.run(ctx, c, b)
	select {
	case <-b.done:
	case <-ctx.Done():
		if b.state.CompareAndSwap(callRunning, callAbandoned) {
			return time.Since(start), true, false
		}
		<-b.done // it finished meanwhile
	}
	return time.Since(start), false, false
}

// run does the round trips of exec: every command in one pipeline (rueidis
// splits it by node in a cluster), then the ones answered NOSCRIPT once
// more as EVAL, all within ctx; b.res holds one reply per command.
//
// A command answered NOSCRIPT did nothing, so running it in a second round
// would put it after the commands that followed it in the first. Every
// write of one Redis key is one script (a counter's the counter script, a
// bucket's the GCRA script, a log's the sliding-log script), so on one node
// either all of a call's writes of a key find their script or none does,
// and writes of one key keep their order (a DoState call mixes the GCRA and
// the sliding-log script, but over different keys); the reads (GETs) that
// followed a re-sent write of the same key go again in the second round,
// after it. (A script flushed and loaded again by another client while one
// call's pipeline is on the server can still reorder that call's writes of
// one key; nothing else can.)
func (s *Store) run(ctx context.Context, c rueidis.Client, b *batch) {
	defer s.wg.Done()
	b.all = string(b.buf)
	b.cmds = b.cmds[:0]
	for _, r := range b.reqs {
		b.cmds = append(b.cmds, b.build(c, r, false))
	}
	b.res = append(b.res[:0], c.DoMulti(ctx, b.cmds...)...)
	b.disown(b.res)
	b.planRedo()
	if len(b.redo) > 0 {
		b.cmds = b.cmds[:0]
		for _, i := range b.redo {
			r := b.reqs[i]
			if r.id != scriptGet {
				s.m.fallbacks[r.id].Inc()
			}
			b.cmds = append(b.cmds, b.build(c, r, true))
		}
		redone := c.DoMulti(ctx, b.cmds...)
		b.disown(redone)
		for j, res := range redone {
			b.res[b.redo[j]] = res
		}
	}
	if b.state.CompareAndSwap(callRunning, callFinished) {
		b.done <- struct{}{}
		return
	}
	s.putBatch(b) // the caller gave up on it
}

// disown lets go of b.cmds when rueidis may still hold the slice given
// to DoMulti, which res answered. A call that ends on its context (or on a
// broken connection) returns while its commands may still wait in the
// connection's queue, and rueidis's writer and reader read them from that
// slice when they get to them. A pooled batch would write the next call's
// commands over them: rueidis would then send one command twice (one
// request counted twice), or, after putBatch clears the slice, dereference
// a cleared command and crash the process. A call that every reply
// answered (Redis errors included) has been written and read whole, and
// keeps its slice.
func (b *batch) disown(res []rueidis.RedisResult) {
	for i := range res {
		if res[i].NonRedisError() != nil {
			b.cmds = nil
			return
		}
	}
}

// planRedo sets b.redo to the commands of the second round: those answered
// NOSCRIPT, and each GET that follows one of them on the same key, in their
// order in the call.
func (b *batch) planRedo() {
	b.redo = b.redo[:0]
	var keys map[string]struct{} // keys of re-sent writes; the rare path may allocate
	for i := range b.res {
		r := b.reqs[i]
		if r.id == scriptGet {
			if keys != nil {
				if _, ok := keys[b.strings(r)[0]]; ok {
					b.redo = append(b.redo, int32(i))
				}
			}
			continue
		}
		if re, ok := rueidis.IsRedisErr(b.res[i].Error()); ok && re.IsNoScript() {
			b.redo = append(b.redo, int32(i))
			if keys == nil {
				keys = make(map[string]struct{})
			}
			for _, k := range b.strings(r)[:r.nkeys] {
				keys[k] = struct{}{}
			}
		}
	}
}

// scripted is the type of the ops of a scripted batch. Each has a codec
// (gcraCodec, logCodec, stateCodec) that validates an op and appends its
// command, decodes its reply, and clears its outputs.
type scripted interface {
	GCRAOp | SlidingLogOp | store.StateOp
}

// The per-type parts of scriptBatch go to the op's codec through a type
// switch, not through the methods of a type parameter: the compiler calls
// those through a dictionary and so moves every slice of ops passed in to
// the heap (one allocation a GCRA or SlidingLog call), where the calls of a
// type switch are direct and the ops stay where the caller put them.

// opHead returns op's kind (its "op" label) and the address of its Err.
func opHead[T scripted](op *T) (opKind, *error) {
	switch op := any(op).(type) {
	case *GCRAOp:
		return kindGCRA, &op.Err
	case *SlidingLogOp:
		return kindSlidingLog, &op.Err
	case *store.StateOp:
		return stateCodec{}.kind(op), &op.Err
	}
	panic("redisstore: not a scripted op")
}

// opAdd validates op and appends its one command to b, or returns why op
// cannot run, having appended nothing.
func opAdd[T scripted](s *Store, b *batch, op *T) error {
	switch op := any(op).(type) {
	case *GCRAOp:
		return gcraCodec{}.add(s, b, op)
	case *SlidingLogOp:
		return logCodec{}.add(s, b, op)
	case *store.StateOp:
		return stateCodec{}.add(s, b, op)
	}
	panic("redisstore: not a scripted op")
}

// opDecode sets op's outputs from r, a reply that is not an error.
func opDecode[T scripted](s *Store, op *T, r rueidis.RedisResult) (result, error) {
	switch op := any(op).(type) {
	case *GCRAOp:
		return gcraCodec{}.decode(s, op, r)
	case *SlidingLogOp:
		return logCodec{}.decode(s, op, r)
	case *store.StateOp:
		return stateCodec{}.decode(s, op, r)
	}
	panic("redisstore: not a scripted op")
}

// opFail clears op's outputs and sets its Err.
func opFail[T scripted](op *T, err error) {
	switch op := any(op).(type) {
	case *GCRAOp:
		op.Result = GCRAResult{}
	case *SlidingLogOp:
		op.Result = SlidingLogResult{}
	case *store.StateOp:
		stateCodec{}.fail(op)
	}
	_, errp := opHead(op)
	*errp = err
}

// scriptBatch is the one send/collect loop of every scripted batch
// (GCRABatch, SlidingLogBatch, DoState): it validates each op and appends
// its command, sends all of them in one pipeline within Timeout (exec),
// and sets each op's outputs or Err from its reply, counting each op in
// ops_total and op_duration_seconds. Ops fail independently; an invalid op
// fails with ErrInvalid and sends nothing. It keeps no reference to ops.
func scriptBatch[T scripted](s *Store, ctx context.Context, ops []T) {
	if len(ops) == 0 {
		return
	}
	k0, _ := opHead(&ops[0])
	cl, err := s.client(k0)
	if err != nil {
		var errs [numKinds]error // one error per kind, not per op
		for i := range ops {
			op := &ops[i]
			k, _ := opHead(op)
			if errs[k] == nil {
				if _, errs[k] = s.client(k); errs[k] == nil {
					errs[k] = err // connected meanwhile: this call still fails
				}
			}
			opFail(op, errs[k])
			s.m.ops[k][resultUnavailable].Inc()
		}
		return
	}
	b := s.getBatch()
	for i := range ops {
		op := &ops[i]
		k, errp := opHead(op)
		if err := opAdd(s, b, op); err != nil {
			opFail(op, fmt.Errorf("redisstore: %s %s: %w: %w", k, s.addr, ErrInvalid, err))
			s.m.ops[k][resultInvalid].Inc()
			continue
		}
		*errp = errPending // its command is the next in b.reqs
	}
	if len(b.reqs) == 0 {
		s.putBatch(b)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	d, abandoned, closed := s.exec(cctx, cl, b)
	cancel()
	// After abandoned, b belongs to exec's goroutine: only ops are read.
	took := d.Seconds()
	answered, failed := false, false
	var memo errMemo
	j := 0 // the command of the next op sent
	for i := range ops {
		op := &ops[i]
		k, errp := opHead(op)
		if *errp != errPending {
			continue // invalid: failed above
		}
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
			r := b.res[j]
			if err, res, _ = s.opError(ctx, k, r.Error(), &memo); err == nil {
				res, err = opDecode(s, op, r)
			}
		}
		j++
		if err != nil {
			opFail(op, err)
		} else {
			*errp = nil
		}
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
