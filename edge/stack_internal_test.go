package edge

import "testing"

func TestFirstTick(t *testing.T) {
	for _, tt := range []struct{ t, every, phase, want int64 }{
		{0, 5, 0, 0}, {1, 5, 0, 5}, {5, 5, 0, 5}, {6, 5, 2, 7}, {7, 5, 2, 7}, {8, 5, 2, 12},
		{-3, 5, 0, 0}, {1_000_000_003, 1_000, 250, 1_000_000_250},
	} {
		if got := firstTick(tt.t, tt.every, tt.phase); got != tt.want {
			t.Errorf("firstTick(%d, every %d, phase %d) = %d, want %d", tt.t, tt.every, tt.phase, got, tt.want)
		}
	}
}
