package shardproxy

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
)

// FuzzRing checks Lookup against the slow reference on arbitrary keys and
// rings: same server, in range, never a panic, PickServer agreeing.
func FuzzRing(f *testing.F) {
	f.Add([]byte("pl:{00000000deadbeef}:1700000000000"), uint8(4), uint64(0), uint8(0), true)
	f.Add([]byte("a{b}c{d}"), uint8(3), uint64(0x0102030405), uint8(1), true)
	f.Add([]byte("{}x"), uint8(2), uint64(7), uint8(2), true)
	f.Add([]byte("\xff\xfe{\x80}"), uint8(5), uint64(99), uint8(0), false)
	f.Add([]byte(""), uint8(1), uint64(0), uint8(0), true)
	f.Add([]byte("}{"), uint8(9), uint64(1<<63), uint8(1), true)
	f.Fuzz(func(t *testing.T, key []byte, n uint8, weights uint64, hash uint8, tagged bool) {
		servers := make([]Server, 1+int(n)%12)
		for i := range servers {
			servers[i] = Server{Addr: fmt.Sprintf("10.0.%d.1:%d", i, 11211+i%2), Weight: 1 + int(weights>>(4*(i%16)))&0xf}
		}
		tag := ""
		if tagged {
			tag = "{}"
		}
		h := []Hash{HashFNV1a64, HashMD5, HashMurmur}[int(hash)%3]
		r, err := NewRing(servers, h, tag)
		if err != nil {
			t.Fatalf("NewRing(%v): %v", servers, err)
		}
		live := make([]bool, len(servers))
		for i := range live {
			live[i] = weights>>i&1 == 0 || i == 0
		}
		sub, err := r.WithLive(live)
		if err != nil {
			t.Fatal(err)
		}
		for _, ring := range []*Ring{r, sub} {
			got := ring.Lookup(key)
			if want := refLookup(ring, key); got != want {
				t.Fatalf("%s ring of %d (%d live): Lookup(%q): got %d, want %d", h, ring.Len(), ring.Live(), key, got, want)
			}
			if got < 0 || got >= len(servers) || !ring.IsLive(got) && len(servers) > 1 {
				t.Fatalf("Lookup(%q): got server %d, want a live one of %d", key, got, len(servers))
			}
			addr, err := ring.PickServer(string(key))
			if err != nil || addr.String() != servers[got].Addr {
				t.Fatalf("PickServer(%q): got %v, %v, want %s", key, addr, err, servers[got].Addr)
			}
		}
		tg := hashTagged(key, '{', '}')
		if len(tg) == 0 && len(key) > 0 || !bytes.Contains(key, tg) {
			t.Fatalf("hashTagged(%q): got %q, want a non-empty part of the key", key, tg)
		}
	})
}

// FuzzCounterKey checks that every counter key is a legal memcached key of
// at most MaxCounterKeyLen bytes whose hash tag is the key's 16 hex digits
// and whose suffix is the window start.
func FuzzCounterKey(f *testing.F) {
	f.Add(uint64(0), int64(0))
	f.Add(uint64(0xdeadbeef), int64(1_700_000_000_000))
	f.Add(^uint64(0), int64(-1<<63))
	f.Add(uint64(1), int64(1<<63-1))
	f.Fuzz(func(t *testing.T, key uint64, start int64) {
		k := AppendCounterKey(nil, key, start)
		if len(k) > MaxCounterKeyLen || !legalKeyForGomemcache(string(k)) {
			t.Fatalf("key %q: %d bytes or illegal characters", k, len(k))
		}
		if got, want := string(hashTagged(k, '{', '}')), fmt.Sprintf("%016x", key); got != want {
			t.Fatalf("key %q: got tag %q, want %q", k, got, want)
		}
		i := bytes.LastIndexByte(k, ':')
		if got, err := strconv.ParseInt(string(k[i+1:]), 10, 64); err != nil || got != start {
			t.Fatalf("key %q: got start %d (%v), want %d", k, got, err, start)
		}
		if !bytes.HasPrefix(k, []byte("pl:{")) {
			t.Fatalf("key %q: want prefix pl:{", k)
		}
	})
}
