package global

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// MACSize is the size of a signed message's MAC: HMAC-SHA256 (RFC 2104,
// FIPS 180-4).
const MACSize = sha256.Size

// MinKeyLen is the shortest secret a key file may hold: as many bytes as
// the MAC (RFC 2104 §3 advises a key no shorter than the hash's output).
const MinKeyLen = 32

// maxKeyFile bounds what LoadKey reads.
const maxKeyFile = 4096

// macLabel separates this MAC from any other made with the same secret
// (the decision events' too).
const macLabel = "poplimit global counts v1\x00"

// LoadKey reads the shared secret of the topic of the counts from path:
// the whole file less one trailing newline (LF or CRLF), at least
// MinKeyLen bytes, at most 4 KiB. The error names the flag.
func LoadKey(flag, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", flag, path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", flag, path, err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%s %q: more than %d bytes: not a key file", flag, path, maxKeyFile)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) < MinKeyLen {
		return nil, fmt.Errorf("%s %q: %d bytes of secret, want at least %d (e.g. head -c 32 /dev/urandom > file)", flag, path, len(b), MinKeyLen)
	}
	return b, nil
}

// mac computes messages' MACs under one key for one topic. Not safe for
// concurrent use: each goroutine has its own.
type mac struct {
	h   hash.Hash
	sum [MACSize]byte
	n   [1]byte
	pre []byte // macLabel, then the topic's length and name
}

func newMAC(key []byte, topic string) *mac {
	if len(key) == 0 {
		return nil
	}
	pre := append([]byte(macLabel), byte(min(len(topic), 255)))
	return &mac{h: hmac.New(sha256.New, key), pre: append(pre, topic[:min(len(topic), 255)]...)}
}

// compute returns the MAC of a message of kafkaKey and body (its value
// without the MAC), valid until the next call.
func (m *mac) compute(kafkaKey, body []byte) []byte {
	m.h.Reset()
	m.h.Write(m.pre)
	m.n[0] = byte(len(kafkaKey))
	m.h.Write(m.n[:])
	m.h.Write(kafkaKey)
	m.h.Write(body)
	return m.h.Sum(m.sum[:0])
}

var errKafkaKey = errors.New("global: a Kafka key longer than 255 bytes")

// sign marks value signed and appends its MAC.
func (m *mac) sign(kafkaKey, value []byte) ([]byte, error) {
	if len(kafkaKey) > 255 || len(value) == 0 {
		return nil, errKafkaKey
	}
	value[0] |= signedBit
	return append(value, m.compute(kafkaKey, value)...), nil
}

// verify reports whether value, a signed message, carries its MAC.
func (m *mac) verify(kafkaKey, value []byte) bool {
	if len(kafkaKey) > 255 || len(value) < 1+MACSize || value[0]&signedBit == 0 {
		return false
	}
	body := value[:len(value)-MACSize]
	return hmac.Equal(m.compute(kafkaKey, body), value[len(body):])
}

// Sign signs value, a message of the topic of the counts (AppendCounts,
// AppendHeartbeat, AppendFarewell) with key kafkaKey, with the shared
// secret key for topic, as the publisher does (FORMAT.md): it returns
// value marked signed with its MAC appended.
func Sign(key []byte, topic string, kafkaKey, value []byte) ([]byte, error) {
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("global: a key of %d bytes, want at least %d", len(key), MinKeyLen)
	}
	return newMAC(key, topic).sign(kafkaKey, value)
}
