package clientaddr

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"net/textproto"
	"strings"
	"unsafe"
)

// Forwarding names the header whose hops trusted proxies append to.
type Forwarding string

const (
	// XForwardedFor is the de facto X-Forwarded-For list (the default).
	XForwardedFor Forwarding = "x-forwarded-for"
	// Forwarded is RFC 7239's Forwarded header; each element's for= names
	// a hop, and an obfuscated or "unknown" node stops the walk.
	Forwarded Forwarding = "forwarded"
)

// HeaderName is the canonical name of the header f reads.
func (f Forwarding) HeaderName() string {
	if f == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// maxHops is how many hops a request's forwarding headers keep, the
// rightmost ones; a longer chain is walked over those only, so a client
// that sends thousands of hops costs a fixed amount of memory and time.
const maxHops = 64

// Hops collects the hops of a request's forwarding header lines, in the
// order the lines arrived, keeping the rightmost maxHops. RFC 9110 §5.3
// makes several lines of a list header one list joined by commas, so every
// line counts: reading only the first would let a client put its own line
// before the proxy's and choose its key. A hop is a slice of the header's
// own bytes (no copy); an empty hop is malformed. The zero value is ready;
// Reset makes it ready again. It is not safe for concurrent use.
type Hops struct {
	hops [maxHops][]byte
	n    int // hops seen, which may exceed maxHops
}

// Reset forgets every hop.
func (h *Hops) Reset() {
	clear(h.hops[:min(h.n, maxHops)])
	h.n = 0
}

func (h *Hops) add(v []byte) {
	h.hops[h.n%maxHops] = v
	h.n++
}

// AddLine adds the hops of one line of the forwarding header f.
func (h *Hops) AddLine(f Forwarding, line []byte) {
	if f == Forwarded {
		h.addForwarded(line)
		return
	}
	for {
		i := bytes.IndexByte(line, ',')
		if i < 0 {
			h.add(bytes.TrimSpace(line))
			return
		}
		h.add(bytes.TrimSpace(line[:i]))
		line = line[i+1:]
	}
}

// addForwarded adds the for= node of each element of an RFC 7239 line,
// parsed with RFC 9110's list, token and quoted-string rules:
//
//	element = [ pair ] *( ";" [ pair ] ),  pair = token "=" ( token / quoted-string )
//
// Elements are separated by commas outside quoted strings. A trusted
// proxy may join its element to the client's line (RFC 9110 §5.3), so the
// client writes everything left of the proxy's ", for=…". A well-formed
// element never reaches past that comma: a quoted string the client opens
// either stays open to the end of the line or closes on a quote of the
// proxy's element, whose next byte (an address, never ";" or ",") breaks
// the element. So an element that does not parse ends at the first comma
// after its start and is one malformed hop: a client's garbage spoils its
// own part of the line only, and the proxy's element is always read as
// the proxy wrote it.
func (h *Hops) addForwarded(line []byte) {
	for {
		node, end, ok := forwardedElement(line)
		if !ok {
			node, end = nil, bytes.IndexByte(line, ',')
			if end < 0 {
				end = len(line)
			}
		}
		h.add(node)
		if end >= len(line) {
			return
		}
		line = line[end+1:]
	}
}

// forwardedElement parses the element at the start of line up to the comma
// that ends it (or the line's end), returning its for= node without
// quotes (nil when it has none), the index of that comma (len(line) at the
// end), and whether the element is well-formed. A node written with an
// escape, or a pair named twice, is malformed: no address needs one.
func forwardedElement(line []byte) (node []byte, end int, ok bool) {
	i, seenFor := skipOWS(line, 0), false
	for {
		if i == len(line) || line[i] == ',' {
			return node, i, true
		}
		if line[i] == ';' { // an empty pair
			i = skipOWS(line, i+1)
			continue
		}
		j := i
		for j < len(line) && isTchar(line[j]) {
			j++
		}
		if j == i || j == len(line) || line[j] != '=' {
			return nil, 0, false
		}
		name := line[i:j]
		j++
		var value []byte
		if j < len(line) && line[j] == '"' {
			k, escaped := j+1, false
			for ; k < len(line) && line[k] != '"'; k++ {
				switch c := line[k]; {
				case c == '\\':
					k++
					escaped = true
				case c < 0x20 && c != '\t' || c == 0x7f:
					return nil, 0, false
				}
			}
			if k >= len(line) {
				return nil, 0, false // the quoted string never closes
			}
			value, j = line[j+1:k], k+1
			if escaped {
				value = nil
			}
		} else {
			k := j
			for k < len(line) && isNodeChar(line[k]) {
				k++
			}
			value, j = line[j:k], k
		}
		if bytes.EqualFold(name, []byte("for")) {
			if seenFor {
				return nil, 0, false
			}
			seenFor, node = true, value
		}
		i = skipOWS(line, j)
		switch {
		case i == len(line) || line[i] == ',':
		case line[i] == ';':
			i = skipOWS(line, i+1)
		default:
			return nil, 0, false
		}
	}
}

func skipOWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	return i
}

// isTchar reports whether c is an RFC 9110 token character.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isNodeChar reports whether c may stand in an unquoted value: a token
// character, or ":", "[" and "]", which RFC 7239 wants quoted but common
// proxy configurations write bare (for=2001:db8::1). None of them can end a
// pair, an element or a quoted string.
func isNodeChar(c byte) bool { return isTchar(c) || c == ':' || c == '[' || c == ']' }

