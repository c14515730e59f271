package policy

import (
	"strings"
	"testing"
)

// The numbers are part of the event wire format (event/FORMAT.md: the
// algorithm byte, the mode and action flag bits) and of every rule built
// before: they must never change.
func TestNumbering(t *testing.T) {
	for _, tt := range []struct {
		got, want uint8
		name      string
	}{
		{uint8(SlidingWindow), 0, "sliding_window"}, {uint8(FixedWindow), 1, "fixed_window"},
		{uint8(TokenBucket), 2, "token_bucket"}, {uint8(LeakyBucket), 3, "leaky_bucket"},
		{uint8(SlidingLog), 4, "sliding_log"},
		{uint8(Throttle), 0, "throttle"}, {uint8(Block), 1, "block"}, {uint8(Delay), 2, "delay"},
		{uint8(Async), 0, "async"}, {uint8(Sync), 1, "sync"},
		{uint8(FailOpen), 0, "open"}, {uint8(FailClosed), 1, "closed"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %d, want %d", tt.name, tt.got, tt.want)
		}
	}
}

func TestParseAndString(t *testing.T) {
	for _, a := range []Algorithm{SlidingWindow, FixedWindow, TokenBucket, LeakyBucket, SlidingLog} {
		if got, err := Parse[Algorithm](a.String()); err != nil || got != a {
			t.Errorf("Parse(%q) = %v, %v", a.String(), got, err)
		}
	}
	for _, a := range []Action{Throttle, Block, Delay} {
		if got, ok := Lookup[Action](a.String()); !ok || got != a {
			t.Errorf("Lookup(%q) = %v, %v", a.String(), got, ok)
		}
	}
	if got, err := Parse[Mode](""); err != nil || got != Async {
		t.Errorf(`Parse[Mode]("") = %v, %v; want the zero value`, got, err)
	}
	if _, err := Parse[Fail]("ajar"); err == nil || !strings.Contains(err.Error(), "open, closed") {
		t.Errorf(`Parse[Fail]("ajar") = %v; want an error naming the valid names`, err)
	}
	if got := Algorithm(9).String(); got != "Algorithm(9)" {
		t.Errorf("Algorithm(9).String() = %q", got)
	}
	if !TokenBucket.IsBucket() || SlidingLog.IsBucket() || !FixedWindow.IsCounter() || TokenBucket.IsCounter() {
		t.Errorf("IsBucket/IsCounter disagree with the algorithms")
	}
	n := Names[Mode]()
	n[0] = "changed"
	if Async.String() != "async" {
		t.Errorf("Names returned the package's own slice")
	}
}
