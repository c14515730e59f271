package algo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// slWall returns 2024-01-08 hh:mm:ss UTC in Unix nanoseconds.
func slWall(hh, mm, ss int) int64 {
	return time.Date(2024, 1, 8, hh, mm, ss, 0, time.UTC).UnixNano()
}

func slClock(ns int64) string {
	if ns == math.MaxInt64 {
		return "never"
	}
	return time.Unix(0, ns).UTC().Format(time.TimeOnly)
}

// TestSlidingLogThreePerMinute: 3 per 60 s, log [12:00:10,
// 12:00:30, 12:00:55]; at 12:01:20 the window (12:00:20, 12:01:20] holds 2,
// so the request is allowed.
func TestSlidingLogThreePerMinute(t *testing.T) {
	l := SlidingLog{Limit: 3, Window: time.Minute}
	var s SlidingLogState
	for _, at := range []int64{slWall(12, 0, 10), slWall(12, 0, 30), slWall(12, 0, 55)} {
		if ok, _, _ := l.Allow(&s, at, 1); !ok {
			t.Fatalf("Allow(%s) refused, want admitted", slClock(at))
		}
	}
	now := slWall(12, 1, 20)
	if got := l.Count(&s, now); got != 2 {
		t.Errorf("Count(12:01:20) = %d, want 2 (12:00:10 pruned)", got)
	}
	ok, remaining, release := l.Allow(&s, now, 1)
	if !ok || remaining != 0 || release != slWall(12, 1, 30) {
		t.Errorf("Allow(12:01:20) = (%v, %d, %s), want (true, 0, 12:01:30)", ok, remaining, slClock(release))
	}
	var logged []string
	for i := range s.Len() {
		logged = append(logged, slClock(s.at(i).at))
	}
	if want := []string{"12:00:30", "12:00:55", "12:01:20"}; !slices.Equal(logged, want) {
		t.Errorf("log = %v, want %v", logged, want)
	}
}

// TestSlidingLogStopsTheDoubleBurst replays the fixed window's boundary burst:
// the exact log refuses the second hundred.
func TestSlidingLogStopsTheDoubleBurst(t *testing.T) {
	l := SlidingLog{Limit: 100, Window: time.Minute}
	var s SlidingLogState
	admitted := 0
	for _, now := range []int64{slWall(10, 3, 59), slWall(10, 4, 0)} {
		for range 100 {
			if ok, _, _ := l.Allow(&s, now, 1); ok {
				admitted++
			}
		}
	}
	if admitted != 100 {
		t.Errorf("admitted %d in [10:03:59, 10:04:00], want 100", admitted)
	}
	if got := l.Release(&s, slWall(10, 4, 0), 1); got != slWall(10, 4, 59) {
		t.Errorf("Release(10:04:00, 1) = %s, want 10:04:59", slClock(got))
	}
	if s.Len() != 1 {
		t.Errorf("Len = %d, want 1 (one instant, 100 units)", s.Len())
	}
}

func TestSlidingLogAllow(t *testing.T) {
	sec := int64(time.Second)
	l := SlidingLog{Limit: 3, Window: 10 * time.Second}
	steps := []struct {
		name          string
		now, n        int64
		wantOK        bool
		wantRemaining int64
		wantRelease   int64
		wantCount     int64
	}{
		{"first", 100 * sec, 1, true, 2, 100 * sec, 1},
		{"two at once", 104 * sec, 2, true, 0, 114 * sec, 3}, // n = 2 needs both 104 s units gone
		{"full", 105 * sec, 1, false, 0, 110 * sec, 3},
		{"two need both of 104 s gone", 105 * sec, 2, false, 0, 114 * sec, 3},
		{"more than Limit: never", 105 * sec, 4, false, 0, math.MaxInt64, 3},
		{"a nanosecond before 100 s leaves", 110*sec - 1, 1, false, 0, 110 * sec, 3},
		{"100 s has left at exactly 110 s", 110 * sec, 1, true, 0, 114 * sec, 3},
		{"n = 0 is a query", 111 * sec, 0, true, 0, 111 * sec, 3},
		{"a clock that steps back is clamped", 50 * sec, 1, false, 0, 114 * sec, 3},
		{"all gone", 120 * sec, 3, true, 0, 130 * sec, 3},
	}
	var s SlidingLogState
	for _, st := range steps {
		ok, remaining, release := l.Allow(&s, st.now, st.n)
		if ok != st.wantOK || remaining != st.wantRemaining || release != st.wantRelease {
			t.Errorf("%s: Allow(%d s, %d) = (%v, %d, %v), want (%v, %d, %v)", st.name, st.now/sec, st.n,
				ok, remaining, release, st.wantOK, st.wantRemaining, st.wantRelease)
		}
		if got := l.Count(&s, st.now); got != st.wantCount {
			t.Errorf("%s: Count = %d, want %d", st.name, got, st.wantCount)
		}
	}
}

