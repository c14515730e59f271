package decision

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/rules"
)

// Reserve, then settle. A rule with count: counts what the origin answered
// (its status, or the units its cost header gives), but the origin answers
// after the request was decided, and a hundred attempts sent at once would
// all be admitted before the first failure counted. So a counting rule
// takes the request's units when it admits it, as every rule does, and
// concurrent requests see them; the response settles them: kept when it
// counts, given back when it does not (window.Limiter.GiveBack), topped up
// when the origin's cost header says more. A request whose response never
// comes (the client went away, the upstream timed out, a decision-mode
// reservation nobody settled) keeps its units: an attacker must not escape
// counting by hanging up. A counting rule's event is emitted when its
// request settles, saying what counted and when; a refusal's at once.
//
// A counting rule's admissions are decided by one store round trip
// whatever its mode, as a sync rule's are: the reservation must be in the
// store before the origin is asked, or each edge admits a parallel burst
// up to the limit from its own view before it sees the others' units
// (decided from the async views, 200 attempts sent at once through two
// edges reached the origin 6 or 7 times under a limit of 5).

// maxPending bounds the counting rules one request reserves units under;
// SetRules refuses rules whose matching could reserve more.
const maxPending = 4

// pendingUnits are the units one counting rule reserved for a request,
// with its decision event, held until the response settles them.
type pendingUnits struct {
	rule  *rules.Rule
	key   uint64 // the rule's key hash
	block uint64 // its key in the block cache
	units uint64 // reserved
	limit uint64 // the key's limit (a tier's), the origin's units' cap
	mark  int64  // a bucket's theoretical arrival time after the units (window.Answer.Mark)
	ev    event.Event
}

// ResponseHeader reads one field of the origin's response, for a counting
// rule's cost header: the value of its first line and whether the
// response had the field. It must not allocate; the value need only live
// during the call.
type ResponseHeader interface {
	ResponseHeader(name string) (value []byte, ok bool)
}

// Counting reports whether d holds units that counting rules reserved
// (rules with count:), to be settled from the response (Settle) or kept
// when none comes.
func (d *Verdict) Counting() bool { return d.np > 0 }

// Settle settles the units counting rules reserved for d's request from
// its response: status, and the origin's cost header read through h (nil:
// the response has no header to read). Each rule keeps its units when its
// count says the response counts, gives them back when it does not, and
// takes the origin's units instead of the reserved ones when its count
// has a cost header. It emits the rules' events, and does nothing for a
// request that reserved nothing; a second call does nothing. Front ends
// that see the response call it before Finish; Finish keeps whatever was
// not settled.
func (c *Core) Settle(d *Verdict, status int, h ResponseHeader) {
	if d.np == 0 {
		return
	}
	now := c.cfg.Clock.Now().UnixNano()
	for i := range d.np {
		p := &d.pend[i]
		var counted uint64
		if p.rule.Count.Counts(status) {
			counted = p.units
			if name := p.rule.Count.CostHeader; name != "" {
				var v []byte
				var ok bool
				if h != nil {
					v, ok = h.ResponseHeader(name)
				}
				counted = p.rule.Count.Units(v, ok, p.units, p.limit)
			}
		}
		c.settle(p, counted, now, settledResponse)
		d.pend[i] = pendingUnits{}
	}
	d.np = 0
}

// RefusedSettle counts a settle call a front end refused because it
// carried no status code from 100 to 599, in
// poplimit_edge_settle_refused_total{reason="bad_status"}.
func (c *Core) RefusedSettle() { c.sm.badStatus.Inc() }

