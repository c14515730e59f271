//go:build !race

package httpedge_test

const raceOn = false
