package shardproxy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
)

// testServers returns n servers on distinct loopback ports with the given
// weights (1 when weights is short).
func testServers(n int, weights ...int) []Server {
	s := make([]Server, n)
	for i := range s {
		s[i] = Server{Addr: fmt.Sprintf("10.0.0.%d:%d", i+1, 11300+i), Weight: 1}
		if i < len(weights) {
			s[i].Weight = weights[i]
		}
	}
	return s
}

func mustRing(t testing.TB, servers []Server, h Hash, tag string) *Ring {
	t.Helper()
	r, err := NewRing(servers, h, tag)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestHashes(t *testing.T) {
	// Pinned values. Their agreement with nutcracker is what
	// TestNutcrackerAgrees proves; these catch a change without it.
	tests := []struct {
		hash Hash
		key  string
		want uint32
	}{
		{HashFNV1a64, "", 0x84222325},
		{HashFNV1a64, "a", ((0x84222325 ^ 'a') * 0x1b3) & 0xffffffff},
		{HashFNV1a64, "\xff", ((0x84222325 ^ 0xffffffff) * 0x1b3) & 0xffffffff}, // signed char
		{HashFNV1a64, "\x80", ((0x84222325 ^ 0xffffff80) * 0x1b3) & 0xffffffff},
		{HashMD5, "", 0xd98c1dd4},  // d41d8cd9…, little-endian
		{HashMD5, "a", 0xb975c10c}, // 0cc175b9…
		{HashMurmur, "", 0},        // seeded with 0xdeadbeef×0
		{HashMurmur, "0123456789abcdef", hashMurmur([]byte("0123456789abcdef"))},
	}
	for _, tt := range tests {
		if got := tt.hash.sum([]byte(tt.key)); got != tt.want {
			t.Errorf("%s(%q): got %#08x, want %#08x", tt.hash, tt.key, got, tt.want)
		}
	}
	// Murmur tails: every length mod 4 takes its own branch.
	seen := map[uint32]string{}
	for n := range 9 {
		k := strings.Repeat("k", n)
		h := hashMurmur([]byte(k))
		if prev, dup := seen[h]; dup {
			t.Errorf("murmur(%q) == murmur(%q) == %#x", k, prev, h)
		}
		seen[h] = k
	}
}

func TestKetamaName(t *testing.T) {
	tests := []struct {
		s    Server
		want string
	}{
		{Server{Addr: "127.0.0.1:11211"}, "127.0.0.1"},
		{Server{Addr: "cache-1.pop:11211"}, "cache-1.pop"},
		{Server{Addr: "127.0.0.1:11212"}, "127.0.0.1:11212"},
		{Server{Addr: "127.0.0.1:011211"}, "127.0.0.1"}, // nc_atoi reads 11211
		{Server{Addr: "127.0.0.1:11211", Name: "a"}, "a"},
		{Server{Addr: "10.1.2.3:22122", Name: "shard-7"}, "shard-7"},
	}
	for _, tt := range tests {
		if got := tt.s.ketamaName(); got != tt.want {
			t.Errorf("ketamaName(%+v): got %q, want %q", tt.s, got, tt.want)
		}
	}
}

func TestPointsPerServer(t *testing.T) {
	tests := []struct {
		weights []int
		want    []uint32
	}{
		{[]int{1}, []uint32{160}},
		{[]int{1, 1, 1}, []uint32{160, 160, 160}},
		{[]int{1, 1, 1, 1, 1, 1, 1}, []uint32{160, 160, 160, 160, 160, 160, 160}},
		{[]int{1, 2}, []uint32{104, 212}},
		{[]int{3, 1, 2}, []uint32{240, 80, 160}},
		{[]int{1, 2, 3, 1, 5}, []uint32{64, 132, 200, 64, 332}},
		{[]int{1, 1000}, []uint32{0, 316}},
	}
	for _, tt := range tests {
		var total uint32
		for _, w := range tt.weights {
			total += uint32(w)
		}
		var got []uint32
		for _, w := range tt.weights {
			got = append(got, pointsPerServer(uint32(w), total, uint32(len(tt.weights))))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("weights %v: got points %v, want %v", tt.weights, got, tt.want)
		}
	}
}

func TestHashTagged(t *testing.T) {
	tests := []struct{ key, want string }{
		{"pl:{00ff}:17", "00ff"},
		{"{abc}", "abc"},
		{"a{b}c{d}", "b"},
		{"{{a}", "{a"},
		{"}{x}", "x"},
		{"{}x", "{}x"},       // empty tag: the whole key
		{"a{}{b}", "a{}{b}"}, // only the first '{' counts
		{"x{y", "x{y"},
		{"{", "{"},
		{"}", "}"},
		{"plain", "plain"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := hashTagged([]byte(tt.key), '{', '}'); string(got) != tt.want {
			t.Errorf("hashTagged(%q): got %q, want %q", tt.key, got, tt.want)
		}
	}
}

func TestNewRingRejects(t *testing.T) {
	long := strings.Repeat("n", 83) // "n…n-39" is 86 bytes: no room for the NUL
	tests := []struct {
		name    string
		servers []Server
		hash    Hash
		tag     string
		wants   []string // substrings of the error
	}{
		{"no servers", nil, HashFNV1a64, "{}", []string{"Servers: empty"}},
		{"bad addr", []Server{{Addr: "nohost"}}, HashFNV1a64, "{}", []string{`Servers[0].Addr: "nohost"`}},
		{"bad port", []Server{{Addr: "h:0"}, {Addr: "h:x"}}, HashFNV1a64, "{}", []string{`Servers[0].Addr: "h:0"`, `Servers[1].Addr: "h:x"`}},
		{"dup addr", []Server{{Addr: "h:1"}, {Addr: "h:1"}}, HashFNV1a64, "{}", []string{"Servers[1].Addr", "same as Servers[0]"}},
		{"dup name", []Server{{Addr: "h:1", Name: "a"}, {Addr: "h:2", Name: "a"}}, HashFNV1a64, "{}", []string{`ketama name "a"`}},
		{"dup 11211 host", []Server{{Addr: "h:11211"}, {Addr: "h:2", Name: "h"}}, HashFNV1a64, "{}", []string{`ketama name "h"`}},
		{"long name", []Server{{Addr: "h:1", Name: long}}, HashFNV1a64, "{}", []string{"too long"}},
		{"weight", []Server{{Addr: "h:1", Weight: -1}, {Addr: "h:2", Weight: MaxWeight + 1}}, HashFNV1a64, "{}", []string{"Servers[0].Weight: -1", "Servers[1].Weight: 65536"}},
		{"hash", []Server{{Addr: "h:1"}}, "crc64", "{}", []string{`Hash: hash "crc64"`}},
		{"tag", []Server{{Addr: "h:1"}}, HashMD5, "{", []string{`HashTag: "{"`}},
		{"all at once", []Server{{Addr: ""}}, "x", "abc", []string{"Servers[0].Addr", "Hash:", "HashTag:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRing(tt.servers, tt.hash, tt.tag)
			if err == nil {
				t.Fatalf("got ring %v, want an error", r)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// refLookup is an obviously correct, slow lookup: hash as nutcracker does,
// then scan the whole continuum for the first point at or after the hash.
func refLookup(r *Ring, key []byte) int {
	if r.nlive == 0 {
		return -1
	}
	if len(r.servers) == 1 {
		return 0
	}
	if r.hasTag {
		if i := bytes.IndexByte(key, r.tag[0]); i >= 0 {
			if j := bytes.IndexByte(key[i+1:], r.tag[1]); j > 0 {
				key = key[i+1 : i+1+j]
			}
		}
	}
	var h uint32
	if len(key) > 0 {
		h = r.hash.sum(key)
	}
	for i, v := range r.values {
		if v >= h {
			return int(r.index[i])
		}
	}
	return int(r.index[0])
}

func TestLookupMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, h := range []Hash{HashFNV1a64, HashMD5, HashMurmur} {
		for _, n := range []int{2, 3, 8, 31} {
			weights := make([]int, n)
			for i := range weights {
				weights[i] = 1 + rng.IntN(5)
			}
			r := mustRing(t, testServers(n, weights...), h, "{}")
			if !slices.IsSorted(r.values) {
				t.Fatalf("%s/%d: continuum not sorted", h, n)
			}
			for range 2000 {
				key := AppendCounterKey(nil, rng.Uint64(), rng.Int64())
				if got, want := r.Lookup(key), refLookup(r, key); got != want {
					t.Fatalf("%s/%d servers: Lookup(%q): got %d, want %d", h, n, key, got, want)
				}
			}
			// At, just below and just past every point, and at every
			// bucket's edges: the bucket table must not move a hash.
			var hs []uint32
			for _, v := range r.values {
				hs = append(hs, v-1, v, v+1)
			}
			for b := range len(r.bucket) - 1 {
				e := uint32(b) << r.shift
				hs = append(hs, e-1, e, e+1)
			}
			for _, hv := range hs {
				want := 0
				for i, v := range r.values {
					if v >= hv {
						want = i
						break
					}
				}
				if got := r.dispatch(hv); r.values[got] != r.values[want] {
					t.Fatalf("%s/%d servers: dispatch(%d): got point %d (%d), want %d (%d)", h, n, hv, got, r.values[got], want, r.values[want])
				}
			}
			// Hashes past the last point wrap to the first.
			if got := int(r.index[r.dispatch(^uint32(0))]); r.values[len(r.values)-1] != ^uint32(0) && got != int(r.index[0]) {
				t.Errorf("%s/%d: dispatch(max): got server %d, want the first point's %d", h, n, got, r.index[0])
			}
		}
	}
}

func TestWindowsOfAKeyShareAShard(t *testing.T) {
	r := mustRing(t, testServers(16), HashFNV1a64, "{}")
	rng := rand.New(rand.NewPCG(7, 8))
	for range 5000 {
		k := rng.Uint64()
		want := r.Lookup(AppendCounterKey(nil, k, 0))
		for _, start := range []int64{1, -1, 60_000, 1 << 62, -1 << 63} {
			if got := r.Lookup(AppendCounterKey(nil, k, start)); got != want {
				t.Fatalf("key %x window %d: got shard %d, want %d (window 0's)", k, start, got, want)
			}
		}
	}
}

func TestWithLive(t *testing.T) {
	r := mustRing(t, testServers(5), HashFNV1a64, "{}")
	sub, err := r.WithLive([]bool{true, true, false, true, true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sub.Live(), 4; got != want {
		t.Errorf("Live: got %d, want %d", got, want)
	}
	if sub.IsLive(2) || !sub.IsLive(0) || sub.IsLive(-1) || sub.IsLive(5) {
		t.Errorf("IsLive: got 0:%v 2:%v -1:%v 5:%v, want true false false false", sub.IsLive(0), sub.IsLive(2), sub.IsLive(-1), sub.IsLive(5))
	}
	// Equal weights keep 160 points each, so only the ejected server's keys
	// move, and they spread over the others.
	rng := rand.New(rand.NewPCG(9, 10))
	moved := map[int]int{}
	for range 20_000 {
		key := AppendCounterKey(nil, rng.Uint64(), 0)
		before, after := r.Lookup(key), sub.Lookup(key)
		switch {
		case after == 2:
			t.Fatalf("key %q: got the ejected server", key)
		case before != 2 && after != before:
			t.Fatalf("key %q: got moved from live server %d to %d, want it to stay", key, before, after)
		case before == 2:
			moved[after]++
		}
	}
	if len(moved) != 4 {
		t.Errorf("the ejected server's keys went to %v, want all 4 live servers", moved)
	}
	none, err := r.WithLive(make([]bool, 5))
	if err != nil {
		t.Fatal(err)
	}
	if got := none.Lookup([]byte("k")); got != -1 {
		t.Errorf("Lookup with no live server: got %d, want -1", got)
	}
	if _, err := none.PickServer("k"); err != ErrNoServers {
		t.Errorf("PickServer with no live server: got %v, want ErrNoServers", err)
	}
	if _, err := r.WithLive([]bool{true}); err == nil {
		t.Error("WithLive with 1 entry for 5 servers: got nil error, want one")
	}
}

func TestSingleServerTakesEverything(t *testing.T) {
	r := mustRing(t, testServers(1), HashMD5, "")
	for _, k := range []string{"", "a", "{x}"} {
		if got := r.Lookup([]byte(k)); got != 0 {
			t.Errorf("Lookup(%q) on one server: got %d, want 0", k, got)
		}
	}
}

func TestEach(t *testing.T) {
	r := mustRing(t, testServers(3), HashFNV1a64, "{}")
	sub, _ := r.WithLive([]bool{true, false, true})
	var got []string
	if err := sub.Each(func(a net.Addr) error { got = append(got, a.String()); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.0.0.1:11300", "10.0.0.3:11302"}; !slices.Equal(got, want) {
		t.Errorf("Each over live servers: got %v, want %v", got, want)
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	r := mustRing(t, testServers(8), HashFNV1a64, "{}")
	key := AppendCounterKey(nil, 0xdeadbeef, 1_700_000_000_000)
	skey := string(key)
	var buf [MaxCounterKeyLen]byte
	tests := []struct {
		name string
		f    func()
	}{
		{"Lookup", func() { r.Lookup(key) }},
		{"PickServer", func() { r.PickServer(skey) }},
		{"AppendCounterKey+Lookup", func() { r.Lookup(AppendCounterKey(buf[:0], 42, 17)) }},
	}
	for _, tt := range tests {
		if got := testing.AllocsPerRun(1000, tt.f); got != 0 {
			t.Errorf("%s: got %v allocs per run, want 0", tt.name, got)
		}
	}
}

func TestDistribution(t *testing.T) {
	// Not a nutcracker property, a sanity check of the default hash on our
	// keys: 8 equal servers, each should hold about 1/8 of 80 000 keys.
	for _, h := range []Hash{HashFNV1a64, HashMD5, HashMurmur} {
		r := mustRing(t, testServers(8), h, "{}")
		rng := rand.New(rand.NewPCG(11, 12))
		counts := make([]int, 8)
		const n = 80_000
		for range n {
			counts[r.Lookup(AppendCounterKey(nil, rng.Uint64(), 0))]++
		}
		lo, hi := slices.Min(counts), slices.Max(counts)
		t.Logf("%s: keys per server %v (min %.1f%%, max %.1f%% of the mean)", h, counts, 100*float64(lo)*8/n, 100*float64(hi)*8/n)
		if float64(lo) < 0.6*n/8 || float64(hi) > 1.4*n/8 {
			t.Errorf("%s: got shares from %d to %d, want each within 40%% of %d", h, lo, hi, n/8)
		}
	}
}
