// Package mix holds the 64-bit mixing function that the packages which may
// not import each other (rules, window, pipeline) share.
package mix

// Mix64 is the splitmix64 finalizer: a bijection of 64-bit values that
// spreads every input bit through every output bit, so that a seed mixed
// into a key hash, or a hash compared against a sampling threshold, behaves
// as a uniform value.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
