package judge

import (
	"testing"
)

// TestDedupDropsCopies: a batch delivered twice (a produce retried after a
// lost acknowledgement, or a batch consumed again after a lost commit) is
// judged once with Dedup on, and its copies are counted apart; with Dedup
// off the copies are judged as requests and make an honest client look
// over its limit.
func TestDedupDropsCopies(t *testing.T) {
	// Key 1 at exactly its limit: 10 admitted in the window, all right.
	batch := burst(0, 10, 100, 1, A)
	// The producer retried the last five: they arrive again, later.
	stream := cat(batch, burst(1000, 3, 100, 2, A), batch[5:])

	j := newJudge(t, func(c *Config) { c.Dedup = 64 })
	for _, e := range stream {
		j.Add(0, e)
	}
	j.Flush()
	r := j.Report()
	if r.Events != 13 || r.Duplicates != 5 || r.Enforced.WronglyAllowed != 0 || r.Judged != 13 {
		t.Errorf("dedup on: events %d, duplicates %d, judged %d, wrongly allowed %d; want 13, 5, 13, 0",
			r.Events, r.Duplicates, r.Judged, r.Enforced.WronglyAllowed)
	}

	r = run(t, nil, stream) // Dedup 0
	if r.Events != 18 || r.Duplicates != 0 || r.Enforced.WronglyAllowed != 5 {
		t.Errorf("dedup off: events %d, duplicates %d, wrongly allowed %d; want 18, 0, 5 (the copies judged as requests)",
			r.Events, r.Duplicates, r.Enforced.WronglyAllowed)
	}
}

// TestDedupRemembersABoundedNumber: at most the latest Dedup events are
// remembered, at least the latest Dedup/2; a copy arriving after that many
// others is judged again, and distinct events that differ in any one field
// are never taken for copies.
func TestDedupRemembersABoundedNumber(t *testing.T) {
	j := newJudge(t, func(c *Config) { c.Dedup = 4; c.AllowedLateness = 0 })
	first := ev(0, 1, A)
	j.Add(0, first)
	j.Add(0, ev(1, 2, A))
	j.Add(0, first) // 1 event later: a copy
	for i := range 3 {
		j.Add(0, ev(int64(2+i), 2, A))
	}
	j.Add(0, first) // 4 events later: forgotten, judged (here, late)
	// Same key and time, one field different each: not copies.
	base := ev(50, 3, A)
	for _, o := range []opt{onEdge(2), estimate(3), cost(2), rule("other"), syncMode, shadow} {
		e := base
		o(&e)
		j.Add(0, e)
	}
	j.Flush()
	r := j.Report()
	if r.Duplicates != 1 || r.Events != 12 {
		t.Errorf("events %d, duplicates %d: want 12 and 1", r.Events, r.Duplicates)
	}
	if n := j.dups.remembered(); n < 2 || n > 4 {
		t.Errorf("fingerprints remembered: %d, want 2 to 4", n)
	}
}

// remembered returns how many fingerprints the two generations hold.
func (d *dedup) remembered() int {
	if d.limit == 0 {
		return 0
	}
	return d.n + d.countIn(d.gens[1-d.cur])
}

func (d *dedup) countIn(g []uint64) int {
	n := 0
	for _, v := range g {
		if v != 0 {
			n++
		}
	}
	return n
}

// TestDedupSkipsFramedEvents: events the consumer marked Framed (their
// frames deduplicated already) are not fingerprinted, so even an exact
// copy among them is judged; unframed copies still are dropped.
func TestDedupSkipsFramedEvents(t *testing.T) {
	batch := burst(0, 10, 100, 1, A)
	j := newJudge(t, func(c *Config) { c.Dedup = 64 })
	for _, e := range cat(batch, batch[5:]) {
		e.Framed = true
		j.Add(0, e)
	}
	for _, e := range cat(burst(2000, 4, 100, 2, A), burst(2000, 4, 100, 2, A)) {
		j.Add(0, e)
	}
	j.Flush()
	if r := j.Report(); r.Events != 15+4 || r.Duplicates != 4 {
		t.Errorf("events %d, duplicates %d; want 19 (15 framed, 4 unframed) and 4 (the unframed copies)", r.Events, r.Duplicates)
	}
}
