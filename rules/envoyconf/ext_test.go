package envoyconf

import (
	"testing"
	"time"

	"github.com/poplimit/poplimit/policy"
)

func TestExtensions(t *testing.T) {
	c := mustLoad(t, "ext/extensions.yaml")
	tests := []struct {
		entries []Entry
		want    Limit
	}{
		{es("remote_address", "1.2.3.4"), Limit{RequestsPerUnit: 100, Window: 90 * time.Second, Unit: UnitUnknown, Algorithm: policy.SlidingWindow, Mode: policy.Async, Action: policy.Block}},
		{es("api_key", "k"), Limit{RequestsPerUnit: 10, Window: time.Second, Unit: Second, Algorithm: policy.TokenBucket, Burst: 50, Mode: policy.Sync, Action: policy.Block}},
		{es("login", "u"), Limit{RequestsPerUnit: 5, Window: time.Minute, Unit: Minute, Algorithm: policy.FixedWindow, Mode: policy.Sync, Action: policy.Block, Timeout: 15 * time.Minute, Fail: policy.FailClosed}},
		{es("report", "r"), Limit{RequestsPerUnit: 3, Window: 36 * time.Hour, Unit: UnitUnknown, Algorithm: policy.FixedWindow, Mode: policy.Sync, Action: policy.Throttle}},
		{es("tick", "t"), Limit{RequestsPerUnit: 10, Window: 250 * time.Millisecond, Algorithm: policy.LeakyBucket, Burst: 10, Mode: policy.Sync, Action: policy.Block}},
	}
	for _, tt := range tests {
		m := c.Lookup("edge", tt.entries)
		if !m.Found() {
			t.Fatalf("Lookup(%v): not found", tt.entries)
		}
		got, w := m.Limit, tt.want
		if got.RequestsPerUnit != w.RequestsPerUnit || got.Window != w.Window || got.Unit != w.Unit ||
			got.Algorithm != w.Algorithm || got.Burst != w.Burst || got.Mode != w.Mode ||
			got.Action != w.Action || got.Timeout != w.Timeout || got.Fail != w.Fail {
			t.Errorf("Lookup(%v) = {rpu %d window %v unit %v alg %v burst %d mode %v action %v timeout %v fail %v}\nwant             {rpu %d window %v unit %v alg %v burst %d mode %v action %v timeout %v fail %v}",
				tt.entries, got.RequestsPerUnit, got.Window, got.Unit, got.Algorithm, got.Burst, got.Mode, got.Action, got.Timeout, got.Fail,
				w.RequestsPerUnit, w.Window, w.Unit, w.Algorithm, w.Burst, w.Mode, w.Action, w.Timeout, w.Fail)
		}
	}
	// A window of exactly a unit reports that unit.
	c2 := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, window: 1h}\n")
	if m := c2.Lookup("d", es("k", "v")); m.Limit.Unit != Hour {
		t.Errorf("window 1h: unit %v, want hour", m.Limit.Unit)
	}
}

func TestFileSwitch(t *testing.T) {
	c := mustLoad(t, "ext/switch.yaml")
	tests := []struct {
		entries []Entry
		alg     policy.Algorithm
		rpu     uint32
	}{
		{es("remote_address", "50.0.0.1"), policy.SlidingWindow, 10},
		{es("remote_address", "50.0.0.5"), policy.SlidingWindow, 0},
		{es("exact", "x"), policy.FixedWindow, 10},
	}
	for _, tt := range tests {
		m := c.Lookup("switched", tt.entries)
		if !m.Found() || m.Limit.Algorithm != tt.alg || m.Limit.RequestsPerUnit != tt.rpu {
			t.Errorf("Lookup(%v) = %+v, want algorithm %v, %d requests", tt.entries, m.Limit, tt.alg, tt.rpu)
		}
	}
	// Without the switch every limit is ratelimit's.
	for _, l := range mustLoad(t, "readme/ex3.yaml").Limits() {
		if l.Algorithm != policy.FixedWindow || l.Mode != policy.Sync || l.Action != policy.Block || l.Fail != policy.FailOpen || l.Burst != 0 || l.Timeout != 0 {
			t.Errorf("limit %s: %+v, want ratelimit's defaults", l.FullKey, l)
		}
	}
}

func TestWindows(t *testing.T) {
	tests := []struct {
		window time.Duration
		now    time.Time
		start  time.Time
		reset  time.Duration
	}{
		{time.Minute, time.Unix(125, 900e6), time.Unix(120, 0), 55 * time.Second},
		{time.Minute, time.Unix(120, 0), time.Unix(120, 0), 60 * time.Second},
		{90 * time.Second, time.Unix(100, 0), time.Unix(90, 0), 80 * time.Second},
		{250 * time.Millisecond, time.UnixMilli(1100), time.UnixMilli(1000), 150 * time.Millisecond},
		{time.Minute, time.Unix(-1, 0), time.Unix(-60, 0), time.Second},
	}
	for _, tt := range tests {
		l := &Limit{Window: tt.window}
		if got := l.WindowStart(tt.now); !got.Equal(tt.start) {
			t.Errorf("window %v at %v: start %v, want %v", tt.window, tt.now.UnixMilli(), got.UnixMilli(), tt.start.UnixMilli())
		}
		if got := l.UntilReset(tt.now); got != tt.reset {
			t.Errorf("window %v at %v: reset %v, want %v", tt.window, tt.now.UnixMilli(), got, tt.reset)
		}
	}
	l := &Limit{Window: 250 * time.Millisecond}
	m := Match{Limit: l, domain: "d", entries: es("k", "v")}
	if got, want := string(m.AppendCacheKey(nil, "", time.UnixMilli(1100))), "d_k_v_1000ms"; got != want {
		t.Errorf("cache key = %q, want %q", got, want)
	}
}

func TestUnits(t *testing.T) {
	tests := []struct {
		name string
		unit Unit
		ok   bool
		secs int64
	}{
		{"second", Second, true, 1},
		{"MINUTE", Minute, true, 60},
		{"Hour", Hour, true, 3600},
		{"day", Day, true, 86400},
		{"week", Week, true, 604800},
		{"month", Month, true, 2592000},
		{"year", Year, true, 31536000},
		{"unknown", UnitUnknown, false, 0},
		{"", UnitUnknown, false, 0},
		{"seconds", UnitUnknown, false, 0},
	}
	for _, tt := range tests {
		u, ok := ParseUnit(tt.name)
		if u != tt.unit || ok != tt.ok || u.Seconds() != tt.secs {
			t.Errorf("ParseUnit(%q) = %v, %v (%d s), want %v, %v (%d s)", tt.name, u, ok, u.Seconds(), tt.unit, tt.ok, tt.secs)
		}
	}
}
