package shardproxy

import (
	"fmt"
	"github.com/poplimit/poplimit/internal/testenv"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// TestNutcrackerAgrees writes keys through a real nutcracker and reads each
// back directly from the shard the Ring names, proving that Ring places every
// key where nutcracker does: it is on that shard with the value written, and
// on no other.
func TestNutcrackerAgrees(t *testing.T) {
	testenv.LookBinary(t, "nutcracker", "nutcracker")
	rng := rand.New(rand.NewPCG(1, 2))

	counterKeys := func(n int) []string {
		keys := make([]string, 0, n)
		for len(keys) < n {
			k, start := rng.Uint64(), int64(1_700_000_000_000+rng.IntN(1000)*60_000)
			// Two windows of each key: they must share a shard.
			keys = append(keys, string(AppendCounterKey(nil, k, start)), string(AppendCounterKey(nil, k, start+60_000)))
		}
		return keys
	}

	// oddKeys are legal memcached keys that exercise the hash tag rule and
	// bytes above 0x7f (which nutcracker's fnv1a_64 sign-extends).
	oddKeys := func(n int) []string {
		keys := []string{
			"plain", "{}x", "x{}", "{", "}", "}{", "{x", "x}", "a{b}c{d}", "{a}", "{{a}}", "a{}{b}",
			"}{x}", "{}}", "x{y", "{é}", "\xff\xfe{\x80\x81}", "\xc3\xa9t\xc3\xa9", "pl:{}:1", "pl:{0}:",
		}
		const alphabet = "{}{}ab:-_.~\x80\xa0\xff\xfe\x7e\x21"
		for len(keys) < n {
			b := make([]byte, 1+rng.IntN(40))
			for i := range b {
				if rng.IntN(2) == 0 {
					b[i] = alphabet[rng.IntN(len(alphabet))]
				} else {
					b[i] = byte(0x21 + rng.IntN(0x7e-0x21)) // printable, no space, no DEL
				}
			}
			keys = append(keys, string(b))
		}
		return dedupe(keys)
	}

	tests := []struct {
		name    string
		hash    Hash
		weights []int
		names   []string // per server; "" for none
		on11211 bool     // add a server at 127.0.0.2:11211, hashed by host alone
		keys    []string
	}{
		{name: "fnv1a_64/equal", hash: HashFNV1a64, weights: []int{1, 1, 1, 1}, keys: counterKeys(10_000)},
		{name: "fnv1a_64/weighted-named", hash: HashFNV1a64, weights: []int{1, 2, 3, 1, 5},
			names: []string{"", "shard-b", "", "", "e"}, on11211: true, keys: counterKeys(10_000)},
		{name: "md5/weighted", hash: HashMD5, weights: []int{3, 1, 2}, keys: counterKeys(10_000)},
		{name: "murmur/equal", hash: HashMurmur, weights: []int{1, 1, 1, 1, 1, 1, 1}, keys: counterKeys(10_000)},
		{name: "fnv1a_64/odd-keys", hash: HashFNV1a64, weights: []int{1, 2, 1}, keys: oddKeys(3_000)},
		{name: "md5/odd-keys", hash: HashMD5, weights: []int{2, 1, 1}, keys: oddKeys(3_000)},
		{name: "murmur/odd-keys", hash: HashMurmur, weights: []int{1, 1, 3}, keys: oddKeys(3_000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var servers []Server
			for i, w := range tt.weights {
				p := startMemcached(t, "127.0.0.1", testenv.FreePort(t))
				s := Server{Addr: p.Addr, Weight: w}
				if tt.names != nil {
					s.Name = tt.names[i]
				}
				servers = append(servers, s)
			}
			if tt.on11211 {
				// 127.0.0.2 is loopback too, and its port 11211 is free even
				// where a system memcached holds 127.0.0.1:11211.
				if err := portFree("127.0.0.2:11211"); err != nil {
					t.Logf("the default-port rule goes unchecked: %v", err)
				} else if _, err := testenv.MemcachedAt(t, "127.0.0.2", 11211); err != nil {
					t.Logf("no server on 127.0.0.2:11211, the default-port rule goes unchecked: %v", err)
				} else {
					servers = append(servers, Server{Addr: "127.0.0.2:11211", Weight: 2})
				}
			}
			ring, err := NewRing(servers, tt.hash, "{}")
			if err != nil {
				t.Fatal(err)
			}
			proxy := startNutcracker(t, servers, tt.hash)
			setAll(t, proxy, tt.keys)

			// Where the ring puts each key, by shard.
			want := make([][]string, len(servers))
			index := make(map[string]int, len(tt.keys))
			for i, k := range tt.keys {
				s := ring.Lookup([]byte(k))
				want[s] = append(want[s], k)
				index[k] = i
			}
			misplaced := 0
			for s, srv := range servers {
				got := getAll(t, srv.Addr, want[s])
				for _, k := range want[s] {
					if v, ok := got[k]; !ok {
						misplaced++
						if misplaced <= 5 {
							t.Errorf("key %q: got nothing on %s (ring's shard %d), want it there", k, srv.Addr, s)
						}
					} else if w := "v" + strconv.Itoa(index[k]); v != w {
						t.Errorf("key %q on %s: got %q, want %q", k, srv.Addr, v, w)
					}
				}
				// No key the ring places elsewhere is on this shard.
				var others []string
				for o := range servers {
					if o != s {
						others = append(others, want[o]...)
					}
				}
				if got := getAll(t, srv.Addr, others); len(got) != 0 {
					for k := range got {
						t.Errorf("key %q: got it on %s (shard %d), want it only on shard %d", k, srv.Addr, s, ring.Lookup([]byte(k)))
						break
					}
					misplaced += len(got)
				}
			}
			shares := make([]string, len(servers))
			for s := range servers {
				shares[s] = fmt.Sprintf("%s w%d: %d", servers[s].Addr, servers[s].Weight, len(want[s]))
			}
			t.Logf("%d keys, %d misplaced; points %d; keys per shard: %v", len(tt.keys), misplaced, ring.Points(), shares)
			if misplaced > 0 {
				t.Fatalf("got %d of %d keys misplaced, want 0", misplaced, len(tt.keys))
			}

			// The ring also drives gomemcache as its ServerSelector.
			mc := memcache.NewFromSelector(ring)
			for _, k := range tt.keys[:min(len(tt.keys), 200)] {
				if !legalKeyForGomemcache(k) {
					continue
				}
				it, err := mc.Get(k)
				if err != nil {
					t.Fatalf("gomemcache over the ring: get %q: %v", k, err)
				}
				if w := "v" + strconv.Itoa(index[k]); string(it.Value) != w {
					t.Fatalf("gomemcache over the ring: get %q: got %q, want %q", k, it.Value, w)
				}
			}
			mc.Close()
		})
	}
}

// TestNutcrackerAgreesAfterEjection checks the continuum WithLive builds
// over a subset: nutcracker configured with only the live servers (which is
// what its auto_eject_hosts rebuild amounts to) places keys where the
// subset ring does. Server indexes differ, so it compares addresses.
func TestNutcrackerAgreesAfterEjection(t *testing.T) {
	testenv.LookBinary(t, "nutcracker", "nutcracker")
	ps := startShards(t, 4)
	servers := serversOf(ps)
	servers[1].Weight, servers[3].Weight = 3, 2
	full, err := NewRing(servers, HashFNV1a64, "{}")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := full.WithLive([]bool{true, false, true, true})
	if err != nil {
		t.Fatal(err)
	}
	liveServers := []Server{servers[0], servers[2], servers[3]}
	proxy := startNutcracker(t, liveServers, HashFNV1a64)
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]string, 5_000)
	for i := range keys {
		keys[i] = string(AppendCounterKey(nil, rng.Uint64(), 1_700_000_000_000))
	}
	setAll(t, proxy, keys)
	byAddr := make(map[string][]string)
	for _, k := range keys {
		s := sub.Lookup([]byte(k))
		if s == 1 {
			t.Fatalf("key %q: got ejected shard 1, want a live one", k)
		}
		byAddr[servers[s].Addr] = append(byAddr[servers[s].Addr], k)
	}
	for addr, ks := range byAddr {
		if got := getAll(t, addr, ks); len(got) != len(ks) {
			t.Errorf("%s: got %d of the %d keys the subset ring places there", addr, len(got), len(ks))
		}
	}
}

// portFree returns nil if nothing listens on addr, so that a server started
// there is ours and not one that was already running.
func portFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return ln.Close()
}

// dedupe returns keys without repeats, in first-seen order.
func dedupe(keys []string) []string {
	seen := make(map[string]bool, len(keys))
	out := keys[:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// legalKeyForGomemcache mirrors gomemcache's key check (no bytes up to
// space, no DEL, at most 250 bytes).
func legalKeyForGomemcache(k string) bool {
	if len(k) > 250 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] == 0x7f {
			return false
		}
	}
	return true
}

var _ memcache.ServerSelector = (*Ring)(nil)
