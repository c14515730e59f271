//go:build race

package httpedge_test

// raceOn: the race detector is on (it slows and grows what it watches).
const raceOn = true
