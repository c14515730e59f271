package decision

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// Reservations held for a settle call. In decision mode (nginx's
// auth_request, Caddy's forward_auth, Envoy's ext_authz, the JSON decide
// endpoint) the edge answers before the origin does and never sees the
// response, so the front end moves a counting request's reserved units
// out of its Verdict into this table (Hold) and answers with the
// reservation's id; whoever learns the response (the origin, or a proxy
// that can call after it) sends the id and the status back (SettleHeld).
//
// The id is 128 bits from crypto/rand, known only to the edge and to
// whoever it answered, and the table is the only record of it: an id is
// good once (settling removes it), an id the edge never issued names
// nothing, and nothing about a reservation can be forged into an id. A
// self-contained signed id (an HMAC over rule, key and units) would let
// any edge settle, but single use would then need a shared record of the
// ids spent, and the issuing edge must in any case hold the request's
// decision event until it settles; so the edge that issued an id holds
// its reservation, and the settle call goes to that edge. The table is
// bounded (CoreConfig.MaxHeld); a reservation not settled within
// CoreConfig.SettleTimeout keeps its units, as a request whose response
// never came, and one the table has no room for keeps them at once.

// DefaultSettleTimeout is CoreConfig.SettleTimeout's default.
const DefaultSettleTimeout = time.Minute

// DefaultMaxHeld is CoreConfig.MaxHeld's default.
const DefaultMaxHeld = 1 << 16

// ReservationIDLen is the length of a reservation id: 32 lower-case hex
// digits.
const ReservationIDLen = 32

type heldEntry struct {
	id       [16]byte
	deadline int64
	live     bool
	np       int
	pend     [maxPending]pendingUnits
}

// heldTable is the bounded table of reservations waiting for their settle
// call: a ring in the order they were issued (their deadlines come in the
// same order, one timeout after), and an index by id.
type heldTable struct {
	mu    sync.Mutex
	byID  map[[16]byte]int // ring index
	ring  []heldEntry
	head  int
	n     int // entries in the ring, live or settled, from head
	live  int
	timer *time.Timer
}

func (t *heldTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}

// Hold moves the units counting rules reserved for d's request into the
// table of reservations waiting for a settle call and appends the
// reservation's id (ReservationIDLen hex digits) to dst. It reports false,
// appending nothing, when d reserved nothing, or when the table is full:
// then the units are kept at once, as for a request whose response never
// comes (counted as table_full). Decision-mode front ends call it before
// Finish and return the id with their answer.
func (c *Core) Hold(d *Verdict, dst []byte) ([]byte, bool) {
	if d.np == 0 {
		return dst, false
	}
	now := c.cfg.Clock.Now().UnixNano()
	t := &c.held
	t.mu.Lock()
	c.expireLocked(now)
	if t.ring == nil {
		t.ring = make([]heldEntry, c.cfg.MaxHeld)
		t.byID = make(map[[16]byte]int, min(c.cfg.MaxHeld, 1024))
	}
	if t.n == len(t.ring) {
		t.mu.Unlock()
		c.keepAs(d, settledFull)
		return dst, false
	}
	i := (t.head + t.n) % len(t.ring)
	e := &t.ring[i]
	for {
		rand.Read(e.id[:]) // never fails (crypto/rand)
		if _, dup := t.byID[e.id]; !dup {
			break
		}
	}
	e.deadline, e.live, e.np = now+int64(c.cfg.SettleTimeout), true, d.np
	copy(e.pend[:], d.pend[:d.np])
	for i := range d.np {
		d.pend[i] = pendingUnits{}
	}
	d.np = 0
	t.byID[e.id] = i
	t.n++
	t.live++
	if t.live == 1 {
		c.armLocked(time.Duration(e.deadline - now))
	}
	id := e.id
	t.mu.Unlock()
	return hex.AppendEncode(dst, id[:]), true
}

// SettleHeld settles the reservation id (as Hold returned it) from its
// response, as Settle does a Verdict's, and removes it: an id settles
// once. A status under 100 says no response came: the units are kept. It reports false for an id the table does not hold (malformed,
// settled already, kept at its timeout, or issued by another edge).
func (c *Core) SettleHeld(id []byte, status int, h ResponseHeader) bool {
	var k [16]byte
	if len(id) != ReservationIDLen {
		c.sm.unknown.Inc()
		return false
	}
	if _, err := hex.Decode(k[:], id); err != nil {
		c.sm.unknown.Inc()
		return false
	}
	now := c.cfg.Clock.Now().UnixNano()
	t := &c.held
	t.mu.Lock()
	c.expireLocked(now)
	i, ok := t.byID[k]
	if !ok {
		t.mu.Unlock()
		c.sm.unknown.Inc()
		return false
	}
	e := &t.ring[i]
	delete(t.byID, k)
	e.live = false
	t.live--
	var v Verdict // the reservation's units, settled as a Verdict's
	v.np = e.np
	copy(v.pend[:], e.pend[:e.np])
	for j := range e.np {
		e.pend[j] = pendingUnits{}
	}
	t.mu.Unlock()
	if status < 100 {
		c.keepAs(&v, settledNoResponse) // no response came (Envoy's 0)
	} else {
		c.Settle(&v, status, h)
	}
	return true
}

// expireLocked keeps the units of every reservation whose settle call did
// not come in time, and drops settled entries from the head of the ring.
func (c *Core) expireLocked(now int64) {
	t := &c.held
	for t.n > 0 {
		e := &t.ring[t.head]
		if e.live {
			if e.deadline > now {
				return
			}
			delete(t.byID, e.id)
			e.live = false
			t.live--
			for j := range e.np {
				c.settle(&e.pend[j], e.pend[j].units, now, settledTimeout)
				e.pend[j] = pendingUnits{}
			}
		}
		e.np = 0
		t.head = (t.head + 1) % len(t.ring)
		t.n--
	}
}

// armLocked has the table swept after d, so that reservations nobody
// settles keep their units (and emit their events) in time on an edge
// that issues no more.
func (c *Core) armLocked(d time.Duration) {
	t := &c.held
	d = max(d, time.Millisecond)
	if t.timer == nil {
		t.timer = time.AfterFunc(d, c.sweepHeld)
		return
	}
	t.timer.Reset(d)
}

func (c *Core) sweepHeld() {
	now := c.cfg.Clock.Now().UnixNano()
	t := &c.held
	t.mu.Lock()
	defer t.mu.Unlock()
	c.expireLocked(now)
	for t.n > 0 {
		e := &t.ring[t.head]
		if e.live {
			c.armLocked(time.Duration(e.deadline - now))
			return
		}
		t.head = (t.head + 1) % len(t.ring)
		t.n--
	}
}

// keepAs settles every unit d holds without a response, counting how:
// kept, or given back when the edge itself refused the request after a
// counting rule admitted it (another rule of a match: all file, a full
// queue), since no origin answered it.
func (c *Core) keepAs(d *Verdict, how settledHow) {
	if d.np == 0 {
		return
	}
	now := c.cfg.Clock.Now().UnixNano()
	for i := range d.np {
		counted := d.pend[i].units
		if how == settledRefused {
			counted = 0
		}
		c.settle(&d.pend[i], counted, now, how)
		d.pend[i] = pendingUnits{}
	}
	d.np = 0
}
