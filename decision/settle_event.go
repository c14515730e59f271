package decision

import "github.com/poplimit/poplimit/event"

// setSettled records on a counting rule's event that its request settled,
// counting counted of its units, micros after its decision.
func setSettled(ev *event.Event, counted, micros uint32) {
	ev.Counting, ev.Counted, ev.SettleMicros = true, min(counted, ev.Cost), micros
}