// Resolver resolves a request's client address from its TCP peer and what
// trusted proxies say: when the peer is trusted, the client-IP header's
// last line (a proxy sets or appends it last) if it parses, else the walk
// of the forwarding header's hops from the right through trusted
// addresses: the first untrusted hop is the client; a malformed hop (an
// obfuscated or unknown node, a garbled address) stops the walk at the
// last trusted address, which is then the key; so does a chain of trusted
// hops only. No header content can choose a key for a request whose peer
// is untrusted, nor a key left of the rightmost untrusted hop. IPv4-mapped
// IPv6 addresses are unmapped and zones dropped, so one client is one key
// in every form. A Resolver is immutable and safe for concurrent use; its
// methods do not allocate.
type Resolver struct {
	trusted    []netip.Prefix
	forwarding Forwarding
	fwdName    []byte // the forwarding header's name
	ipHeader   []byte // the client-IP header's name; empty: none
	// The same in net/http's canonical form.
	fwdCanon, ipCanon string
}

// New returns the Resolver that believes the networks trusted, reading
// the forwarding header f (default XForwardedFor) and, when ipHeader is
// not empty (e.g. "CF-Connecting-IP"), that header before it.
func New(trusted []netip.Prefix, f Forwarding, ipHeader string) *Resolver {
	if f == "" {
		f = XForwardedFor
	}
	r := &Resolver{trusted: trusted, forwarding: f, fwdName: []byte(f.HeaderName()), ipHeader: []byte(ipHeader),
		fwdCanon: textproto.CanonicalMIMEHeaderKey(f.HeaderName())}
	if ipHeader != "" {
		r.ipCanon = textproto.CanonicalMIMEHeaderKey(ipHeader)
	}
	return r
}

// HeaderClass says which of the headers a Resolver reads a header name is.
type HeaderClass uint8

const (
	Other          HeaderClass = iota // not read
	ForwardingLine                    // a line of the forwarding header: Hops.AddLine
	ClientIPLine                      // a line of the client-IP header: its last line counts
)

// Classify says which header name is, compared without case.
func (r *Resolver) Classify(name []byte) HeaderClass {
	switch {
	case bytes.EqualFold(name, r.fwdName):
		return ForwardingLine
	case len(r.ipHeader) > 0 && bytes.EqualFold(name, r.ipHeader):
		return ClientIPLine
	}
	return Other
}

// Forwarding is the forwarding header the Resolver reads.
func (r *Resolver) Forwarding() Forwarding { return r.forwarding }

// Trusted reports whether a is a trusted proxy's address.
func (r *Resolver) Trusted(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Resolve returns the client address of a request from peer whose
// client-IP header's last line is ipHeader (nil when absent) and whose
// forwarding hops are in h.
func (r *Resolver) Resolve(peer netip.Addr, ipHeader []byte, h *Hops) netip.Addr {
	if !r.Trusted(peer) {
		return peer
	}
	if len(ipHeader) > 0 {
		if a, ok := parseIP(bytes.TrimSpace(ipHeader)); ok {
			return a
		}
	}
	last := max(0, h.n-maxHops)
	for i := h.n - 1; i >= last; i-- {
		a, ok := parseIP(h.hops[i%maxHops])
		if !ok {
			return peer
		}
		if !r.Trusted(a) {
			return a
		}
		peer = a
	}
	return peer
}

// FromHeader resolves the client address of a request from peer whose
// header section is hdr (a net/http Header: canonical names, every line
// of a field in order). h is scratch space.
func (r *Resolver) FromHeader(peer netip.Addr, hdr map[string][]string, h *Hops) netip.Addr {
	peer = peer.Unmap().WithZone("")
	if !r.Trusted(peer) {
		return peer
	}
	h.Reset()
	for _, v := range hdr[r.fwdCanon] {
		h.AddLine(r.forwarding, unsafe.Slice(unsafe.StringData(v), len(v)))
	}
	var ip []byte
	if r.ipCanon != "" {
		if vs := hdr[r.ipCanon]; len(vs) > 0 {
			v := vs[len(vs)-1]
			ip = unsafe.Slice(unsafe.StringData(v), len(v))
		}
	}
	return r.Resolve(peer, ip, h)
}

// parseIP parses an address from bytes: a bare address, an IPv4 address
// with a port, or an IPv6 address in brackets with or without a port. It
// picks the form by shape first, so no valid form costs a failed parse
// (whose error allocates).
func parseIP(b []byte) (netip.Addr, bool) {
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	s := unsafe.String(&b[0], len(b)) // ParseAddr does not keep s
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 < len(s) && (s[end+1] != ':' || !isPort(s[end+2:])) {
			return netip.Addr{}, false
		}
		s = s[1:end]
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		if !isPort(s[i+1:]) {
			return netip.Addr{}, false
		}
		s = s[:i] // IPv4 with a port: one colon only
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func isPort(s string) bool {
	if len(s) == 0 || len(s) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n <= 65535
}

// ParsePrefixes parses a comma-separated list of CIDRs or bare addresses.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				errs = append(errs, fmt.Errorf("clientaddr: trusted proxy %q: %w", f, err))
				continue
			}
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("clientaddr: trusted proxy %q: %w", f, err))
			continue
		}
		out = append(out, p.Masked())
	}
	return out, errors.Join(errs...)
}
