package redisstore

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

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
// write of a call is one script (Do's counter script, GCRABatch's and
// SlidingLogBatch's own), so on one node either all of a call's writes
// find their script or none does, and writes keep their order; the reads
// (GETs) that followed a re-sent write of the same key go again in the
// second round, after it. (A script flushed and loaded again by another
// client while one call's pipeline is on the server can still reorder that
// call's writes of one key; nothing else can.)
func (s *Store) run(ctx context.Context, c rueidis.Client, b *batch) {
	defer s.wg.Done()
	b.all = string(b.buf)
	b.cmds = b.cmds[:0]
	for _, r := range b.reqs {
		b.cmds = append(b.cmds, b.build(c, r, false))
	}
	b.res = append(b.res[:0], c.DoMulti(ctx, b.cmds...)...)
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
		for j, res := range c.DoMulti(ctx, b.cmds...) {
			b.res[b.redo[j]] = res
		}
	}
	if b.state.CompareAndSwap(callRunning, callFinished) {
		b.done <- struct{}{}
		return
	}
	s.putBatch(b) // the caller gave up on it
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
