// Package wide is unsigned 128-bit integer arithmetic for the exact window
// arithmetic of the sliding window (package algo) and of the limiter's
// recorded window shapes (package window): counts up to 2^32 times windows
// up to 2^55 ns do not fit in 64 bits.
package wide

import (
	"math"
	"math/bits"
)

// U128 is an unsigned 128-bit integer.
type U128 struct{ Hi, Lo uint64 }

// Mul returns a × b.
func Mul(a, b uint64) U128 { hi, lo := bits.Mul64(a, b); return U128{hi, lo} }

// Add returns a + b.
func Add(a, b U128) U128 {
	lo, c := bits.Add64(a.Lo, b.Lo, 0)
	return U128{a.Hi + b.Hi + c, lo}
}

// LE reports a ≤ b.
func LE(a, b U128) bool { return a.Hi < b.Hi || a.Hi == b.Hi && a.Lo <= b.Lo }

// Div returns ⌊a/d⌋ saturated to 64 bits.
func Div(a U128, d uint64) uint64 {
	if a.Hi >= d {
		return math.MaxUint64
	}
	q, _ := bits.Div64(a.Hi, a.Lo, d)
	return q
}

// MulX returns a × b, which must fit in 128 bits.
func MulX(a U128, b uint64) U128 {
	hi, lo := bits.Mul64(a.Lo, b)
	return U128{a.Hi*b + hi, lo}
}

// Float returns x as a float64.
func Float(x U128) float64 { return float64(x.Hi)*(1<<64) + float64(x.Lo) }