func TestSlidingLogAddCountsAttempts(t *testing.T) {
	// Add logs whatever the limit: the aggregator records every attempt.
	l := SlidingLog{Limit: 2, Window: time.Minute}
	var s SlidingLogState
	base := slWall(9, 0, 0)
	for i := range 5 {
		l.Add(&s, base+int64(i)*int64(time.Second), 1)
	}
	if got := l.Count(&s, base+4*int64(time.Second)); got != 5 {
		t.Errorf("Count after 5 Adds = %d, want 5", got)
	}
	if got := l.Remaining(&s, base+4*int64(time.Second)); got != 0 {
		t.Errorf("Remaining = %d, want 0", got)
	}
	// 4 of the 5 must leave before one more fits: the 4th was at base+3 s.
	if got, want := l.Release(&s, base+4*int64(time.Second), 1), base+63*int64(time.Second); got != want {
		t.Errorf("Release = %s, want %s", slClock(got), slClock(want))
	}
}

func TestSlidingLogOutOfOrderIsClamped(t *testing.T) {
	l := SlidingLog{Limit: 10, Window: 10 * time.Second}
	var s SlidingLogState
	sec := int64(time.Second)
	l.Add(&s, 100*sec, 1)
	l.Add(&s, 95*sec, 1) // logged as 100 s
	if got := l.Count(&s, 109*sec); got != 2 {
		t.Errorf("Count(109 s) = %d, want 2 (the late event clamped to 100 s)", got)
	}
	if got := l.Count(&s, 50*sec); got != 2 {
		t.Errorf("Count(50 s) after Count(109 s) = %d, want 2 (the query clamped to 109 s)", got)
	}
	if got := l.Count(&s, 110*sec); got != 0 {
		t.Errorf("Count(110 s) = %d, want 0", got)
	}
}

// slNaive is the sliding log's definition, written out: every event kept,
// every query a scan.
type slNaive struct {
	l      SlidingLog
	events []slEntry // at, n
	latest int64
	seen   bool
}

func (m *slNaive) clamp(now int64) int64 {
	if m.seen && now < m.latest {
		now = m.latest
	}
	m.latest, m.seen = now, true
	return now
}

func (m *slNaive) count(now int64) int64 {
	var c int64
	for _, e := range m.events {
		if e.at > now-int64(m.l.Window) && e.at <= now {
			c += e.cum
		}
	}
	return c
}

func (m *slNaive) release(now, n int64) int64 {
	if n <= 0 {
		return now
	}
	candidates := []int64{now}
	for _, e := range m.events {
		candidates = append(candidates, e.at+int64(m.l.Window))
	}
	slices.Sort(candidates)
	for _, t := range candidates {
		if t >= now && m.count(t)+n <= m.l.Limit {
			return t
		}
	}
	return math.MaxInt64
}

