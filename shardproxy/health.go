package shardproxy

import "time"

// succeeded records a call the shard answered: its failure streak ends.
func (c *Client) succeeded(s *shard) {
	if s.fails.Load() != 0 {
		s.fails.Store(0)
	}
}

// failed records a failed call on shard i at now. The FailureLimit-th
// consecutive failure ejects the shard for RetryTimeout (nutcracker's
// server_failure with auto_eject_hosts): the ring is rebuilt without it and
// its keys move to the other shards. Its idle connections are closed, so
// that when it comes back on probation its first call is not lost to a
// connection its failure left behind.
func (c *Client) failed(i int, now time.Time) {
	s := c.shards[i]
	if s.fails.Add(1) < int32(c.cfg.FailureLimit) {
		return
	}
	c.mu.Lock()
	if s.retryAt.Load() != 0 {
		c.mu.Unlock()
		return // already out: a call that was in flight when it was ejected
	}
	s.fails.Store(0)
	s.retryAt.Store(now.Add(c.cfg.RetryTimeout).UnixNano())
	c.m.ejections.Inc()
	c.rebuildLocked()
	c.mu.Unlock()
	s.pipes.drain(false)
	s.mc.Close()
}

// maybeRestore puts back every ejected shard whose RetryTimeout has passed at
// now, as nutcracker's server_pool_update does on the next request after
// next_rebuild. It costs one atomic load when there is nothing to do, so Do
// calls it every time and no goroutine is needed for it.
//
// A shard put back is on probation: its failure count starts at
// FailureLimit−1, so the first failure ejects it again (a half-open circuit
// breaker) and a dead shard costs at most one Timeout per RetryTimeout,
// where nutcracker would let it fail FailureLimit more times.
func (c *Client) maybeRestore(now time.Time) {
	next := c.nextRetry.Load()
	if next == 0 || now.UnixNano() < next {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	restored := false
	for _, s := range c.shards {
		if at := s.retryAt.Load(); at != 0 && at <= now.UnixNano() {
			s.fails.Store(int32(c.cfg.FailureLimit) - 1)
			s.retryAt.Store(0)
			restored = true
		}
	}
	if restored {
		c.rebuildLocked()
	}
}

// rebuildLocked replaces the ring with one over the shards not ejected and
// recomputes nextRetry and the ejected gauge. c.mu must be held.
func (c *Client) rebuildLocked() {
	live := make([]bool, len(c.shards))
	var next int64
	ejected := 0
	for i, s := range c.shards {
		at := s.retryAt.Load()
		live[i] = at == 0
		if at != 0 {
			ejected++
			if next == 0 || at < next {
				next = at
			}
		}
	}
	ring, err := c.base.WithLive(live)
	if err != nil {
		return // unreachable: live has one entry per server
	}
	c.ring.Store(ring)
	c.nextRetry.Store(next)
	c.m.ejected.Set(float64(ejected))
}
