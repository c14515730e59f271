package shardproxy

import "strconv"

// MaxCounterKeyLen is the longest memcached key AppendCounterKey produces:
// "pl:{" + 16 hex digits + "}:" + the 20 characters of the most negative
// int64. memcached allows 250.
const MaxCounterKeyLen = 4 + 16 + 2 + 20

// ValueKeyLen is the length of every memcached key AppendValueKey
// produces: "pv:{" + 16 hex digits + "}".
const ValueKeyLen = 4 + 16 + 1

// AppendCounterKey appends to dst the memcached key of the counter for the
// window starting at start (Unix milliseconds) of key (a 64-bit hash of the
// rule and the client key), and returns the extended slice:
//
//	pl:{%016x}:%d
//
// The hash tag holds key alone, so every window of one key lands on one shard
// and one multi-get reads the previous and the current window. The result is
// at most MaxCounterKeyLen bytes of [0-9a-f:{}pl-], hence always a legal
// memcached key: client keys are hashed by the caller, never pasted.
// It does not allocate when dst has room.
func AppendCounterKey(dst []byte, key uint64, start int64) []byte {
	dst = appendTagged(dst, "pl:{", key)
	dst = append(dst, ':')
	return strconv.AppendInt(dst, start, 10)
}

// AppendValueKey appends to dst the memcached key of the value of key (the
// same 64-bit hash as AppendCounterKey's), and returns the extended slice:
//
//	pv:{%016x}
//
// Its hash tag is the counters' of key, so the value lives on the shard
// of key's counters; its prefix is not theirs, so the two never collide.
// It does not allocate when dst has room.
func AppendValueKey(dst []byte, key uint64) []byte {
	return appendTagged(dst, "pv:{", key)
}

// appendTagged appends prefix, key as 16 hex digits, and '}'.
func appendTagged(dst []byte, prefix string, key uint64) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, prefix...)
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hex[(key>>uint(shift))&0xf])
	}
	return append(dst, '}')
}
