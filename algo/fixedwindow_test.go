package algo_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/poplimit/poplimit/algo"
)

// algWall returns 2024-01-08 hh:mm:ss UTC in Unix nanoseconds, the day the
// textbook examples are set on.
func algWall(hh, mm, ss int) int64 {
	return time.Date(2024, 1, 8, hh, mm, ss, 0, time.UTC).UnixNano()
}

// TestFixedWindowBoundaryDoubleBurst reproduces the fixed window's textbook flaw:
// 100 per minute, 100 requests at 10:03:59 and 100 more at 10:04:00, all
// admitted: 200 in two seconds.
func TestFixedWindowBoundaryDoubleBurst(t *testing.T) {
	fw := algo.FixedWindow{Limit: 100, Window: time.Minute}
	var st algo.FixedWindowState
	admitted := 0
	for _, now := range []int64{algWall(10, 3, 59), algWall(10, 4, 0)} {
		for i := range 100 {
			ok, _, _ := fw.Allow(&st, now, 1)
			if !ok {
				t.Fatalf("request %d at %s refused, want admitted", i+1, time.Unix(0, now).UTC().Format(time.TimeOnly))
			}
			admitted++
		}
	}
	if admitted != 200 {
		t.Errorf("admitted %d in [10:03:59, 10:04:00], want 200", admitted)
	}
	// The 201st is refused until the next window, 10:05:00.
	ok, remaining, release := fw.Allow(&st, algWall(10, 4, 0), 1)
	if ok || remaining != 0 || release != algWall(10, 5, 0) {
		t.Errorf("201st: Allow = (%v, %d, %s), want (false, 0, 10:05:00)",
			ok, remaining, time.Unix(0, release).UTC().Format(time.TimeOnly))
	}
}

func TestFixedWindowAllow(t *testing.T) {
	fw := algo.FixedWindow{Limit: 3, Window: 10 * time.Second}
	s := int64(time.Second)
	steps := []struct {
		name          string
		now, n        int64
		wantOK        bool
		wantRemaining int64
		wantRelease   int64
	}{
		{"first", 1 * s, 1, true, 2, 1 * s},
		{"two more fill the window", 9 * s, 2, true, 0, 10 * s},
		{"full window refuses", 9*s + 999_999_999, 1, false, 0, 10 * s},
		{"new window at its first nanosecond", 10 * s, 1, true, 2, 10 * s},
		{"n larger than what is left", 11 * s, 3, false, 2, 20 * s},
		{"n larger than Limit is never admitted", 11 * s, 4, false, 2, math.MaxInt64},
		{"n = 0 is a query", 11 * s, 0, true, 2, 11 * s},
		{"negative n is a query", 11 * s, -5, true, 2, 11 * s},
		{"clock steps back: counted in the newer window", 5 * s, 2, true, 0, 20 * s},
		{"skipped windows start empty", 95 * s, 3, true, 0, 100 * s},
	}
	var st algo.FixedWindowState
	for _, step := range steps {
		ok, remaining, release := fw.Allow(&st, step.now, step.n)
		if ok != step.wantOK || remaining != step.wantRemaining || release != step.wantRelease {
			t.Errorf("%s: Allow(%d, %d) = (%v, %d, %d), want (%v, %d, %d)", step.name, step.now, step.n,
				ok, remaining, release, step.wantOK, step.wantRemaining, step.wantRelease)
		}
		if got := fw.Remaining(st, step.now); got != step.wantRemaining {
			t.Errorf("%s: Remaining = %d, want %d", step.name, got, step.wantRemaining)
		}
	}
}

func TestFixedWindowReleaseIsExact(t *testing.T) {
	// Release(now, n) is the first instant Allow(·, n) succeeds.
	fw := algo.FixedWindow{Limit: 5, Window: time.Second}
	st := algo.FixedWindowState{}
	fw.Allow(&st, 1_500_000_000, 4)
	for _, n := range []int64{1, 2, 5} {
		rel := fw.Release(st, 1_500_000_000, n)
		probe := st
		if ok, _, _ := fw.Allow(&probe, rel, n); !ok {
			t.Errorf("n=%d: Allow at Release %d refused, want admitted", n, rel)
		}
		if rel > 1_500_000_000 {
			probe := st
			if ok, _, _ := fw.Allow(&probe, rel-1, n); ok {
				t.Errorf("n=%d: Allow at Release−1 %d admitted, want refused", n, rel-1)
			}
		}
	}
}

