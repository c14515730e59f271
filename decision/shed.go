package decision

import (
	"sync/atomic"
	"time"

	"github.com/poplimit/poplimit/rules"
)

// shedder decides load shedding in proxy mode from the upstream's requests
// in flight and a moving average of its latency (rules.Shedding). Safe for
// concurrent use; it allocates nothing.
type shedder struct {
	latencyEWMA atomic.Int64 // ns, α = 1/16
}

// observe folds one upstream latency into the moving average. Lost updates
// under contention only slow the average down.
func (sh *shedder) observe(d time.Duration) {
	old := sh.latencyEWMA.Load()
	sh.latencyEWMA.Store(old + (int64(d)-old)/16)
}

// load returns how loaded the upstream is, 1 meaning full.
func (sh *shedder) load(cfg *rules.Shedding, inflight int64) float64 {
	l := float64(inflight) / float64(cfg.MaxInFlight)
	if cfg.Latency > 0 {
		l = max(l, float64(sh.latencyEWMA.Load())/float64(cfg.Latency))
	}
	return l
}

// threshold is the load at which a priority class is shed: low from 60 %,
// normal from 80 %, high from 100 % of the share left after the critical
// reserve, critical only at full load.
func threshold(p rules.Priority, reserved float64) float64 {
	switch p {
	case rules.Critical:
		return 1
	case rules.High:
		return 1 - reserved
	case rules.Normal:
		return 0.8 * (1 - reserved)
	}
	return 0.6 * (1 - reserved)
}

// priorityOf returns the class of the first shed rule matching the request,
// or Normal.
func priorityOf(rs *rules.Rules, host, method, path []byte) rules.Priority {
	for _, r := range rs.Rules {
		if r.Kind == rules.Shed && r.Matches(host, method, path) {
			return r.Priority
		}
	}
	return rules.Normal
}