// slRun applies one operation to both the log and the model and reports a
// difference.
func slRun(l SlidingLog, s *SlidingLogState, m *slNaive, op byte, now, n int64) error {
	switch op % 4 {
	case 0:
		l.Add(s, now, n)
		now = m.clamp(now)
		if n > 0 {
			m.events = append(m.events, slEntry{at: now, cum: n})
		}
	case 1:
		ok, remaining, release := l.Allow(s, now, n)
		now = m.clamp(now)
		c := m.count(now)
		wantOK := n <= 0 || c+n <= l.Limit
		if wantOK && n > 0 {
			m.events = append(m.events, slEntry{at: now, cum: n})
			c += n
		}
		wantRelease := m.release(now, n)
		if ok != wantOK || remaining != max(0, l.Limit-c) || release != wantRelease {
			return fmt.Errorf("Allow(%d, %d) = (%v, %d, %d), model (%v, %d, %d)",
				now, n, ok, remaining, release, wantOK, max(0, l.Limit-c), wantRelease)
		}
	case 2:
		got := l.Count(s, now)
		now = m.clamp(now)
		if want := m.count(now); got != want {
			return fmt.Errorf("Count(%d) = %d, model %d", now, got, want)
		}
	case 3:
		got := l.Release(s, now, n)
		now = m.clamp(now)
		if want := m.release(now, n); got != want {
			return fmt.Errorf("Release(%d, %d) = %d, model %d", now, n, got, want)
		}
	}
	if s.Len() > len(s.ring) || (len(s.ring) > slMinRing && s.Len() > 0 && s.Len() <= len(s.ring)/8) {
		return fmt.Errorf("ring of %d holds %d entries", len(s.ring), s.Len())
	}
	return nil
}

// TestSlidingLogMatchesDefinition compares the log with the naive model on
// seeded random operation sequences, out-of-order instants included.
func TestSlidingLogMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(0x106, 3))
	for trial := range 300 {
		l := SlidingLog{Limit: rng.Int64N(12), Window: time.Duration(rng.Int64N(50))}
		var s SlidingLogState
		m := &slNaive{l: l}
		now := rng.Int64N(100) - 50
		for i := range 400 {
			switch rng.IntN(5) {
			case 0: // same instant
			case 1:
				now -= rng.Int64N(10) // out of order
			default:
				now += rng.Int64N(int64(l.Window)/3 + 2)
			}
			if err := slRun(l, &s, m, byte(rng.IntN(4)), now, rng.Int64N(5)-1); err != nil {
				t.Fatalf("trial %d %+v, op %d: %v", trial, l, i, err)
			}
		}
	}
}

// FuzzSlidingLog compares the log with the naive model on arbitrary
// operation sequences: each 3 bytes are an operation, a time step and n.
func FuzzSlidingLog(f *testing.F) {
	f.Add(int64(3), int64(60), []byte{1, 10, 1, 1, 20, 1, 1, 25, 1, 1, 25, 1, 2, 0, 0, 3, 0, 1})
	f.Add(int64(1), int64(1), []byte{0, 0, 5, 1, 0, 1, 3, 1, 1})
	f.Add(int64(0), int64(0), []byte{1, 255, 255})
	f.Add(int64(3), int64(-35), []byte("10C")) // a negative Window once overflowed Release
	f.Fuzz(func(t *testing.T, limit, window int64, ops []byte) {
		l := SlidingLog{Limit: limit % 1000, Window: time.Duration(window % 1000)}
		var s SlidingLogState
		m := &slNaive{l: l}
		now := int64(0)
		for i := 0; i+2 < len(ops); i += 3 {
			step := int64(int8(ops[i+1])) // negative steps test clamping
			now += step
			if err := slRun(l, &s, m, ops[i], now, int64(ops[i+2]%8)-1); err != nil {
				t.Fatalf("%+v, op %d: %v", l, i/3, err)
			}
		}
	})
}

func TestSlidingLogMemoryIsBounded(t *testing.T) {
	l := SlidingLog{Limit: 100, Window: time.Second}
	var s SlidingLogState
	now := slWall(10, 0, 0)
	// 10,000 requests at 1,000 per second, against 100 per second: the log
	// holds at most the 100 admitted in the window.
	for range 10_000 {
		now += int64(time.Millisecond)
		l.Allow(&s, now, 1)
		if s.Len() > 100 {
			t.Fatalf("Len = %d, want ≤ Limit 100", s.Len())
		}
	}
	if len(s.ring) > 128 {
		t.Errorf("ring of %d entries for at most 100 in the window, want ≤ 128", len(s.ring))
	}
	// Idle past the window: the entries leave and the ring shrinks back.
	if got := l.Count(&s, now+int64(time.Second)); got != 0 || s.Len() != 0 || len(s.ring) != slMinRing {
		t.Errorf("after a window of idle: Count %d, Len %d, ring %d; want 0, 0, %d", got, s.Len(), len(s.ring), slMinRing)
	}
}

