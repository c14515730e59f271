// Package algo holds the five rate-limiting algorithms as pure code, time
// a parameter (Unix nanoseconds) and state a value the caller keeps: the
// sliding-window counter (SlidingWindow, from the counts of the previous
// and current fixed window), the fixed window (FixedWindow), the leaky
// bucket as a meter, GCRA (LeakyBucket), which also runs token-bucket
// rules (TokenBucket states one; a token bucket of burst B admits exactly
// what the meter of capacity B admits), and the exact sliding log
// (SlidingLog). Each decides, and says when a refused request would be
// admitted (its Release), exactly to the nanosecond.
//
// The states of the bucket and the log also have encodings (AppendGCRA,
// DecodeGCRA, AppendLog, DecodeLog), the values a store that keeps bytes
// holds; package store applies its operations through them.
//
// It reads no clock, keeps no shared state, imports no store, no limiter
// and no metrics: package store shares the states among processes,
// package window runs the algorithms across the edges of a PoP. Every
// type here is an immutable value or a state owned by one caller.
package algo
