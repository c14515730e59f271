package pipeline

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"hash"
	"os"
	"strings"
)

// FrameMACLen is the length of a signed frame's MAC: a full HMAC-SHA256
// (RFC 2104, FIPS 180-4), untruncated.
const FrameMACLen = sha256.Size

// MinKeyLen is the shortest events key, in bytes: the length of
// SHA-256's output, as RFC 2104 section 3 advises for an HMAC key.
const MinKeyLen = 32

// macContext starts the input of every frame MAC, so that a MAC made with
// the events key for anything else (another message kind, should an
// operator reuse the key) never matches a frame's.
const macContext = "poplimit decision frame\x00"

// FrameKey signs frames and checks their MACs with one events key. A frame
// of FrameVersionSigned ends with an HMAC-SHA256 of the context string,
// the partition the frame is written to (4 bytes, big-endian) and every
// byte of the frame before the MAC: the header (format, edge, sequence
// number, count) and the events. Binding the partition makes a frame
// copied to another partition, where the consumer's duplicate check keys
// it apart from the original, fail. A FrameKey is not safe for concurrent
// use; it allocates nothing once built.
type FrameKey struct {
	h   hash.Hash
	sum [FrameMACLen]byte
	pre [len(macContext) + 4]byte
}

// NewFrameKey returns a FrameKey of key, which must be at least MinKeyLen
// bytes long. The key is copied.
func NewFrameKey(key []byte) (*FrameKey, error) {
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("%w: events key of %d bytes: at least %d required", ErrConfig, len(key), MinKeyLen)
	}
	k := &FrameKey{h: hmac.New(sha256.New, append([]byte(nil), key...))}
	copy(k.pre[:], macContext)
	return k, nil
}

// mac computes the MAC of frame, written to partition, into k.sum.
func (k *FrameKey) mac(frame []byte, partition int) []byte {
	k.h.Reset()
	binary.BigEndian.PutUint32(k.pre[len(macContext):], uint32(partition))
	k.h.Write(k.pre[:])
	k.h.Write(frame)
	return k.h.Sum(k.sum[:0])
}

// Sign appends to frame, a frame of FrameVersionSigned without its MAC,
// the MAC that binds it to partition, and returns the extended slice.
func (k *FrameKey) Sign(frame []byte, partition int) []byte {
	return append(frame, k.mac(frame, partition)...)
}

// Verify reports whether msg is a frame of FrameVersionSigned whose MAC
// is the one k makes for it on partition. It compares in constant time.
func (k *FrameKey) Verify(msg []byte, partition int) bool {
	if len(msg) < FrameHeaderLen+FrameMACLen || msg[0] != signedFrameByte {
		return false
	}
	body := len(msg) - FrameMACLen
	return subtle.ConstantTimeCompare(k.mac(msg[:body], partition), msg[body:]) == 1
}

// ReadKeyFile reads an events key from file: its content, leading and
// trailing white space removed (so that a key written by `openssl rand
// -hex 32 > file` or `head -c 48 /dev/urandom | base64 > file` is its
// text), at least MinKeyLen bytes. The errors name the file and the
// reason.
func ReadKeyFile(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	key := []byte(strings.TrimSpace(string(b)))
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("key file %s: %d bytes: at least %d required (e.g. openssl rand -hex 32 > %s)",
			file, len(key), MinKeyLen, file)
	}
	return key, nil
}
