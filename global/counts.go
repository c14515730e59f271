package global

import (
	"encoding/binary"
	"errors"
	"math"
)

// Message kinds: a message's first byte.
const (
	kindCounts    = 1 // one key's counts per PoP
	kindHeartbeat = 2 // the publisher is alive: its clock, Unix ns
)

// MaxPops is the most PoPs one message carries; a key counted in more
// carries the MaxPops largest.
const MaxPops = 64

// MaxPopLen is the longest PoP name, in bytes (pipeline.MaxPopLen).
const MaxPopLen = 32

// ErrMalformed reports a message that does not decode.
var ErrMalformed = errors.New("global: malformed message")

// Slots is how many parts of its window a key's units are counted in:
// the counts carry their window's shape, so that an edge can tell which
// of the others' units are still in its trailing window.
const Slots = 16

// PopCount is what one PoP counted for a key: its units in each sixteenth
// of the key's previous window (Units[:Slots]) and of its current one.
type PopCount struct {
	Pop   string
	Units [2 * Slots]uint64
}

// total is p's units in both windows.
func (p *PopCount) total() (n uint64) {
	for _, u := range p.Units {
		n += u
	}
	return n
}

// Counts is one key's counts per PoP, as of the window starting at Start
// (Unix ms) of WindowMs milliseconds.
type Counts struct {
	Key      uint64
	Start    int64
	WindowMs uint32
	Pops     []PopCount
}

// AppendCounts appends the encoding of c (FORMAT.md) to dst.
func AppendCounts(dst []byte, c *Counts) []byte {
	dst = append(dst, kindCounts)
	dst = binary.BigEndian.AppendUint64(dst, c.Key)
	dst = binary.BigEndian.AppendUint64(dst, uint64(c.Start))
	dst = binary.BigEndian.AppendUint32(dst, c.WindowMs)
	n := min(len(c.Pops), MaxPops)
	dst = append(dst, byte(n))
	for _, p := range c.Pops[:n] {
		name := p.Pop[:min(len(p.Pop), MaxPopLen)]
		dst = append(dst, byte(len(name)))
		dst = append(dst, name...)
		for _, u := range p.Units {
			dst = binary.AppendUvarint(dst, u)
		}
	}
	return dst
}

// AppendHeartbeat appends a heartbeat sent at now (Unix ns).
func AppendHeartbeat(dst []byte, now int64) []byte {
	dst = append(dst, kindHeartbeat)
	return binary.BigEndian.AppendUint64(dst, uint64(now))
}

// decoded is a message as Decode reads it: counts, or a heartbeat.
type decoded struct {
	heartbeat bool
	at        int64 // a heartbeat's time, Unix ns
	c         Counts
}

// decode reads one message into m, whose Pops it reuses; PoP names are
// copied (m outlives b).
func decode(b []byte, m *decoded) error {
	if len(b) == 0 {
		return ErrMalformed
	}
	switch b[0] {
	case kindHeartbeat:
		if len(b) != 9 {
			return ErrMalformed
		}
		m.heartbeat, m.at = true, int64(binary.BigEndian.Uint64(b[1:]))
		return nil
	case kindCounts:
	default:
		return ErrMalformed
	}
	if len(b) < 22 {
		return ErrMalformed
	}
	m.heartbeat = false
	c := &m.c
	c.Key = binary.BigEndian.Uint64(b[1:])
	c.Start = int64(binary.BigEndian.Uint64(b[9:]))
	c.WindowMs = binary.BigEndian.Uint32(b[17:])
	n := int(b[21])
	if n > MaxPops || c.WindowMs == 0 {
		return ErrMalformed
	}
	off := 22
	c.Pops = c.Pops[:0]
	for range n {
		if off >= len(b) {
			return ErrMalformed
		}
		l := int(b[off])
		off++
		if l > MaxPopLen || len(b)-off < l {
			return ErrMalformed
		}
		p := PopCount{Pop: string(b[off : off+l])}
		off += l
		for i := range p.Units {
			var k int
			if p.Units[i], k = binary.Uvarint(b[off:]); k <= 0 {
				return ErrMalformed
			}
			off += k
		}
		c.Pops = append(c.Pops, p)
	}
	if off != len(b) || c.Start > math.MaxInt64/int64(1e6) || c.Start < math.MinInt64/int64(1e6) {
		return ErrMalformed
	}
	return nil
}
