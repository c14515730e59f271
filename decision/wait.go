package decision

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/window"
)

// Waiting its turn: a program that would rather wait than be refused (a
// crawler polite to each host, a client of a rate-limited API) asks the
// core to block until a request conforms, across every process sharing the
// store, as golang.org/x/time/rate's WaitN does within one process.
//
// x/time/rate keeps its bucket in memory and can promise a future instant:
// WaitN takes the tokens now and sleeps until they are due. A store shared
// by processes that each decide for themselves cannot promise that in
// general: a window counter counts units in the window of the instant they
// are counted at, and a log's instants never go back (window.Reservation),
// so units taken now for later would be misplaced and others admitted
// early. Wait therefore asks, and when refused sleeps until the exact
// instant the algorithm says the units would conform if nothing else
// arrived (a sliding window's release time, a bucket's theoretical arrival
// time), then asks again: another process may have taken the room
// meanwhile. A waiter proceeds only on the limiter's admission. Only a
// token or leaky bucket can hold a future reservation (the store moves its
// theoretical arrival time later atomically): Reserve makes one, and Wait
// uses one for a queue (action: delay), whose admitted requests wait their
// place anyway.

// Errors of Wait and Reserve, wrapped with the rule's name.
var (
	// ErrUnknownRule: no rule of that name is in force.
	ErrUnknownRule = errors.New("no rule of that name is in force")
	// ErrNotRateRule: the rule limits concurrency or sheds load, which
	// depend on live requests; only rate rules can be waited on.
	ErrNotRateRule = errors.New("only rate rules can be waited on")
	// ErrNeverConforms: the cost is above the rule's limit (a window or
	// log) or burst (a bucket), so no wait would ever admit it.
	ErrNeverConforms = errors.New("the cost is above what the rule ever admits at once")
	// ErrWouldExceedDeadline: the context's deadline comes before the
	// instant the request could conform; returned at once, without
	// waiting. It matches context.DeadlineExceeded under errors.Is.
	ErrWouldExceedDeadline = fmt.Errorf("the request cannot conform before the context's deadline: %w", context.DeadlineExceeded)
	// ErrStoreFailed: the store could not decide; the rule's failure
	// policy answered, which a waiter does not act on.
	ErrStoreFailed = errors.New("the store could not decide")
)

// InfDuration is Reservation.DelayFrom's answer for a reservation that was
// not taken, as in golang.org/x/time/rate.
const InfDuration = time.Duration(math.MaxInt64)

// Wait blocks until cost units of key under the rate rule named rule
// conform, takes them, and returns nil; or returns ctx's error when it ends
// first. It returns an error at once when the request can never conform
// (an unknown rule, a rule that is not a rate rule, a cost above the
// rule's limit or burst), and, as golang.org/x/time/rate's WaitN, when
// ctx's deadline comes before the instant it would conform if nothing
// else arrived (ErrWouldExceedDeadline). A cost of 0 returns nil at once.
//
// The key is the rule's client key, as a rules file's key recipe would
// build it (a host, an API key); it is decided as DecideKey decides it:
// block cache, limiter, metrics and decision events alike. A refused
// request sleeps until the exact instant its units would conform (a
// sliding window's release, a bucket's theoretical arrival time) and is
// decided again, since other processes sharing the store may have taken
// the room meanwhile (poplimit_edge_wait_retries_total counts those). A
// waiter proceeds only on the limiter's admission: when the store fails to
// decide three times running (asked again 10 ms, then 20 ms, later), Wait
// returns ErrStoreFailed whatever the rule's failure policy. A queue
// (action: delay) takes the request's place in it at once, within the
// queue's bound and ctx's deadline, and Wait sleeps until the place comes;
// a place given up when ctx ends is not given back (a bucket's store
// operations only pour), and the place, a reservation, emits no decision
// event. Under action: block every attempt counts, as the
// rule says, so a waiter asks again only once each block has ended. A
// shadow rule never makes a waiter wait.
//
// Wait reads the wall clock; it is safe for concurrent use.
func (c *Core) Wait(ctx context.Context, rule string, key []byte, cost uint64) error {
	return c.wait(ctx, wallClock{}, rule, key, cost)
}

