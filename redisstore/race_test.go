//go:build race

package redisstore

// The race detector makes sync.Pool drop objects at random, so allocation
// counts mean nothing under it.
func init() { raceEnabled = true }
