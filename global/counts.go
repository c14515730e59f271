package global

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// Message kinds: a message's first byte, with signedBit set when a MAC
// ends the message.
const (
	kindCounts    = 1    // one key's counts per PoP
	kindHeartbeat = 2    // the publisher is alive: its interval
	kindFarewell  = 3    // the publisher stopped cleanly
	signedBit     = 0x80 // the last MACSize bytes are the message's MAC
)

// MaxPops is the most PoPs one message carries; a key counted in more
// carries the MaxPops largest.
const MaxPops = 64

// MaxPopLen is the longest PoP name, in bytes (event.MaxPopLen).
const MaxPopLen = 32

// MaxPublisherLen is the longest publisher name, in bytes.
const MaxPublisherLen = 64

// ErrMalformed reports a message that does not decode.
var ErrMalformed = errors.New("global: malformed message")

// Slots is how many parts of its window a key's units are counted in:
// the counts carry their window's shape, so that an edge can tell which
// of the others' units are still in its trailing window.
const Slots = 16

// Header is what every message carries ahead of its kind's body: who
// published it and when. An edge tells publishers apart by Publisher;
// Instance changes at each start of the publisher (a restart replaces the
// previous instance); Stamp is the publisher's clock when it published,
// Unix ns, never lower than in its previous message.
type Header struct {
	Publisher string
	Instance  uint64
	Stamp     int64
}

func appendHeader(dst []byte, kind byte, h *Header) []byte {
	name := h.Publisher[:min(len(h.Publisher), MaxPublisherLen)]
	dst = append(dst, kind, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint64(dst, h.Instance)
	return binary.BigEndian.AppendUint64(dst, uint64(h.Stamp))
}

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

// AppendCounts appends the encoding of c (FORMAT.md), published by h, to
// dst, unsigned (Sign signs it).
func AppendCounts(dst []byte, h *Header, c *Counts) []byte {
	dst = appendHeader(dst, kindCounts, h)
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

// AppendHeartbeat appends a heartbeat of a publisher that publishes every
// interval, unsigned.
func AppendHeartbeat(dst []byte, h *Header, interval time.Duration) []byte {
	dst = appendHeader(dst, kindHeartbeat, h)
	return binary.BigEndian.AppendUint32(dst, uint32(min(max(interval.Milliseconds(), 0), math.MaxUint32)))
}

// AppendFarewell appends the last message of a publisher that stops
// cleanly, unsigned.
func AppendFarewell(dst []byte, h *Header) []byte {
	return appendHeader(dst, kindFarewell, h)
}

// decoded is a message as decode reads it: a header, then counts, a
// heartbeat or a farewell.
type decoded struct {
	kind     byte // kindCounts, kindHeartbeat or kindFarewell
	signed   bool
	h        Header
	interval int64 // a heartbeat's interval, ns
	c        Counts
}

// decode reads one message into m, whose Pops it reuses; names are copied
// (m outlives b). A signed message's MAC (its last MACSize bytes) is not
// part of what it decodes: check it with a Key first.
func decode(b []byte, m *decoded) error {
	if len(b) < 2 {
		return ErrMalformed
	}
	m.kind, m.signed = b[0]&^signedBit, b[0]&signedBit != 0
	if m.signed {
		if len(b) < 2+MACSize {
			return ErrMalformed
		}
		b = b[:len(b)-MACSize]
	}
	n := int(b[1])
	if n == 0 || n > MaxPublisherLen || len(b) < 2+n+16 {
		return ErrMalformed
	}
	if string(b[2:2+n]) != m.h.Publisher {
		m.h.Publisher = string(b[2 : 2+n])
	}
	m.h.Instance = binary.BigEndian.Uint64(b[2+n:])
	m.h.Stamp = int64(binary.BigEndian.Uint64(b[10+n:]))
	b = b[18+n:]
	switch m.kind {
	case kindHeartbeat:
		if len(b) != 4 {
			return ErrMalformed
		}
		m.interval = int64(binary.BigEndian.Uint32(b)) * int64(time.Millisecond)
		return nil
	case kindFarewell:
		if len(b) != 0 {
			return ErrMalformed
		}
		return nil
	case kindCounts:
	default:
		return ErrMalformed
	}
	if len(b) < 21 {
		return ErrMalformed
	}
	c := &m.c
	c.Key = binary.BigEndian.Uint64(b)
	c.Start = int64(binary.BigEndian.Uint64(b[8:]))
	c.WindowMs = binary.BigEndian.Uint32(b[16:])
	np := int(b[20])
	if np > MaxPops || c.WindowMs == 0 {
		return ErrMalformed
	}
	off := 21
	c.Pops = c.Pops[:0]
	for range np {
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
