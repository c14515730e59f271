package window

// TEMPORARY: replaced once the per-edge algorithms land.
func (l *Limiter) decideLocal(t int64, r *Rule, key, limit, cost uint64) Decision {
	return Decision{Verdict: Verdict{Allowed: true}, Limit: limit}
}

func (l *Limiter) recordLocal(t int64, r *Rule, key, cost uint64) {}