func TestSlidingLogValidate(t *testing.T) {
	tests := []struct {
		l    SlidingLog
		want string
	}{
		{SlidingLog{Limit: 10, Window: time.Hour}, ""},
		{SlidingLog{Limit: -1, Window: time.Hour}, "algo: SlidingLog.Limit -1: must be > 0"},
		{SlidingLog{Limit: 1}, "algo: SlidingLog.Window 0s: must be > 0"},
	}
	for _, tt := range tests {
		got := ""
		if err := tt.l.Validate(); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%+v.Validate() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestSlidingLogSteadyStateAllocs(t *testing.T) {
	l := SlidingLog{Limit: 100, Window: time.Second}
	var s SlidingLogState
	now := slWall(10, 0, 0)
	step := func() {
		now += int64(5 * time.Millisecond) // 200 per second against 100: half refused
		l.Allow(&s, now, 1)
		l.Count(&s, now)
		l.Release(&s, now, 1)
		l.Add(&s, now, 0)
	}
	for range 1000 { // warm up: the ring reaches its size
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Errorf("allocs per steady-state call round = %v, want 0", allocs)
	}
}

func slSteady() (SlidingLog, *SlidingLogState, int64) {
	l := SlidingLog{Limit: 100, Window: time.Second}
	s := new(SlidingLogState)
	now := slWall(10, 0, 0)
	for range 1000 {
		now += int64(5 * time.Millisecond)
		l.Allow(s, now, 1)
	}
	return l, s, now
}

func BenchmarkSlidingLogAllow(b *testing.B) {
	l, s, now := slSteady()
	b.ReportAllocs()
	for b.Loop() {
		now += int64(5 * time.Millisecond)
		l.Allow(s, now, 1)
	}
}

func BenchmarkSlidingLogAdd(b *testing.B) {
	l, s, now := slSteady()
	b.ReportAllocs()
	for b.Loop() {
		now += int64(5 * time.Millisecond)
		l.Add(s, now, 1)
	}
}

func BenchmarkSlidingLogCount(b *testing.B) {
	l, s, now := slSteady()
	b.ReportAllocs()
	for b.Loop() {
		l.Count(s, now)
	}
}

func BenchmarkSlidingLogRelease(b *testing.B) {
	l, s, now := slSteady()
	b.ReportAllocs()
	for b.Loop() {
		l.Release(s, now, 50)
	}
}

// A sliding log of 3 per 60 s.
func ExampleSlidingLog_Allow() {
	l := SlidingLog{Limit: 3, Window: time.Minute}
	var s SlidingLogState // one per key; zero is an empty log

	at := func(hh, mm, ss int) int64 { return time.Date(2024, 1, 8, hh, mm, ss, 0, time.UTC).UnixNano() }
	clock := func(ns int64) string { return time.Unix(0, ns).UTC().Format(time.TimeOnly) }
	for _, t := range []int64{at(12, 0, 10), at(12, 0, 30), at(12, 0, 55)} {
		l.Allow(&s, t, 1)
	}
	fmt.Println("count at 12:01:20:", l.Count(&s, at(12, 1, 20)))
	ok, remaining, release := l.Allow(&s, at(12, 1, 20), 1)
	fmt.Println("allow at 12:01:20:", ok, remaining, "next at", clock(release))
	ok, _, release = l.Allow(&s, at(12, 1, 25), 1)
	fmt.Println("allow at 12:01:25:", ok, "retry at", clock(release))
	// Output:
	// count at 12:01:20: 2
	// allow at 12:01:20: true 0 next at 12:01:30
	// allow at 12:01:25: false retry at 12:01:30
}

// The aggregator's use: Add every attempt, then ask what the exact count was.
func ExampleSlidingLog_Add() {
	attempts := SlidingLog{Limit: 5, Window: 10 * time.Second}
	var s SlidingLogState
	sec := int64(time.Second)
	for _, t := range []int64{1, 2, 2, 3, 9, 11, 12} {
		attempts.Add(&s, t*sec, 1)
	}
	// (2 s, 12 s] holds the attempts at 3, 9, 11 and 12 s.
	fmt.Println("attempts in (2 s, 12 s]:", attempts.Count(&s, 12*sec))
	fmt.Println("over the limit of 5:", attempts.Count(&s, 12*sec) > attempts.Limit)
	// Output:
	// attempts in (2 s, 12 s]: 4
	// over the limit of 5: false
}
