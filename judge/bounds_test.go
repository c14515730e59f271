package judge

import (
	"slices"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
)

func TestBoundedMemory(t *testing.T) {
	tests := []struct {
		name       string
		cfg        func(*Config)
		events     []event.Event
		keys       int
		evicted    map[string]int64
		overflows  int64
		late       int64
		logEntries int
		wantJudged int64
	}{
		{
			name: "idle keys expire after two windows",
			cfg:  func(c *Config) { c.AllowedLateness = 0 },
			// Window 1 s: key 1 (last at 0) is two windows old when key 2
			// is judged at 2000; key 3 at 1999 is not.
			events:     []event.Event{ev(0, 1, A, win(1000)), ev(1999, 3, A, win(1000)), ev(2000, 2, A, win(1000))},
			keys:       2,
			evicted:    map[string]int64{"idle": 1, "max_keys": 0, "max_log_entries": 0},
			logEntries: 4, wantJudged: 3,
		},
		{
			name: "windows are tracked apart",
			cfg:  func(c *Config) { c.AllowedLateness = 0 },
			// Key 1 (10 s) is young at 2000; key 2 (1 s) is two windows old.
			events:     []event.Event{ev(0, 1, A), ev(0, 2, A, win(1000)), ev(2000, 3, A, win(1000))},
			keys:       2,
			evicted:    map[string]int64{"idle": 1, "max_keys": 0, "max_log_entries": 0},
			logEntries: 4, wantJudged: 3,
		},
		{
			name:       "the key cap evicts the least recently active",
			cfg:        func(c *Config) { c.MaxKeys = 2 },
			events:     []event.Event{ev(0, 1, A), ev(10, 2, A), ev(20, 3, A), ev(30, 2, A)},
			keys:       2,
			evicted:    map[string]int64{"idle": 0, "max_keys": 1, "max_log_entries": 0},
			logEntries: 6, wantJudged: 4,
		},
		{
			name: "the log entry cap evicts the least recently active",
			cfg:  func(c *Config) { c.MaxLogEntries = 20 },
			// Key 1: 8 admissions, 16 entries. Key 2's 3rd makes 22.
			events:     cat(burst(0, 8, 10, 1, A), burst(100, 3, 10, 2, A)),
			keys:       1,
			evicted:    map[string]int64{"idle": 0, "max_keys": 0, "max_log_entries": 1},
			logEntries: 6, wantJudged: 11,
		},
		{
			name: "units within one resolution step share an entry",
			events: []event.Event{ev(0, 1, A), ev(0, 1, A), {Time: t0 + 400_000, KeyHash: 1, Rule: []byte("api"),
				Cost: 1, Limit: 10, WindowMillis: 10_000}},
			keys:       1,
			evicted:    map[string]int64{"idle": 0, "max_keys": 0, "max_log_entries": 0},
			logEntries: 2, wantJudged: 3,
		},
		{
			name: "a full buffer judges its oldest early",
			cfg:  func(c *Config) { c.MaxBuffered = 3; c.AllowedLateness = time.Hour },
			// Arrivals 4, 3, 2, 1, 0 s: 1 is judged early when 4 wait, then
			// 0 likewise, after 1: late.
			events:     []event.Event{ev(4000, 1, A), ev(3000, 1, A), ev(2000, 1, A), ev(1000, 1, A), ev(0, 1, A)},
			keys:       1,
			evicted:    map[string]int64{"idle": 0, "max_keys": 0, "max_log_entries": 0},
			overflows:  2,
			late:       1,
			logEntries: 8, wantJudged: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, tt.cfg, tt.events)
			if r.Keys != tt.keys {
				t.Errorf("keys: got %d, want %d", r.Keys, tt.keys)
			}
			for reason, want := range tt.evicted {
				if got := r.KeysEvicted[reason]; got != want {
					t.Errorf("evicted %s: got %d, want %d", reason, got, want)
				}
			}
			if r.BufferOverflows != tt.overflows {
				t.Errorf("buffer overflows: got %d, want %d", r.BufferOverflows, tt.overflows)
			}
			if r.Late != tt.late {
				t.Errorf("late: got %d, want %d", r.Late, tt.late)
			}
			if r.LogEntries != tt.logEntries {
				t.Errorf("log entries: got %d, want %d", r.LogEntries, tt.logEntries)
			}
			if r.Judged != tt.wantJudged {
				t.Errorf("judged: got %d, want %d", r.Judged, tt.wantJudged)
			}
		})
	}
}

