package shardproxy

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// exec runs the units b was planned into, on goroutines of their own,
// and copies each op's outcome to the caller's ops (b.out or b.vout) when
// its unit is done, or when b.ctx ends, whichever is first; it then counts
// the outcomes and drops Do's reference to b. A worker that outlives the
// call writes only to b.
func (c *Client) exec(ctx context.Context, b *batch, now time.Time) {
	defer b.release()
	if len(b.units) == 0 {
		return
	}
	b.parent = ctx
	var cancel context.CancelFunc
	b.ctx, cancel = context.WithDeadlineCause(ctx, now.Add(c.cfg.BatchTimeout), errBatchTimeout)
	defer cancel()
	workers := int32(0)
	for i := range b.queues {
		q := &b.queues[i]
		q.workers = min(q.n, int32(c.cfg.Parallelism))
		workers += q.workers
	}

	c.closeMu.RLock()
	if c.closed {
		c.closeMu.RUnlock()
		for u := range b.units {
			b.abandon(c, int32(u), ErrClosed)
		}
		b.count(c)
		return
	}
	c.wg.Add(int(workers))
	c.closeMu.RUnlock()
	b.refs.Add(workers)
	for i := range b.queues {
		for range b.queues[i].workers {
			go c.work(b, &b.queues[i])
		}
	}

wait:
	for left := len(b.units); left > 0; left-- {
		select {
		case u := <-b.done:
			b.finish(u)
		case <-b.ctx.Done():
			for len(b.done) > 0 { // units reported before the end still count
				b.finish(<-b.done)
			}
			late := c.lateErr(b)
			for u, got := range b.got {
				if !got {
					b.abandon(c, int32(u), late)
				}
			}
			break wait
		}
	}
	b.count(c)
}

// work runs the units of q until none is left or b.ctx is done, reporting
// each on b.done.
func (c *Client) work(b *batch, q *queue) {
	defer c.wg.Done()
	defer b.release()
	for {
		n := q.next.Add(1) - 1
		if n >= q.n || b.ctx.Err() != nil {
			return
		}
		u := q.first + n
		c.run(b, q, u)
		b.done <- u
	}
}

// run performs one unit on its shard, with one of the shard's connection
// slots, and updates the shard's health: a failure (a connection error, a
// timeout, a reply that is not memcached's) counts once per shard per
// batch, however many ops it fails.
func (c *Client) run(b *batch, q *queue, u int32) {
	un := &b.units[u]
	if un.lo == un.hi {
		return // a split shard's unit that no counter hashed to: nothing to send
	}
	s := c.shards[un.shard]
	order := b.order[un.lo:un.hi]
	select {
	case s.slots <- struct{}{}:
	case <-b.ctx.Done():
		b.fail(order, s.addr, c.lateErr(b))
		return
	}
	begin := time.Now()
	var failure error
	if un.pipe {
		if failure = c.pipeline(b, s, u, order); failure != nil {
			b.fail(order, s.addr, failure)
		} else if b.pending(order) {
			b.fail(order, s.addr, c.lateErr(b)) // the batch ended before them
		}
	} else {
		if err := protect(s, func() error { return c.call(b, s, order) }); err != nil {
			b.fail(order, s.addr, err)
			if !answered(err) {
				failure = err
			}
		}
	}
	<-s.slots
	var kinds [numKinds]bool
	for _, i := range order {
		kinds[b.ops[i].kind] = true
	}
	took := time.Since(begin).Seconds()
	for k, ok := range kinds {
		if ok {
			c.m.latency[k].Observe(took)
		}
	}
	if failure != nil {
		if q.failed.CompareAndSwap(false, true) {
			c.failed(int(un.shard), time.Now())
		}
		return
	}
	c.succeeded(s)
}

// pipeline runs a unit's ops as pipelines on one of the shard's
// connections. It returns the connection's failure, if any, after closing
// it (and the shard's idle ones: a server that broke one has likely broken
// them all).
func (c *Client) pipeline(b *batch, s *shard, u int32, order []int32) error {
	pc, err := s.pipes.get(c.cfg.Timeout)
	if err != nil {
		return err
	}
	x := exchange{b: b, pc: pc, u: u, addr: s.addr, timeout: c.cfg.Timeout, meta: c.cfg.Protocol == ProtocolMeta}
	if err := x.run(order); err != nil {
		pc.nc.Close()
		s.pipes.drain(false)
		return err
	}
	s.pipes.put(pc)
	return nil
}

// call sends a unit's one command through gomemcache: an incr (with its
// add, and its second incr if it lost the add race), a decr, or a
// multi-get. It returns the first error of a round trip; a missing counter
// is not an error but sets miss.
func (c *Client) call(b *batch, s *shard, order []int32) error {
	st := &b.ops[order[0]]
	switch st.kind {
	case kindIncr:
		key := string(b.key(order[0]))
		v, err := s.mc.Increment(key, st.delta)
		if err == memcache.ErrCacheMiss {
			st.miss, v = true, st.delta
			err = s.mc.Add(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, st.delta, 10), Expiration: st.ttl})
			if err == memcache.ErrNotStored {
				// Another client created the counter between our incr and add.
				st.miss = false
				v, err = s.mc.Increment(key, st.delta)
			}
		}
		st.value, st.done = v, err == nil
		return err
	case kindDecr:
		v, err := s.mc.Decrement(string(b.key(order[0])), st.delta)
		if err == memcache.ErrCacheMiss {
			st.miss, st.done = true, true
			return nil
		}
		st.value, st.done = v, err == nil
		return err
	}
	keys := make([]string, len(order))
	for j, i := range order {
		keys[j] = string(b.key(i))
	}
	items, err := s.mc.GetMulti(keys)
	if err != nil {
		return err
	}
	for j, i := range order {
		st := &b.ops[i]
		st.done = true
		it, ok := items[keys[j]]
		if !ok {
			st.miss = true
			continue
		}
		st.value, st.err = readCounter(s.addr, keys[j], it.Value)
	}
	return nil
}

// protect runs f, turning a panic inside gomemcache (it slices reply lines
// without checking their length) into ErrMalformed. After a panic the
// shard's idle connections are closed, since the one that panicked may have
// gone back to the pool mid-reply.
func protect(s *shard, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.mc.Close()
			err = fmt.Errorf("%w: gomemcache panicked on it: %v", ErrMalformed, r)
		}
	}()
	return f()
}