// waitClock is the time Wait reads and sleeps in: the wall clock, or a
// test's.
type waitClock interface {
	Now() time.Time
	// Sleep returns after d, or ctx's error when it ends first.
	Sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitStoreRetries is how many times a waiter asks again after the store
// failed to decide, waitStoreBackoff, then twice that, later, before Wait
// returns ErrStoreFailed: a failure can pass in a moment (a
// compare-and-swap that lost to other writers every round, a reply late in
// a stall), and a dead store costs the waiter three store timeouts.
const (
	waitStoreRetries = 2
	waitStoreBackoff = 10 * time.Millisecond
)

func (c *Core) wait(ctx context.Context, clk waitClock, rule string, key []byte, cost uint64) error {
	failures := 0 // store failures running
	woke := false // the last sleep ended when the units would conform
	for {
		if err := ctx.Err(); err != nil {
			c.wm.result[waitCanceled].Inc()
			return err
		}
		g := c.Current()
		r, err := waitRule(g, rule, key, cost)
		if err != nil {
			c.wm.result[waitBad].Inc()
			return err
		}
		if cost == 0 || r.Shadow {
			c.wm.result[waitAdmitted].Inc()
			return nil
		}
		now := clk.Now()
		t := now.UnixNano()
		if r.Action == policy.Delay {
			// A queue: take the place now, within ctx's deadline.
			done, at, err := c.waitQueue(ctx, clk, g, r, now, key, cost)
			if done || err != nil {
				return err
			}
			if woke {
				c.wm.retries.Inc()
			}
			if err := c.sleepUntil(ctx, clk, rule, t, at); err != nil {
				return err
			}
			woke = true
			continue
		}
		admitted, failed, rel := c.decideNow(g, r, now, key, cost)
		switch {
		case failed && failures < waitStoreRetries:
			failures++
			if err := clk.Sleep(ctx, time.Duration(failures)*waitStoreBackoff); err != nil {
				c.wm.result[waitCanceled].Inc()
				return err
			}
			woke = false
			continue
		case failed:
			c.wm.result[waitStoreFailed].Inc()
			return fmt.Errorf("decision: wait on rule %q: %w", rule, ErrStoreFailed)
		case admitted:
			c.wm.result[waitAdmitted].Inc()
			return nil
		}
		failures = 0
		if woke {
			c.wm.retries.Inc() // woke when it would have conformed: the room was taken
		}
		if err := c.sleepUntil(ctx, clk, rule, t, rel); err != nil {
			return err
		}
		woke = true
	}
}

// decideNow decides cost units of key under r at now as a request's are,
// and says whether they were admitted, whether the store failed (the
// rule's failure policy answered), and, refused, when they would conform
// (Unix ns).
func (c *Core) decideNow(g Generation, r *rules.Rule, now time.Time, key []byte, cost uint64) (admitted, failed bool, at int64) {
	t := now.UnixNano()
	d := c.get(now)
	d.key = append(d.key[:0], key...)
	refused := c.decide(g.sn, r, d, t, cost)
	failed, at = d.Fallback, d.Quota.ReleaseAt
	c.Finish(d)
	if refused && at == 0 {
		// No release time although the cost is within the rule's limit: a
		// global rule whose room the other PoPs hold. Their counts say
		// nothing of when it frees.
		at = askAgain(r, t)
	}
	return !refused, failed, at
}

// askAgain is when to ask again from t when nothing says when units
// conform: after a sixteenth of the rule's window, at least 1 ms.
func askAgain(r *rules.Rule, t int64) int64 {
	return t + max(int64(r.Window)/16, int64(time.Millisecond))
}

// sleepUntil sleeps from t until at (Unix ns), or returns at once with
// ErrWouldExceedDeadline when ctx's deadline is before at, or with ctx's
// error when it ends first.
func (c *Core) sleepUntil(ctx context.Context, clk waitClock, rule string, t, at int64) error {
	if dl, ok := ctx.Deadline(); ok && dl.UnixNano() < at {
		c.wm.result[waitDeadline].Inc()
		return fmt.Errorf("decision: wait on rule %q: %w", rule, ErrWouldExceedDeadline)
	}
	// An instant not after t (none of the algorithms gives one) is asked
	// again a millisecond on, so that nothing spins on the store.
	if err := clk.Sleep(ctx, time.Duration(max(at-t, int64(time.Millisecond)))); err != nil {
		c.wm.result[waitCanceled].Inc()
		return err
	}
	return nil
}

// waitQueue takes cost units' place in queue rule r (action: delay) for
// key, within ctx's deadline, and sleeps until it comes: done, with ctx's
// error if it ended first. When the queue has no place within the
// deadline or its bound, it returns the instant to ask again.
func (c *Core) waitQueue(ctx context.Context, clk waitClock, g Generation, r *rules.Rule, now time.Time, key []byte, cost uint64) (done bool, at int64, err error) {
	maxDelay := time.Duration(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		maxDelay = max(dl.Sub(now), 0)
	}
	res, err := c.reserve(ctx, g, r, now, key, cost, maxDelay)
	switch {
	case err != nil && errors.Is(err, ErrStoreFailed):
		c.wm.result[waitStoreFailed].Inc()
		return true, 0, err
	case err != nil:
		c.wm.result[waitBad].Inc()
		return true, 0, err
	case !res.ok:
		return false, res.at.UnixNano(), nil
	}
	if d := res.at.Sub(now); d > 0 {
		if err := clk.Sleep(ctx, d); err != nil {
			c.wm.result[waitCanceled].Inc()
			return true, 0, err
		}
	}
	c.wm.result[waitAdmitted].Inc()
	return true, 0, nil
}

// waitRule returns the rate rule named rule of g, or why cost units of key
// can never conform to it.
func waitRule(g Generation, rule string, key []byte, cost uint64) (*rules.Rule, error) {
	var r *rules.Rule
	if rs := g.Rules(); rs != nil {
		r = rs.Lookup(rule)
	}
	switch {
	case r == nil:
		return nil, fmt.Errorf("decision: rule %q: %w", rule, ErrUnknownRule)
	case r.Kind != rules.Rate:
		return nil, fmt.Errorf("decision: rule %q is a %s rule: %w", rule, r.Kind, ErrNotRateRule)
	}
	if most := capacityFor(g.sn.rules, r, key); cost > most {
		return nil, fmt.Errorf("decision: rule %q: cost %d, at most %d: %w", rule, cost, most, ErrNeverConforms)
	}
	return r, nil
}

// capacityFor is the most units rule r ever admits at once for key: its
// limit for a window or a log, its burst for a bucket (and one more for a
// queue, whose burst waits while one is served).
func capacityFor(rs *rules.Rules, r *rules.Rule, key []byte) uint64 {
	limit := rs.LimitFor(r, key)
	switch r.Algorithm {
	case policy.TokenBucket, policy.LeakyBucket:
		b := burstFor(r, limit)
		if r.Action == policy.Delay {
			b++
		}
		return b
	default:
		return limit
	}
}

// Reservation is units of a key under a rule taken in the store for use
// from an instant on, or the instant to ask again (Reserve), as
// golang.org/x/time/rate's Reservation.
type Reservation struct {
	ok   bool
	at   time.Time
	c    *Core
	pol  *window.Policy
	hash uint64
	cost uint64
	// counted is when a counter counted the units, Unix ns, for Cancel;
	// 0: nothing Cancel can give back.
	counted int64
}

// OK reports whether the units were taken.
func (r *Reservation) OK() bool { return r.ok }

// TimeToAct is when the reserved units may be used; for a reservation not
// taken, when the same reservation would be taken if nothing else arrived
// (ask again then).
func (r *Reservation) TimeToAct() time.Time { return r.at }

// DelayFrom is how long after now the reserved units may be used (0 when
// they already may), or InfDuration for a reservation not taken.
func (r *Reservation) DelayFrom(now time.Time) time.Duration {
	if !r.ok {
		return InfDuration
	}
	return max(r.at.Sub(now), 0)
}

// Cancel says the reserved units will not be used, and gives them back
// where the algorithm can: a sliding or fixed window's counter is
// decremented (the units the window holds then count no more). A bucket's
// or a log's store operations only take, so their units stay taken until
// they leak or leave the window: a reservation far ahead given up wastes
// its time for every process sharing the key, where golang.org/x/time/rate
// gives tokens back. Cancel reports whether units were given back; a
// second call does nothing.
func (r *Reservation) Cancel(ctx context.Context) bool {
	if !r.ok || r.counted == 0 {
		return false
	}
	at := r.counted
	r.counted = 0
	if err := r.c.lim.GiveBack(ctx, r.pol, r.hash, r.cost, at); err != nil {
		r.c.wm.reserve[reserveGiveBackFailed].Inc()
		return false
	}
	r.c.wm.reserve[reserveGivenBack].Inc()
	return true
}

// Reserve takes cost units of key under the rate rule named rule, at now,
// for use at the earliest instant they conform, if that is no later than
// now + maxDelay: the Reservation is OK and says when (TimeToAct).
// Otherwise nothing is taken, and the Reservation says when to ask again.
//
// Only a token or leaky bucket (action throttle or delay) can hold units
// for a later instant in a shared store: the store moves its theoretical
// arrival time later atomically, one round trip whatever the rule's mode,
// and every process sharing the bucket counts them from now. A window
// counter, a sliding log and a rule of action block take units only when
// they conform at now (as DecideKey decides), whatever maxDelay: their
// Reservation is OK with TimeToAct now, or not OK with the instant they
// would conform. Cancel gives a counter's units back; a bucket's stay
// taken. The errors are Wait's: a request that can never conform, or a
// store that could not decide. Bucket reservations are counted in
// poplimit_edge_reservations_total and emit no decision event.
func (c *Core) Reserve(ctx context.Context, now time.Time, rule string, key []byte, cost uint64, maxDelay time.Duration) (*Reservation, error) {
	g := c.Current()
	r, err := waitRule(g, rule, key, cost)
	if err != nil {
		c.wm.reserve[reserveBad].Inc()
		return nil, err
	}
	return c.reserve(ctx, g, r, now, key, cost, maxDelay)
}

func (c *Core) reserve(ctx context.Context, g Generation, r *rules.Rule, now time.Time, key []byte, cost uint64, maxDelay time.Duration) (*Reservation, error) {
	t := now.UnixNano()
	h := r.Hash(key)
	res := &Reservation{c: c, pol: &r.Policy, hash: h, cost: cost}
	if cost == 0 {
		res.ok, res.at = true, now
		return res, nil
	}
	bucket := r.Algorithm == policy.TokenBucket || r.Algorithm == policy.LeakyBucket
	if bucket && r.Action != policy.Block {
		limit := g.sn.rules.LimitFor(r, key)
		if r.Scope == rules.ScopeGlobal && c.deps.Global != nil {
			limit = c.globalRoom(r, h, t, limit)
		}
		wr, err := c.lim.Reserve(ctx, now, &r.Policy, h, limit, cost, maxDelay)
		if err != nil {
			c.wm.reserve[reserveStoreFailed].Inc()
			return nil, fmt.Errorf("decision: reserve on rule %q: %w: %w", r.Name, ErrStoreFailed, err)
		}
		if wr.At == 0 {
			// Past the bucket this instant holds (a global rule's room
			// held by the other PoPs), or a queue's bound: ask again
			// after a sixteenth of the window.
			wr.At = askAgain(r, t)
		}
		res.ok, res.at = wr.OK, time.Unix(0, wr.At)
		if wr.OK {
			c.wm.reserve[reserveTaken].Inc()
		} else {
			c.wm.reserve[reserveLater].Inc()
		}
		return res, nil
	}
	admitted, failed, rel := c.decideNow(g, r, now, key, cost)
	switch {
	case failed:
		c.wm.reserve[reserveStoreFailed].Inc()
		return nil, fmt.Errorf("decision: reserve on rule %q: %w", r.Name, ErrStoreFailed)
	case admitted:
		res.ok, res.at = true, now
		if r.Algorithm.IsCounter() && !r.Shadow {
			res.counted = t
		}
		c.wm.reserve[reserveTaken].Inc()
		return res, nil
	}
	res.at = time.Unix(0, rel)
	c.wm.reserve[reserveLater].Inc()
	return res, nil
}

// The results of Wait and Reserve, as their metrics label them.
const (
	waitAdmitted = iota
	waitCanceled
	waitDeadline
	waitBad
	waitStoreFailed
	nWaitResults
)

var waitResults = [nWaitResults]string{"admitted", "canceled", "deadline", "never", "store_failed"}

const (
	reserveTaken = iota
	reserveLater
	reserveBad
	reserveStoreFailed
	reserveGivenBack
	reserveGiveBackFailed
	nReserveResults
)

var reserveResults = [nReserveResults]string{"taken", "later", "never", "store_failed", "given_back", "give_back_failed"}

// waitMetrics count what Wait and Reserve did.
type waitMetrics struct {
	result  [nWaitResults]prometheus.Counter
	reserve [nReserveResults]prometheus.Counter
	retries prometheus.Counter
}

func newWaitMetrics(reg prometheus.Registerer) (*waitMetrics, error) {
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "waits_total",
		Help: "Calls of Wait, by result: admitted, canceled (the context ended), deadline (it came before the request could conform), never (unknown rule, not a rate rule, cost above the limit or burst), store_failed."},
		[]string{"result"})
	reserves := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "reservations_total",
		Help: "Calls of Reserve and of a Reservation's Cancel, by result: taken, later (not within the delay asked), never, store_failed, given_back, give_back_failed."},
		[]string{"result"})
	m := &waitMetrics{retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "wait_retries_total",
		Help: "Waiters refused again when they woke at the instant their request would have conformed: other processes sharing the store took the room."})}
	for i, l := range waitResults {
		m.result[i] = results.WithLabelValues(l)
	}
	for i, l := range reserveResults {
		m.reserve[i] = reserves.WithLabelValues(l)
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{results, reserves, m.retries} {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
