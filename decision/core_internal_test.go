package decision

import (
	"testing"

	"github.com/poplimit/poplimit/policy"
)

// Events carry the rule's algorithm as policy.Algorithm(policy.Algorithm):
// the two enumerations (pipeline does not import window) must agree.
func TestEventAlgorithmsMirrorWindow(t *testing.T) {
	for a := policy.SlidingWindow; a <= policy.SlidingLog; a++ {
		if got := policy.Algorithm(a).String(); got != a.String() {
			t.Errorf("policy.Algorithm(%d) = %q, window's is %q", a, got, a.String())
		}
	}
}
