package decision

import (
	"encoding/binary"
	"net/netip"

	"github.com/poplimit/poplimit/rules"
)

// KeyAddr is the part of ip that a rule keys on: the address itself for
// IPv4, its network of the rule's IPv6Prefix bits for IPv6 (a subscriber
// holds a whole /64 and can rotate addresses inside it).
//
// An IPv6 address that stands for an IPv4 client is no subscriber's: a
// translator (NAT64, SIIT) writes every IPv4 client it serves inside one
// prefix, so a /64 of them would pool them all under one counter. Such an
// address keys as its client:
//
//   - 64:ff9b::/96, the well-known prefix of RFC 6052 (NAT64, SIIT-DC),
//     ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765) and ::a.b.c.d
//     (IPv4-compatible, RFC 4291) key as the IPv4 address a.b.c.d, as
//     the same client does over IPv4; ::a.b.c.d only outside 0.0.0.0/8,
//     so that :: and ::1 stay IPv6;
//   - 64:ff9b:1::/48, the local-use prefix of RFC 8215, keys as the whole
//     address: the operator chooses the prefix length inside it (RFC 6052
//     allows /48 to /96), and so where the IPv4 address sits, but every
//     client has an address of its own.
//
// IPv4-mapped addresses (::ffff:a.b.c.d) are unmapped before any rule
// sees them, and key as IPv4 here too. It does not allocate.
func KeyAddr(r *rules.Rule, ip netip.Addr) netip.Addr {
	if !ip.Is6() {
		return ip
	}
	b := ip.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	switch {
	case hi == 0x0064_ff9b_0000_0000 && lo>>32 == 0, // 64:ff9b::/96
		hi == 0 && lo>>32 == 0xffff_0000,     // ::ffff:0:0:0/96, translated
		hi == 0 && lo>>32 == 0xffff,          // ::ffff:0:0/96, mapped, should a front end not unmap
		hi == 0 && lo>>32 == 0 && b[12] != 0: // ::/96 but 0.0.0.0/8
		return netip.AddrFrom4([4]byte(b[12:]))
	case hi>>16 == 0x0064_ff9b_0001: // 64:ff9b:1::/48
		return ip.WithZone("")
	}
	if r.IPv6Prefix > 0 && r.IPv6Prefix < 128 {
		if p, err := ip.Prefix(r.IPv6Prefix); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// FallbackKeyTag starts a key built from the client IP because the rule's
// own key was missing. No key built from the request itself starts with a
// NUL byte (see AppendKeyStatus), so a fallback key never equals one.
const FallbackKeyTag = "\x00ip\x00"

// AppendFallbackKey appends the key of a request whose rule's key is
// missing and whose rule falls back to the client IP (or, for IPv6, its
// network of the rule's IPv6Prefix).
func AppendFallbackKey(dst []byte, r *rules.Rule, ip netip.Addr) []byte {
	return KeyAddr(r, ip).AppendTo(append(dst, FallbackKeyTag...))
}

// KeyStatus says whether AppendKeyStatus built a key.
type KeyStatus uint8

const (
	KeyBuilt     KeyStatus = iota
	KeyMissing             // a part of the recipe is absent or empty
	KeyDuplicate           // a part appears more than once and the rule's duplicate_key is refuse
)

// AppendKeyStatus appends the key of a request with fields f (nil: none)
// from client ip under rule r to dst, and says whether it built one. A
// part that appears more than once (see Fields) is its first or its last
// value as the rule's DuplicateKey says, or, under DuplicateKeyRefuse,
// makes the status KeyDuplicate: a duplicated part outranks a missing one,
// so a request cannot trade a refusal for the missing-key fallback. dst
// holds no complete key unless the status is KeyBuilt. It does not
// allocate once dst has room.
//
// The encoding is injective, because a query value is percent-decoded and
// may hold any byte: a key of one part is the value itself (so overrides
// name API keys as they are), with a 0x01 put before a value that starts
// with 0x00 or 0x01, so that no key starts with the NUL of FallbackKeyTag;
// a key of several parts is each part preceded by its length (uvarint), so
// no two splits of the same bytes meet.
func AppendKeyStatus(dst []byte, f Fields, r *rules.Rule, ip netip.Addr) (_ []byte, _ KeyStatus) {
	single := len(r.Key) == 1
	missing := false
	for _, p := range r.Key {
		var v, last []byte
		n := 0
		switch p.Source {
		case rules.KeyIP:
			if single {
				return KeyAddr(r, ip).AppendTo(dst), KeyBuilt
			}
			var a [64]byte
			v, n = KeyAddr(r, ip).AppendTo(a[:0]), 1
		case rules.KeyHeader:
			if f != nil {
				v, last, n = f.Header(p.Name)
			}
		case rules.KeyQuery:
			if f != nil {
				v, last, n = f.Query(p.Name)
			}
		case rules.KeyCookie:
			if f != nil {
				v, last, n = f.Cookie(p.Name)
			}
		}
		if n > 1 {
			switch r.DuplicateKey {
			case rules.DuplicateKeyFirst:
			case rules.DuplicateKeyLast:
				v = last
			default:
				return dst, KeyDuplicate
			}
		}
		if len(v) == 0 || missing {
			missing = true // look on for a duplicated part
			continue
		}
		if single {
			if v[0] <= 0x01 {
				dst = append(dst, 0x01)
			}
			return append(dst, v...), KeyBuilt
		}
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	if missing {
		return dst, KeyMissing
	}
	return dst, KeyBuilt
}
