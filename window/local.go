package window

// localState is one key's state under a per-edge algorithm (token bucket,
// leaky bucket, sliding log). These algorithms do not reduce to an
// increment-only shared counter, so each edge enforces them alone: a
// per-edge limit, documented as such on the Algorithm constants.
type localState struct {
	tb   TokenBucketState
	lb   LeakyBucketState
	sl   SlidingLogState
	last int64 // last use, Unix ns
	idle int64 // after this long unused, the state equals a fresh one (ns)
}

// localGet returns key's per-edge state, creating it (and evicting an
// arbitrary other key when the shard holds its share of MaxKeys). s.mu must
// be held.
func (s *shard) localGet(l *Limiter, key uint64, t int64, r *Policy) *localState {
	if st, ok := s.local[key]; ok {
		st.last = t
		return st
	}
	if s.local == nil {
		s.local = make(map[uint64]*localState)
	}
	if len(s.local) >= s.max {
		for k := range s.local {
			delete(s.local, k)
			l.m.evictions.Inc()
			break
		}
	}
	// A bucket refills (or drains) Burst in Burst/Limit windows; a log
	// forgets in one window.
	windows := int64(2 + r.Burst/r.Limit)
	st := &localState{last: t, idle: windows * int64(r.Window)}
	s.local[key] = st
	return st
}

// localAllow runs rule r's per-edge algorithm over st. With count false it
// only counts (a blocked key's request answered from the block cache).
func localAllow(r *Policy, st *localState, t int64, limit, cost uint64, decide bool) (ok bool, remaining, releaseAt int64) {
	burst := int64(r.Burst)
	if limit != r.Limit && r.Burst == r.Limit {
		burst = int64(limit) // a tier's limit scales the default burst too
	}
	n := int64(cost)
	switch r.Algorithm {
	case TokenBucketAlgorithm:
		return TokenBucket{Rate: int64(limit), Per: r.Window, Burst: burst}.Allow(&st.tb, t, n)
	case LeakyBucketAlgorithm:
		return LeakyBucket{Rate: int64(limit), Per: r.Window, Capacity: burst}.Allow(&st.lb, t, n)
	default: // SlidingLogAlgorithm
		sl := SlidingLog{Limit: int64(limit), Window: r.Window}
		if !decide {
			sl.Add(&st.sl, t, n)
			return true, 0, 0
		}
		ok, remaining, releaseAt = sl.Allow(&st.sl, t, n)
		if !ok && r.Action == Block {
			sl.Add(&st.sl, t, n) // a block counts every attempt
		}
		return ok, remaining, releaseAt
	}
}

func (l *Limiter) decideLocal(t int64, r *Policy, key, limit, cost uint64) Decision {
	s := l.shardOf(key)
	s.mu.Lock()
	st := s.localGet(l, key, t, r)
	ok, remaining, releaseAt := localAllow(r, st, t, limit, cost, true)
	s.mu.Unlock()
	return l.stateDecision(t, r, limit, cost, ok, remaining, releaseAt)
}

func (l *Limiter) recordLocal(t int64, r *Policy, key, cost uint64) {
	s := l.shardOf(key)
	s.mu.Lock()
	localAllow(r, s.localGet(l, key, t, r), t, r.Limit, cost, false)
	s.mu.Unlock()
}

// sweepLocal frees at most budget per-edge states idle long enough to
// have become fresh again. s.mu must be held.
func (s *shard) sweepLocal(t int64, budget int) {
	for k, st := range s.local {
		if budget == 0 {
			return
		}
		budget--
		if t-st.last > st.idle {
			delete(s.local, k)
		}
	}
}