// settle makes p's rule count counted units for its request instead of
// the reserved ones, and emits its event.
func (c *Core) settle(p *pendingUnits, counted uint64, now int64, how settledHow) {
	r := p.rule
	c.sm.settled[how].Inc()
	switch {
	case counted < p.units:
		if err := c.lim.GiveBackNow(&r.Policy, p.key, p.limit, p.units-counted, p.ev.Time, p.mark); err != nil {
			// The store did not take them: the units stay counted, which
			// can only refuse more.
			c.sm.giveBackFailed.Inc()
			counted = p.units
		} else if r.Action != policy.Block {
			// A throttle refused meanwhile was blocked until the release
			// its reserved units made; given back, they no longer hold
			// it. (A block rule's block stands for its timeout.)
			c.unblock(p.block, now)
		}
	case counted > p.units:
		c.lim.Record(time.Unix(0, now), &r.Policy, p.key, counted-p.units)
	}
	settledEvent(&p.ev, counted, now)
	if c.deps.Events != nil {
		c.deps.Events.Emit(&p.ev)
	}
	if c.cfg.Observe != nil {
		c.cfg.Observe(r, nil, &p.ev)
	}
}

// unblocker is what a block cache offers to lift a block early
// (blockcache.Cache.Unblock).
type unblocker interface{ Unblock(key uint64) }

// unblock lifts the block of blockKey, if the block cache can.
func (c *Core) unblock(blockKey uint64, now int64) {
	if ub, ok := c.blocks.(unblocker); ok {
		if _, blocked := c.blocks.Blocked(blockKey, now); blocked {
			ub.Unblock(blockKey)
		}
	}
}

// settledHow is how a counting rule's request settled, for
// poplimit_edge_settled_total.
type settledHow uint8

const (
	settledResponse   settledHow = iota // from the response (or a settle call)
	settledNoResponse                   // no response came: units kept
	settledRefused                      // the edge refused it after all: units given back
	settledTimeout                      // a decision-mode reservation nobody settled in time: units kept
	settledFull                         // the table of reservations was full: units kept at once
	nSettledHow
)

var settledNames = [nSettledHow]string{"response", "no_response", "refused", "timeout", "table_full"}

// settleMetrics are the reserve-then-settle counters.
type settleMetrics struct {
	settled        [nSettledHow]prometheus.Counter
	giveBackFailed prometheus.Counter
	unknown        prometheus.Counter // settle calls naming no reservation held
	badStatus      prometheus.Counter // settle calls without a status code
	pending        prometheus.GaugeFunc
}

func newSettleMetrics(reg prometheus.Registerer, c *Core) (*settleMetrics, error) {
	m := &settleMetrics{}
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "settled_total", Help: "Requests of counting rules (count:) settled, by how: response (the response, or a settle call, said what counted), no_response (none came: units kept), refused (the edge refused the request after a counting rule admitted it: units given back), timeout (a reservation nobody settled: units kept), table_full (no room to hold a reservation: units kept)."},
		[]string{"how"})
	for i, n := range settledNames {
		m.settled[i] = v.WithLabelValues(n)
	}
	m.giveBackFailed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "give_back_failed_total", Help: "Units of a counting rule that did not count but could not be given back (the store failed): they stay counted."})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "settle_refused_total", Help: "Settle calls refused, by reason: unknown (no reservation of that id held here: malformed, settled already, kept at its timeout, or issued by another edge), bad_status (no status code from 100 to 599)."},
		[]string{"reason"})
	m.unknown, m.badStatus = refused.WithLabelValues("unknown"), refused.WithLabelValues("bad_status")
	m.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem,
		Name: "reservations_pending", Help: "Decision-mode reservations waiting for their settle call."}, func() float64 { return float64(c.held.len()) })
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{v, m.giveBackFailed, refused, m.pending} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// settledEvent makes a counting rule's decision event say what its
// response counted and when it settled.
func settledEvent(ev *event.Event, counted uint64, now int64) {
	ev.Cost = uint32(min(max(uint64(ev.Cost), counted), 1<<32-1))
	setSettled(ev, uint32(min(counted, 1<<32-1)), uint32(min(max(now-ev.Time, 0)/1e3, 1<<32-1)))
}