func TestFixedWindowWindowStart(t *testing.T) {
	tests := []struct {
		window time.Duration
		now    int64
		want   int64
	}{
		{time.Minute, algWall(10, 3, 59), algWall(10, 3, 0)},
		{time.Minute, algWall(10, 4, 0), algWall(10, 4, 0)},
		{time.Second, 0, 0},
		{time.Second, -1, -int64(time.Second)},
		{time.Second, -int64(time.Second), -int64(time.Second)},
		{3, 7, 6},
		{0, 12345, 12345},
	}
	for _, tt := range tests {
		fw := algo.FixedWindow{Limit: 1, Window: tt.window}
		if got := fw.WindowStart(tt.now); got != tt.want {
			t.Errorf("FixedWindow{Window: %v}.WindowStart(%d) = %d, want %d", tt.window, tt.now, got, tt.want)
		}
	}
}

func TestFixedWindowValidate(t *testing.T) {
	tests := []struct {
		fw      algo.FixedWindow
		wantErr string
	}{
		{algo.FixedWindow{Limit: 100, Window: time.Minute}, ""},
		{algo.FixedWindow{Limit: 0, Window: time.Minute}, "algo: FixedWindow.Limit 0: must be > 0"},
		{algo.FixedWindow{Limit: 1, Window: -time.Second}, "algo: FixedWindow.Window -1s: must be > 0"},
		{algo.FixedWindow{}, "algo: FixedWindow.Limit 0: must be > 0\nalgo: FixedWindow.Window 0s: must be > 0"},
	}
	for _, tt := range tests {
		err := tt.fw.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.wantErr {
			t.Errorf("%+v.Validate() = %q, want %q", tt.fw, got, tt.wantErr)
		}
	}
}

func TestFixedWindowInvalidRefuses(t *testing.T) {
	for _, fw := range []algo.FixedWindow{{}, {Limit: 5}, {Window: time.Second}, {Limit: -1, Window: time.Second}} {
		var st algo.FixedWindowState
		ok, remaining, release := fw.Allow(&st, 42, 1)
		if ok || remaining != 0 || release != math.MaxInt64 {
			t.Errorf("%+v.Allow(42, 1) = (%v, %d, %d), want (false, 0, MaxInt64)", fw, ok, remaining, release)
		}
	}
}

func TestFixedWindowAllocs(t *testing.T) {
	fw := algo.FixedWindow{Limit: 100, Window: time.Minute}
	var st algo.FixedWindowState
	now := algWall(10, 0, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		fw.Allow(&st, now, 1)
		fw.Remaining(st, now)
		fw.Release(st, now, 1)
	})
	if allocs != 0 {
		t.Errorf("allocs per Allow+Remaining+Release = %v, want 0", allocs)
	}
}

func BenchmarkFixedWindowAllow(b *testing.B) {
	fw := algo.FixedWindow{Limit: 100, Window: time.Second}
	var st algo.FixedWindowState
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000 // 1 µs: 1e6 per second against a limit of 100, mostly refused
		fw.Allow(&st, now, 1)
	}
}

func BenchmarkFixedWindowRemaining(b *testing.B) {
	fw := algo.FixedWindow{Limit: 100, Window: time.Second}
	st := algo.FixedWindowState{Start: algWall(10, 0, 0), Count: 40}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		fw.Remaining(st, now)
	}
}

func BenchmarkFixedWindowRelease(b *testing.B) {
	fw := algo.FixedWindow{Limit: 100, Window: time.Second}
	st := algo.FixedWindowState{Start: algWall(10, 0, 0), Count: 100}
	now := algWall(10, 0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now += 1000
		fw.Release(st, now, 1)
	}
}

// The boundary double burst: 100 per minute admits 200 in two seconds.
func ExampleFixedWindow_Allow() {
	fw := algo.FixedWindow{Limit: 100, Window: time.Minute}
	var st algo.FixedWindowState // one per key; zero is a key never seen

	at := func(hh, mm, ss int) int64 { return time.Date(2024, 1, 8, hh, mm, ss, 0, time.UTC).UnixNano() }
	admitted := 0
	for range 100 {
		if ok, _, _ := fw.Allow(&st, at(10, 3, 59), 1); ok {
			admitted++
		}
	}
	for range 100 {
		if ok, _, _ := fw.Allow(&st, at(10, 4, 0), 1); ok {
			admitted++
		}
	}
	ok, remaining, release := fw.Allow(&st, at(10, 4, 0), 1)
	fmt.Println("admitted in two seconds:", admitted)
	fmt.Println("201st:", ok, remaining, time.Unix(0, release).UTC().Format(time.TimeOnly))
	// Output:
	// admitted in two seconds: 200
	// 201st: false 0 10:05:00
}
