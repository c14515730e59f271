package shardproxy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// Limits of a ring. They keep every table bounded and every computation
// inside the ranges nutcracker itself handles without overflow.
const (
	// MaxServers is the most servers a ring or a Client accepts.
	MaxServers = 4096
	// MaxWeight is the largest Server.Weight (nutcracker sums weights in
	// a uint32; MaxServers × MaxWeight stays far below that).
	MaxWeight = 65535

	// ketamaPointsPerServer, ketamaPointsPerHash and ketamaMaxHostLen are
	// KETAMA_POINTS_PER_SERVER, the 4 points cut from each MD5 digest, and
	// KETAMA_MAX_HOSTLEN in src/hashkit/nc_ketama.c.
	ketamaPointsPerServer = 160
	ketamaPointsPerHash   = 4
	ketamaMaxHostLen      = 86

	// ketamaDefaultPort is CONF_DEFAULT_KETAMA_PORT: a server on this port
	// with no name is placed by its host alone (libmemcached compatibility).
	ketamaDefaultPort = 11211
)

// Server is one memcached shard, as an entry of nutcracker's `servers:` list
// ("host:port:weight [name]") describes it.
type Server struct {
	// Addr is "host:port", spelled exactly as in nutcracker's servers list:
	// the text, not its resolution, places the server on the ring. Required.
	Addr string

	// Name is the optional name after the weight. When set it alone places
	// the server, so a shard can move to a new address without moving its
	// keys. When empty, nutcracker uses "host:port", or "host" alone when the
	// port is 11211. It must leave room for "-<point index>" in the 86-byte
	// buffer nutcracker formats point names into: about 80 bytes at most.
	Name string

	// Weight is the server's share of the ring relative to the others, from
	// 1 to MaxWeight. Zero means 1.
	Weight int
}

// weight returns s.Weight with zero meaning 1.
func (s Server) weight() int {
	if s.Weight == 0 {
		return 1
	}
	return s.Weight
}

// ketamaName returns the name nutcracker hashes to place s (conf_add_server in
// src/nc_conf.c): the configured name, else "host:port", else "host" when the
// port is 11211. s.Addr must have passed validateServers.
func (s Server) ketamaName() string {
	if s.Name != "" {
		return s.Name
	}
	i := strings.LastIndexByte(s.Addr, ':')
	if port, err := strconv.Atoi(s.Addr[i+1:]); err == nil && port == ketamaDefaultPort {
		return s.Addr[:i]
	}
	return s.Addr
}

// validateServers returns every problem with servers, each naming the field
// (Servers[i].Addr, …) and the bad value.
func validateServers(servers []Server) []error {
	var errs []error
	if len(servers) == 0 {
		errs = append(errs, errors.New("Servers: empty; need at least one memcached address"))
	}
	if len(servers) > MaxServers {
		errs = append(errs, fmt.Errorf("Servers: %d servers, more than MaxServers (%d)", len(servers), MaxServers))
		return errs
	}
	// The longest point name is name + "-" + the largest point index, which
	// is below 40 × the number of servers.
	maxSuffix := 1 + len(strconv.Itoa(ketamaPointsPerServer/ketamaPointsPerHash*max(len(servers), 1)))
	addrs := make(map[string]int, len(servers))
	names := make(map[string]int, len(servers))
	for i, s := range servers {
		if err := checkAddr(s.Addr); err != nil {
			errs = append(errs, fmt.Errorf("Servers[%d].Addr: %q: %w", i, s.Addr, err))
		} else {
			if j, dup := addrs[s.Addr]; dup {
				errs = append(errs, fmt.Errorf("Servers[%d].Addr: %q: same as Servers[%d]", i, s.Addr, j))
			}
			addrs[s.Addr] = i
			name := s.ketamaName()
			if j, dup := names[name]; dup {
				errs = append(errs, fmt.Errorf("Servers[%d]: ketama name %q: same as Servers[%d] (nutcracker rejects servers with the same name)", i, name, j))
			}
			names[name] = i
			if len(name)+maxSuffix >= ketamaMaxHostLen {
				errs = append(errs, fmt.Errorf("Servers[%d]: ketama name %q: %d bytes, too long for nutcracker's %d-byte point names", i, name, len(name), ketamaMaxHostLen))
			}
		}
		if s.Weight < 0 || s.Weight > MaxWeight {
			errs = append(errs, fmt.Errorf("Servers[%d].Weight: %d: want 1 to %d (0 means 1)", i, s.Weight, MaxWeight))
		}
	}
	return errs
}