func TestWrongKeysBounded(t *testing.T) {
	// Ten keys over their limit by 1..10 (limit 10): with room for four,
	// the most severe survive.
	var events []event.Event
	for k := range 10 {
		events = append(events, burst(0, 11+k, 1, uint64(k+1), A)...)
	}
	r := run(t, func(c *Config) { c.MaxWrongKeys = 4; c.TopKeys = 3 }, events)
	if !r.WrongKeysTruncated {
		t.Error("truncated: got false, want true")
	}
	var got []string
	for _, k := range r.TopFalseNegatives {
		got = append(got, k.KeyHash)
	}
	want := []string{"000000000000000a", "0000000000000009", "0000000000000008"}
	if !slices.Equal(got, want) {
		t.Errorf("top false negatives: got %v, want %v", got, want)
	}
	if r.FalseNegativeKeys < 10 {
		t.Errorf("false negative keys: got %d, want at least 10 (an upper bound once truncated)", r.FalseNegativeKeys)
	}
}

func TestLabelCaps(t *testing.T) {
	r := run(t, func(c *Config) { c.MaxRules = 2; c.MaxEdges = 1 }, []event.Event{
		ev(0, 1, A, rule("a"), onEdge(7)), ev(0, 1, A, rule("b"), onEdge(8)),
		ev(0, 1, A, rule("c"), onEdge(9)), ev(0, 1, A, rule("d"), onEdge(9)),
	})
	var rules, edges []string
	for _, b := range r.ByRule {
		rules = append(rules, b.Name)
	}
	for _, b := range r.ByEdge {
		edges = append(edges, b.Name)
	}
	if want := []string{"_other", "a", "b"}; !slices.Equal(rules, want) {
		t.Errorf("rule rows: got %v, want %v", rules, want)
	}
	if want := []string{"7", "_other"}; !slices.Equal(edges, want) {
		t.Errorf("edge rows: got %v, want %v", edges, want)
	}
	if r.Keys != 3 { // "c" and "d" share _other and the key hash
		t.Errorf("keys: got %d, want 3", r.Keys)
	}
}

// TestAddAllocs checks that judging a key's steady traffic allocates nothing
// once its structures have grown.
func TestAddAllocs(t *testing.T) {
	j := newJudge(t, func(c *Config) {
		c.AllowedLateness = 50 * time.Millisecond
		c.Dedup = 1 << 12
		c.MaxClockSkew, c.MaxEventAge = DefaultConfig().MaxClockSkew, DefaultConfig().MaxEventAge // now is a clock here
	})
	rule := []byte("api")
	e := event.Event{Rule: rule, Cost: 1, Limit: 1000, WindowMillis: 1000, Edge: 1}
	now := t0
	step := func() {
		for k := range uint64(64) {
			e.Time, e.KeyHash = now, k
			e.Decision = event.Admission(k % 2)
			j.Add(now, e)
		}
		now += int64(time.Millisecond)
	}
	for range 5000 { // grow the logs to a window's worth and the buffer to its steady size
		step()
	}
	if got := testing.AllocsPerRun(1000, step); got != 0 {
		t.Errorf("allocations per 64 events: got %v, want 0", got)
	}
	if r := j.Report(); r.Invalid != 0 || r.Judged == 0 {
		t.Errorf("invalid, judged: got %d, %d; want 0 and every event judged", r.Invalid, r.Judged)
	}
}
