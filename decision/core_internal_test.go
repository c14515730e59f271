package decision

import (
	"testing"

	"github.com/poplimit/poplimit/pipeline"
	"github.com/poplimit/poplimit/window"
)

// Events carry the rule's algorithm as pipeline.Algorithm(window.Algorithm):
// the two enumerations (pipeline does not import window) must agree.
func TestEventAlgorithmsMirrorWindow(t *testing.T) {
	for a := window.SlidingWindowCounter; a <= window.SlidingLogAlgorithm; a++ {
		if got := pipeline.Algorithm(a).String(); got != a.String() {
			t.Errorf("pipeline.Algorithm(%d) = %q, window's is %q", a, got, a.String())
		}
	}
}
