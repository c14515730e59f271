package shardproxy

import (
	"crypto/md5"
	"fmt"
)

// Hash names a key hash of nutcracker's (the pool's `hash:` setting). The
// value is spelled exactly as in a nutcracker YAML config.
type Hash string

// The key hashes this package reproduces bit for bit. Each is checked against
// a real nutcracker in the tests.
const (
	// HashFNV1a64 is nutcracker's fnv1a_64, the hash of its README's example
	// pool and the default here. Despite the name it is a 32-bit FNV-1a with
	// the 64-bit constants truncated to 32 bits (offset 0x84222325, prime
	// 0x1b3), and each byte is sign-extended as a C char on x86-64 before the
	// xor. Fast (about 1 ns a byte) and good enough for our keys: the tag it
	// hashes is 16 hex digits of a uniform 64-bit hash.
	HashFNV1a64 Hash = "fnv1a_64"

	// HashMD5 is nutcracker's md5: the first four bytes of the MD5 digest,
	// little-endian. Best mixing, slowest (one MD5 block per lookup).
	HashMD5 Hash = "md5"

	// HashMurmur is nutcracker's murmur: MurmurHash2, 32-bit, seeded with
	// 0xdeadbeef times the key length, reading 4-byte words little-endian.
	HashMurmur Hash = "murmur"
)

// valid reports whether h is one of the hashes this package implements.
func (h Hash) valid() bool {
	switch h {
	case HashFNV1a64, HashMD5, HashMurmur:
		return true
	}
	return false
}

// sum returns nutcracker's 32-bit hash of key under h. It does not allocate.
func (h Hash) sum(key []byte) uint32 {
	switch h {
	case HashMD5:
		return hashMD5(key)
	case HashMurmur:
		return hashMurmur(key)
	default:
		return hashFNV1a64(key)
	}
}

func (h Hash) String() string { return string(h) }

// errHash is returned for a Hash this package does not implement.
func errHash(h Hash) error {
	return fmt.Errorf("hash %q is not one of %q, %q, %q", string(h), HashFNV1a64, HashMD5, HashMurmur)
}

// hashFNV1a64 is nutcracker's hash_fnv1a_64 (src/hashkit/nc_fnv.c):
//
//	uint32_t hash = (uint32_t) FNV_64_INIT;
//	for (x = 0; x < key_length; x++) {
//	    uint32_t val = (uint32_t)key[x];   // key is const char *: signed on x86-64
//	    hash ^= val;
//	    hash *= (uint32_t) FNV_64_PRIME;
//	}
func hashFNV1a64(key []byte) uint32 {
	const (
		offset = uint32(0xcbf29ce484222325 & 0xffffffff) // 0x84222325
		prime  = uint32(0x100000001b3 & 0xffffffff)      // 0x000001b3
	)
	h := offset
	for _, b := range key {
		h ^= uint32(int32(int8(b))) // sign extension of a signed char
		h *= prime
	}
	return h
}

// hashMD5 is nutcracker's hash_md5 (src/hashkit/nc_md5.c): the digest's first
// four bytes read little-endian.
func hashMD5(key []byte) uint32 {
	d := md5.Sum(key)
	return uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24
}

// hashMurmur is nutcracker's hash_murmur (src/hashkit/nc_murmur.c),
// MurmurHash2 seeded with 0xdeadbeef*len, on a little-endian machine.
func hashMurmur(key []byte) uint32 {
	const (
		m = uint32(0x5bd1e995)
		r = 24
	)
	n := uint32(len(key))
	h := (0xdeadbeef * n) ^ n
	for len(key) >= 4 {
		k := uint32(key[0]) | uint32(key[1])<<8 | uint32(key[2])<<16 | uint32(key[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		key = key[4:]
	}
	switch len(key) {
	case 3:
		h ^= uint32(key[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(key[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(key[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// ketamaPoints returns the four continuum points nutcracker derives from one
// point name (ketama_hash with alignment 0..3 in src/hashkit/nc_ketama.c):
// the MD5 digest cut into four little-endian words.
func ketamaPoints(name []byte) [4]uint32 {
	d := md5.Sum(name)
	var p [4]uint32
	for i := range p {
		p[i] = uint32(d[4*i]) | uint32(d[4*i+1])<<8 | uint32(d[4*i+2])<<16 | uint32(d[4*i+3])<<24
	}
	return p
}
