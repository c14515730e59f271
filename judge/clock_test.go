package judge

import (
	"cmp"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

const century = 100 * 365 * 24 * time.Hour

// clockRun feeds a live stream to a Judge with the default configuration,
// as the aggregator does: every event arrives 50 ms after its time, the
// stream goes quiet (an idle flush) after each phase, and inject, if not
// nil, arrives between the phases. Phase 1 leaves three keys of "api" (10
// per 10 s) with history that decides phase 2: key 1 at 9 admissions, so
// its 11th in phase 2 is wrongly allowed; key 2 at 10, so its refusal is
// right; key 3 at 9, so its 10th is right.
func clockRun(t *testing.T, inject []event.Event) (Report, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	j, err := New(DefaultConfig(), reg)
	if err != nil {
		t.Fatal(err)
	}
	const delivery = 50 * ms
	feed := func(evs ...event.Event) {
		slices.SortStableFunc(evs, func(a, b event.Event) int { return cmp.Compare(a.Time, b.Time) })
		for _, e := range evs {
			j.Add(e.Time+delivery, e)
			j.Advance(e.Time + delivery + int64(DefaultConfig().Hold))
		}
	}
	feed(concat(
		burst(0, 9, 100, 1, A),
		burst(0, 10, 100, 2, A),
		burst(0, 9, 100, 3, A),
	)...)
	j.Flush() // idle
	now := t0 + 3000*ms
	j.Add(now, inject...)
	j.Advance(now + int64(time.Second))
	j.Flush() // idle
	feed(concat(
		burst(5000, 2, 100, 1, A),
		burst(5000, 1, 0, 2, L),
		burst(5000, 1, 0, 3, A),
	)...)
	j.Flush() // idle
	return j.Report(), reg
}

// TestClockBounds injects an event 100 years ahead of the clock and one
// 100 years behind it into a live stream: both are counted invalid, and
// everything else is judged as if they had never come.
func TestClockBounds(t *testing.T) {
	future := ev(3000, 1, A)
	future.Time += int64(century)
	past := ev(3000, 3, A)
	past.Time -= int64(century)

	want, _ := clockRun(t, nil)
	if want.Enforced.Decisions != 32 || want.Enforced.WronglyAllowed != 1 || want.Enforced.WronglyLimited != 0 || want.Late != 0 {
		t.Fatalf("without injected events: got %d decisions, %d wrongly allowed, %d wrongly limited, %d late; want 32, 1, 0, 0",
			want.Enforced.Decisions, want.Enforced.WronglyAllowed, want.Enforced.WronglyLimited, want.Late)
	}
	tests := []struct {
		name         string
		inject       []event.Event
		future, past int64
	}{
		{"100 years ahead", []event.Event{future}, 1, 0},
		{"100 years behind", []event.Event{past}, 0, 1},
		{"both", []event.Event{future, past}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reg := clockRun(t, tt.inject)
			for _, c := range []struct {
				reason string
				want   int64
			}{{"future", tt.future}, {"past", tt.past}, {"parameters", 0}} {
				if n := got.InvalidBreakdown[c.reason]; n != c.want {
					t.Errorf("report: invalid %s: got %d, want %d", c.reason, n, c.want)
				}
				if n := testenv.MetricSum(t, reg, "poplimit_aggregator_invalid_events_total", "reason", c.reason); n != float64(c.want) {
					t.Errorf("invalid_events_total{reason=%q}: got %v, want %d", c.reason, n, c.want)
				}
			}
			if n := int64(len(tt.inject)); got.Events != want.Events+n || got.Invalid != n {
				t.Errorf("events, invalid: got %d, %d; want %d, %d", got.Events, got.Invalid, want.Events+n, n)
			}
			// Apart from those counts, the run is the one without them.
			got.Events, got.Invalid, got.InvalidBreakdown = want.Events, want.Invalid, want.InvalidBreakdown
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			if string(g) != string(w) {
				t.Errorf("report with injected events:\ngot  %s\nwant %s", g, w)
			}
		})
	}
}

// TestClockBoundsEdges checks each bound at its edge, and that zero turns
// it off.
func TestClockBoundsEdges(t *testing.T) {
	const now = t0
	cfg := DefaultConfig()
	ahead := int64(cfg.AllowedLateness + cfg.MaxClockSkew)
	age := int64(cfg.MaxEventAge)
	at := func(tm int64) event.Event { e := ev(0, 1, A); e.Time = tm; return e }
	tests := []struct {
		name         string
		mod          func(*Config)
		time         int64
		future, past int64
	}{
		{"at the future bound", nil, now + ahead, 0, 0},
		{"past the future bound", nil, now + ahead + 1, 1, 0},
		{"at the past bound", nil, now - age, 0, 0},
		{"past the past bound", nil, now - age - 1, 0, 1},
		{"future bound off", func(c *Config) { c.MaxClockSkew = 0 }, now + int64(century), 0, 0},
		{"past bound off", func(c *Config) { c.MaxEventAge = 0 }, now - int64(century), 0, 0},
		{"the end of time", nil, 1<<63 - 1, 1, 0},
		{"the start of time", nil, -1 << 63, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			if tt.mod != nil {
				tt.mod(&c)
			}
			j, err := New(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			j.Add(now, at(tt.time))
			r := j.Report()
			if got := [2]int64{r.InvalidBreakdown["future"], r.InvalidBreakdown["past"]}; got != [2]int64{tt.future, tt.past} {
				t.Errorf("invalid future, past: got %v, want [%d %d]", got, tt.future, tt.past)
			}
			if valid := tt.future+tt.past == 0; valid != (r.Watermark == tt.time-int64(c.AllowedLateness)) {
				t.Errorf("watermark: got %d, want it moved by the event only if valid (%v)", r.Watermark, valid)
			}
		})
	}
}

// TestAddSat checks the saturating addition the bounds use.
func TestAddSat(t *testing.T) {
	const maxI, minI = 1<<63 - 1, -1 << 63
	tests := []struct{ a, b, want int64 }{
		{1, 2, 3},
		{-1, -2, -3},
		{maxI, 1, maxI},
		{maxI - 1, 1, maxI},
		{minI, -1, minI},
		{minI + 1, -1, minI},
		{maxI, minI, -1},
		{0, 0, 0},
	}
	for _, tt := range tests {
		if got := addSat(tt.a, tt.b); got != tt.want {
			t.Errorf("addSat(%d, %d): got %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
