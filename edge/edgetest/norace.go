//go:build !race

package edgetest

// Race reports whether the race detector is on: it makes sync.Pool drop
// items at random, so allocation counts are checked without it.
const Race = false
