package decision

import (
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/window"
)

// Events carry the rule's algorithm as event.Algorithm(window.Algorithm):
// the two enumerations (pipeline does not import window) must agree.
func TestEventAlgorithmsMirrorWindow(t *testing.T) {
	for a := window.SlidingWindowCounter; a <= window.SlidingLogAlgorithm; a++ {
		if got := event.Algorithm(a).String(); got != a.String() {
			t.Errorf("event.Algorithm(%d) = %q, window's is %q", a, got, a.String())
		}
	}
}