// checkAddr reports why addr is not a "host:port" nutcracker would accept.
func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	if strings.ContainsAny(host, " \t\r\n") {
		return errors.New("host contains white space")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// Ring is a ketama consistent-hash ring that places keys exactly as
// nutcracker (twemproxy) does with `distribution: ketama`, the given `hash:`
// and `hash_tag:`, for the servers of one pool in the same order.
//
// A Ring is immutable and safe for concurrent use. Ejection does not change a
// ring: WithLive builds another over the live servers, keeping the server
// indexes of the full list, as nutcracker's auto_eject_hosts rebuilds its
// continuum.
//
// Ring implements memcache.ServerSelector from github.com/bradfitz/gomemcache.
type Ring struct {
	servers []Server
	addrs   []net.Addr
	live    []bool
	nlive   int
	hash    Hash
	tag     [2]byte
	hasTag  bool

	// The continuum, sorted by value; index[i] is the server of values[i].
	// Two slices rather than one of pairs keep the binary search on a dense
	// array of uint32.
	values []uint32
	index  []uint16

	// bucket[b] is the first point whose value is at least b << shift
	// (len(values) past the last): a hash's point lies between bucket[b]
	// and bucket[b+1], with about one point a bucket, so a lookup reads
	// two entries and searches a run of a point or two rather than the
	// whole continuum (the flusher places every op it sends).
	bucket []uint32
	shift  uint
}

// NewRing returns a ring over servers with every server live. hash is the
// pool's key hash; hashTag is its hash_tag, two bytes such as "{}", or "" for
// none. It returns every problem with its arguments, joined.
func NewRing(servers []Server, hash Hash, hashTag string) (*Ring, error) {
	var errs []error
	errs = append(errs, validateServers(servers)...)
	if !hash.valid() {
		errs = append(errs, fmt.Errorf("Hash: %w", errHash(hash)))
	}
	if hashTag != "" && len(hashTag) != 2 {
		errs = append(errs, fmt.Errorf("HashTag: %q: want two bytes such as \"{}\", or empty", hashTag))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("shardproxy: ring: %w", errors.Join(errs...))
	}
	r := &Ring{
		servers: slices.Clone(servers),
		addrs:   make([]net.Addr, len(servers)),
		hash:    hash,
	}
	for i := range r.servers {
		r.servers[i].Weight = r.servers[i].weight()
		r.addrs[i] = tcpAddr(r.servers[i].Addr)
	}
	if hashTag != "" {
		r.tag, r.hasTag = [2]byte{hashTag[0], hashTag[1]}, true
	}
	live := make([]bool, len(servers))
	for i := range live {
		live[i] = true
	}
	r.build(live)
	return r, nil
}

// WithLive returns a ring over the same servers in which only the servers
// with live[i] true hold points, as nutcracker rebuilds its continuum when it
// ejects or restores a server. Server indexes are those of the full list. A
// ring with no live server answers -1 to every Lookup.
func (r *Ring) WithLive(live []bool) (*Ring, error) {
	if len(live) != len(r.servers) {
		return nil, fmt.Errorf("shardproxy: ring: live has %d entries for %d servers", len(live), len(r.servers))
	}
	nr := &Ring{
		servers: r.servers,
		addrs:   r.addrs,
		hash:    r.hash,
		tag:     r.tag,
		hasTag:  r.hasTag,
	}
	nr.build(slices.Clone(live))
	return nr, nil
}

// build fills the continuum exactly as ketama_update in
// src/hashkit/nc_ketama.c does for the live servers.
func (r *Ring) build(live []bool) {
	r.live = live
	var totalWeight uint32
	r.nlive = 0
	for i, s := range r.servers {
		if live[i] {
			r.nlive++
			totalWeight += uint32(s.Weight)
		}
	}
	type point struct {
		value uint32
		index uint16
	}
	points := make([]point, 0, r.nlive*ketamaPointsPerServer)
	var name []byte
	for i, s := range r.servers {
		if !live[i] {
			continue
		}
		n := pointsPerServer(uint32(s.Weight), totalWeight, uint32(r.nlive))
		base := s.ketamaName()
		for p := uint32(0); p < n/ketamaPointsPerHash; p++ {
			// snprintf(host, KETAMA_MAX_HOSTLEN, "%.*s-%u", name, index):
			// validateServers keeps it below the buffer's size.
			name = append(append(append(name[:0], base...), '-'), strconv.FormatUint(uint64(p), 10)...)
			for _, v := range ketamaPoints(name) {
				points = append(points, point{value: v, index: uint16(i)})
			}
		}
	}
	// nutcracker sorts with qsort. glibc's qsort (up to 2.36, Debian 12's)
	// is a merge sort, hence stable: equal values, about one pair in 10^5
	// rings, keep server order. A stable sort reproduces that.
	slices.SortStableFunc(points, func(a, b point) int {
		switch {
		case a.value < b.value:
			return -1
		case a.value > b.value:
			return 1
		}
		return 0
	})
	r.values = make([]uint32, len(points))
	r.index = make([]uint16, len(points))
	for i, p := range points {
		r.values[i], r.index[i] = p.value, p.index
	}
	bits := uint(8)
	for bits < 16 && 1<<bits < len(points) {
		bits++
	}
	r.shift = 32 - bits
	r.bucket = make([]uint32, 1<<bits+1)
	i := 0
	for b := range r.bucket {
		for i < len(points) && uint64(r.values[i]) < uint64(b)<<r.shift {
			i++
		}
		r.bucket[b] = uint32(i)
	}
}

// pointsPerServer is ketama_update's
//
//	pct = (float)server->weight / (float)total_weight;
//	pointer_per_server = (uint32_t) ((floorf((float) (pct * KETAMA_POINTS_PER_SERVER / 4
//	                      * (float)nlive_server + 0.0000000001))) * 4);
//
// in the same float32 steps (x86-64 evaluates float in single precision; the
// 1e-10 literal is a double). The explicit conversions forbid fused
// multiply-adds, so every architecture rounds as nutcracker does.
func pointsPerServer(weight, totalWeight, nlive uint32) uint32 {
	pct := float32(weight) / float32(totalWeight)
	x := float32(float32(float32(pct*ketamaPointsPerServer)/4) * float32(nlive))
	y := float32(float64(x) + 0.0000000001)
	return uint32(float32(math.Floor(float64(y))) * 4)
}

// Lookup returns the index, in the server list given to NewRing, of the
// server nutcracker would send key to, or -1 when no server is live. It does
// not allocate and is safe for concurrent use.
//
// With a hash tag "{}", only the bytes between the first '{' and the first
// '}' after it are hashed, when both are present and the tag is not empty;
// otherwise the whole key is (server_pool_idx in src/nc_server.c). As in
// nutcracker, a pool of one server takes every key without hashing, and an
// empty key hashes to 0.
func (r *Ring) Lookup(key []byte) int {
	if len(r.values) == 0 {
		return -1
	}
	if len(r.servers) == 1 {
		return 0
	}
	if r.hasTag {
		key = hashTagged(key, r.tag[0], r.tag[1])
	}
	var h uint32
	if len(key) > 0 {
		h = r.hash.sum(key)
	}
	return int(r.index[r.dispatch(h)])
}

// dispatch is ketama_dispatch: the first point whose value is at least h,
// wrapping to the first point past the end.
func (r *Ring) dispatch(h uint32) int {
	b := h >> r.shift
	lo, hi := int(r.bucket[b]), int(r.bucket[b+1])
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.values[mid] < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(r.values) {
		return 0
	}
	return lo
}

// hashTagged returns the part of key nutcracker hashes under the hash tag
// open, close: the bytes between the first open and the first close after
// it, if both exist and the tag is not empty, else the whole key.
func hashTagged(key []byte, open, close byte) []byte {
	i := bytes.IndexByte(key, open)
	if i < 0 {
		return key
	}
	j := bytes.IndexByte(key[i+1:], close)
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// Len returns the number of servers, live or not.
func (r *Ring) Len() int { return len(r.servers) }

// Live returns the number of live servers.
func (r *Ring) Live() int { return r.nlive }

// IsLive reports whether server i holds points on this ring.
func (r *Ring) IsLive(i int) bool { return i >= 0 && i < len(r.live) && r.live[i] }

// Server returns server i (0 ≤ i < Len()) as given to NewRing, with a zero
// weight made 1.
func (r *Ring) Server(i int) Server { return r.servers[i] }

// Points returns the number of points on the continuum (160 per live server
// of average weight, rounded down to multiples of 4 per server).
func (r *Ring) Points() int { return len(r.values) }

// PickServer implements memcache.ServerSelector: the address of the server
// for key, or ErrNoServers when none is live. It does not allocate.
func (r *Ring) PickServer(key string) (net.Addr, error) {
	// The hash only reads the key; viewing the string's bytes in place
	// keeps PickServer free of allocations.
	i := r.Lookup(unsafe.Slice(unsafe.StringData(key), len(key)))
	if i < 0 {
		return nil, ErrNoServers
	}
	return r.addrs[i], nil
}

// Each implements memcache.ServerSelector: it calls f with the address of
// every live server, in list order, and stops at the first error.
func (r *Ring) Each(f func(net.Addr) error) error {
	for i, a := range r.addrs {
		if !r.live[i] {
			continue
		}
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}

// tcpAddr is a net.Addr for a "host:port" that is resolved when dialled,
// not when the ring is built, so building a ring does no DNS.
type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }
