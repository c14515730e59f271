package decision

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
)

// eventLog keeps the events a core emits.
type eventLog struct {
	mu sync.Mutex
	ev []event.Event
}

func (l *eventLog) Emit(e *event.Event) bool {
	l.mu.Lock()
	l.ev = append(l.ev, *e)
	l.mu.Unlock()
	return true
}

func (l *eventLog) take() []event.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.ev
	l.ev = nil
	return ev
}

// A counting rule's admitted request emits its one event when it settles,
// saying what its response counted and when; a refusal's event is emitted
// at once and counts nothing; a request whose response never comes, or a
// reservation never settled, counts all its units.
func TestSettleEvents(t *testing.T) {
	rs, err := rules.ParseRules([]byte(`rules:
- {name: login, limit: 2, window: 1m, key: ["header:X-User"], count: {status: [401]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	c, err := New(rs, store.NewMemStore(nil), Options{Events: log})
	if err != nil {
		t.Fatal(err)
	}
	c.cfg.SettleTimeout = 50 * time.Millisecond
	defer c.Close(context.Background())
	decide := func(user string) *Verdict {
		return c.Decide(&Request{Host: []byte("h"), Method: []byte("POST"), Path: []byte("/login"),
			Addr: netip.MustParseAddr("192.0.2.1"), Fields: tableFields{"h:x-user": {user}}, Now: c.Now()})
	}
	check := func(what string, want event.Admission, counting bool, counted uint32, settled bool) {
		t.Helper()
		evs := log.take()
		if len(evs) != 1 {
			t.Fatalf("%s: %d events, want 1", what, len(evs))
		}
		e := evs[0]
		if e.Decision != want || e.Counting != counting || e.Counted != counted || (e.SettleMicros > 0) != settled {
			t.Errorf("%s: decision %v counting %v counted %d settle %dµs; want %v %v %d settled %v",
				what, e.Decision, e.Counting, e.Counted, e.SettleMicros, want, counting, counted, settled)
		}
	}

	d := decide("a")
	if len(log.take()) != 0 {
		t.Fatal("an admitted counting request emitted its event before it settled")
	}
	time.Sleep(2 * time.Millisecond)
	c.Settle(d, 200, nil)
	c.Finish(d)
	check("success", event.Allowed, true, 0, true)

	d = decide("a")
	time.Sleep(2 * time.Millisecond)
	c.Settle(d, 401, nil)
	c.Settle(d, 200, nil) // settles once
	c.Finish(d)
	check("failure", event.Allowed, true, 1, true)

	d = decide("a")
	time.Sleep(2 * time.Millisecond)
	c.Finish(d) // no response came
	check("no response", event.Allowed, true, 1, true)

	d = decide("a")
	check("refused", event.Limited, true, 0, false)
	c.Finish(d)

	d = decide("b")
	id, ok := c.Hold(d, nil)
	c.Finish(d)
	if !ok || len(id) != ReservationIDLen {
		t.Fatalf("Hold: %q %v", id, ok)
	}
	time.Sleep(200 * time.Millisecond)
	check("never settled", event.Allowed, true, 1, true)
	if c.SettleHeld(id, 200, nil) {
		t.Error("a reservation kept at its timeout settled after")
	}
}
