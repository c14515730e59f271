package blockcache_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/blockcache"
)

func newCache(t testing.TB, cfg blockcache.Config, reg prometheus.Registerer) *blockcache.Cache {
	t.Helper()
	c, err := blockcache.New(cfg, reg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestBlockThenHitUntilReleaseThenMiss(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 100}, nil)
	now := time.Now().UnixNano()
	release := now + int64(time.Minute)
	const key = 0xfeed
	if !c.Block(key, release, now) {
		t.Fatal("Block = false, want true")
	}
	c.Wait()
	steps := []struct {
		name    string
		now     int64
		wantAt  int64
		wantHit bool
	}{
		{"at the Block", now, release, true},
		{"a second later", now + int64(time.Second), release, true},
		{"a nanosecond before the release", release - 1, release, true},
		{"at the release: expired, not yet evicted, a miss", release, 0, false},
		{"after the release", release + int64(time.Hour), 0, false},
	}
	for _, s := range steps {
		at, hit := c.Blocked(key, s.now)
		if at != s.wantAt || hit != s.wantHit {
			t.Errorf("%s: Blocked = (%d, %v), want (%d, %v)", s.name, at, hit, s.wantAt, s.wantHit)
		}
	}
	if at, hit := c.Blocked(key+1, now); hit {
		t.Errorf("Blocked(another key) = (%d, true), want a miss", at)
	}
	if st := c.Stats(); st.Hits != 3 || st.Misses != 3 || st.Blocks != 1 || st.Entries != 1 {
		t.Errorf("Stats = %+v, want 3 hits, 3 misses, 1 block, 1 entry", st)
	}
}

func TestBlockNeverShortens(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 100}, nil)
	now := time.Now().UnixNano()
	long, short := now+int64(time.Hour), now+int64(time.Minute)
	c.Block(1, long, now)
	c.Wait()
	if !c.Block(1, short, now) {
		t.Error("Block(shorter) = false, want true (already blocked longer)")
	}
	c.Wait()
	if at, _ := c.Blocked(1, now); at != long {
		t.Errorf("after a shorter Block: release %d, want the longer %d", at, long)
	}
	longer := now + 2*int64(time.Hour)
	c.Block(1, longer, now)
	c.Wait()
	if at, _ := c.Blocked(1, now); at != longer {
		t.Errorf("after a longer Block: release %d, want %d", at, longer)
	}
	c.Unblock(1)
	c.Block(1, short, now)
	c.Wait()
	if at, _ := c.Blocked(1, now); at != short {
		t.Errorf("after Unblock and a shorter Block: release %d, want %d", at, short)
	}
}

func TestBlockNothingToBlock(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 100}, nil)
	now := time.Now().UnixNano()
	for _, release := range []int64{now, now - 1, 0} {
		if c.Block(7, release, now) {
			t.Errorf("Block(release %d, now %d) = true, want false", release, now)
		}
	}
	c.Wait()
	if _, hit := c.Blocked(7, now-int64(time.Hour)); hit {
		t.Error("a key never blocked is a hit")
	}
	if st := c.Stats(); st.Blocks != 0 || st.SetsDropped != 0 {
		t.Errorf("Stats = %+v, want no blocks and no drops", st)
	}
}

func TestUnblockAndClear(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 1000}, nil)
	now := time.Now().UnixNano()
	for k := range uint64(100) {
		c.Block(k, now+int64(time.Minute), now)
	}
	c.Wait()
	if got := c.Len(); got != 100 {
		t.Fatalf("Len after 100 Blocks = %d, want 100", got)
	}
	c.Unblock(3)
	if _, hit := c.Blocked(3, now); hit {
		t.Error("Blocked after Unblock = hit, want a miss at once")
	}
	c.Clear()
	for k := range uint64(100) {
		if _, hit := c.Blocked(k, now); hit {
			t.Fatalf("Blocked(%d) after Clear = hit, want a miss", k)
		}
	}
	c.Wait()
	if st := c.Stats(); st.Entries != 0 || st.Evictions != 0 || st.Expirations != 0 {
		t.Errorf("after Clear: Stats = %+v, want 0 entries, and Clear not counted as evictions", st)
	}
	// The cache works after Clear.
	c.Block(5, now+int64(time.Minute), now)
	c.Wait()
	if _, hit := c.Blocked(5, now); !hit {
		t.Error("Blocked after Clear and Block = miss, want a hit")
	}
}

func TestCloseUnregistersAndRefuses(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, err := blockcache.New(blockcache.Config{}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blockcache.New(blockcache.Config{}, reg); err == nil || !strings.Contains(err.Error(), "blockcache: register metrics") {
		t.Errorf("a second New on the same registry: err = %v, want a registration error", err)
	}
	now := time.Now().UnixNano()
	c.Block(1, now+int64(time.Minute), now)
	c.Close()
	c.Close() // idempotent
	if c.Block(2, now+int64(time.Minute), now) {
		t.Error("Block after Close = true, want false")
	}
	if _, hit := c.Blocked(1, now); hit {
		t.Error("Blocked after Close = hit, want a miss")
	}
	c.Unblock(1)
	c.Clear()
	c.Wait()
	if n := c.Len(); n != 0 {
		t.Errorf("Len after Close = %d, want 0", n)
	}
	c2, err := blockcache.New(blockcache.Config{}, reg)
	if err != nil {
		t.Fatalf("New after Close on the same registry = %v, want nil", err)
	}
	c2.Close()
}

// TestBounded inserts 10 × MaxEntries distinct keys: the cache never holds
// more than MaxEntries.
func TestBounded(t *testing.T) {
	const maxEntries = 1000
	c := newCache(t, blockcache.Config{MaxEntries: maxEntries}, nil)
	now := time.Now().UnixNano()
	for k := range uint64(10 * maxEntries) {
		c.Blocked(k, now) // the request path looks up before it blocks
		c.Block(k, now+int64(time.Minute), now)
		if k%100 == 99 {
			c.Wait()
			if n := c.Len(); n > maxEntries {
				t.Fatalf("after %d keys: Len = %d, want ≤ %d", k+1, n, maxEntries)
			}
		}
	}
	c.Wait()
	live := 0
	for k := range uint64(10 * maxEntries) {
		if _, hit := c.Blocked(k, now); hit {
			live++
		}
	}
	st := c.Stats()
	if live > maxEntries || st.Entries > maxEntries {
		t.Errorf("%d keys answer blocked, Len %d, want both ≤ %d", live, st.Entries, maxEntries)
	}
	if lost := st.SetsDropped + st.SetsRejected + st.Evictions; lost == 0 {
		t.Errorf("Stats = %+v: 10× the capacity lost nothing, want drops, rejections or evictions counted", st)
	}
	t.Logf("10,000 keys into 1,000: %d held, %+v", live, st)
}

func TestConcurrentUse(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newCache(t, blockcache.Config{MaxEntries: 512}, reg)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range 20_000 {
				key := rng.Uint64N(2048)
				now := time.Now().UnixNano()
				switch rng.IntN(10) {
				case 0:
					c.Block(key, now+rng.Int64N(int64(time.Second)), now)
				case 1:
					if i%50 == 0 {
						c.Unblock(key)
					}
				default:
					if at, hit := c.Blocked(key, now); hit && at <= now {
						t.Errorf("Blocked(%d, %d) = (%d, true): a hit must release after now", key, now, at)
						return
					}
				}
			}
		}()
	}
	var side sync.WaitGroup
	side.Add(1)
	go func() { // rule changes and scrapes while the request path runs
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				c.Clear()
				if _, err := reg.Gather(); err != nil {
					t.Errorf("Gather = %v", err)
				}
				c.Stats()
			}
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()
	if st := c.Stats(); st.Hits+st.Misses == 0 || st.Entries > 512 {
		t.Errorf("Stats = %+v, want lookups counted and Entries ≤ 512", st)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCache(t, blockcache.Config{MaxEntries: 100}, reg)
	now := time.Now().UnixNano()
	c.Block(1, now+int64(time.Minute), now)
	c.Block(2, now+int64(time.Minute), now)
	c.Wait()
	c.Blocked(1, now)
	c.Blocked(2, now)
	c.Blocked(3, now)

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	want := `
# HELP poplimit_blockcache_blocks_total Blocks whose Set ristretto accepted into its buffer.
# TYPE poplimit_blockcache_blocks_total counter
poplimit_blockcache_blocks_total 2
# HELP poplimit_blockcache_entries Blocked keys held, expired ones not yet removed included.
# TYPE poplimit_blockcache_entries gauge
poplimit_blockcache_entries 2
# HELP poplimit_blockcache_hits_total Lookups that found the key blocked and were answered from memory.
# TYPE poplimit_blockcache_hits_total counter
poplimit_blockcache_hits_total 2
# HELP poplimit_blockcache_max_entries The bound on blocked keys held (Config.MaxEntries).
# TYPE poplimit_blockcache_max_entries gauge
poplimit_blockcache_max_entries 100
# HELP poplimit_blockcache_misses_total Lookups that found no live block and went to the limiter.
# TYPE poplimit_blockcache_misses_total counter
poplimit_blockcache_misses_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"poplimit_blockcache_blocks_total", "poplimit_blockcache_entries", "poplimit_blockcache_hits_total",
		"poplimit_blockcache_max_entries", "poplimit_blockcache_misses_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 9 {
		t.Errorf("GatherAndCount = %d, %v; want 9 metrics", n, err)
	}
}

func TestEvictionsCounted(t *testing.T) {
	// Capacity evictions of live blocks are evictions; Clear is not.
	c := newCache(t, blockcache.Config{MaxEntries: 10}, nil)
	now := time.Now().UnixNano()
	for k := range uint64(10) {
		c.Block(k, now+int64(time.Hour), now)
	}
	c.Wait()
	// Make key 100 much more looked-up than the 10 held, so TinyLFU admits it.
	for range 50 {
		c.Blocked(100, now)
	}
	c.Wait()
	for range 20 {
		c.Block(100, now+int64(time.Hour), now)
		c.Wait()
		if _, hit := c.Blocked(100, now); hit {
			break
		}
		for range 50 {
			c.Blocked(100, now)
		}
	}
	st := c.Stats()
	if _, hit := c.Blocked(100, now); !hit || st.Evictions == 0 || st.Entries > 10 {
		t.Errorf("a frequently looked-up key into a full cache: hit %v, Stats %+v; want a hit, an eviction, ≤ 10 entries", hit, st)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  blockcache.Config
		want string
	}{
		{blockcache.Config{}, ""},
		{blockcache.Config{MaxEntries: 1}, ""},
		{blockcache.Config{MaxEntries: 1 << 30}, ""},
		{blockcache.Config{MaxEntries: -1}, "blockcache: Config.MaxEntries -1: must be ≥ 0 (0 means 100000)"},
		{blockcache.Config{MaxEntries: 1<<30 + 1}, "blockcache: Config.MaxEntries 1073741825: must be ≤ 1073741824"},
	}
	for _, tt := range tests {
		got := ""
		if err := tt.cfg.Validate(); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%+v.Validate() = %q, want %q", tt.cfg, got, tt.want)
		}
		if tt.want != "" {
			if c, err := blockcache.New(tt.cfg, nil); err == nil || err.Error() != tt.want {
				t.Errorf("New(%+v) = %v, %v; want the Validate error", tt.cfg, c, err)
			}
		}
	}
}

// TestFilterKeepsEveryBlock blocks more keys than the front table has
// slots, so that slots are shared by keys released at different times, and
// checks that the filter never hides a block: each key is blocked until its
// own release and not after, an unblocked or never-blocked key sharing a busy
// slot is not, and blocks after a Clear are seen.
func TestFilterKeepsEveryBlock(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 100_000}, nil)
	now := time.Now().UnixNano()
	const n = 40_000 // > 2^14 slots
	rng := rand.New(rand.NewPCG(1, 2))
	release := make(map[uint64]int64, n)
	for len(release) < n {
		k := rng.Uint64()
		r := now + 1 + rng.Int64N(int64(time.Minute))
		release[k] = r
		for !c.Block(k, r, now) { // a full set buffer drops a Set: retry
			c.Wait()
		}
	}
	c.Wait()
	unblocked := 0
	for k := range release {
		if unblocked == 1000 {
			break
		}
		c.Unblock(k)
		delete(release, k)
		unblocked++
	}
	c.Wait()
	for k, r := range release {
		if at, ok := c.Blocked(k, r-1); !ok || at != r {
			t.Fatalf("key %x blocked until %d: Blocked(release-1) = %d, %v", k, r, at, ok)
		}
		if _, ok := c.Blocked(k, r); ok {
			t.Fatalf("key %x still blocked at its release", k)
		}
	}
	for i := range 10_000 {
		k := uint64(i) // not among the random keys (odds 10^4 × 4·10^4 / 2^64)
		if _, ok := c.Blocked(k, now); ok {
			t.Fatalf("never-blocked key %d found blocked", k)
		}
	}
	c.Clear()
	for k := range release {
		if _, ok := c.Blocked(k, now); ok {
			t.Fatalf("key %x blocked after Clear", k)
		}
		r := now + int64(time.Hour)
		c.Block(k, r, now)
		c.Wait()
		if at, ok := c.Blocked(k, now); !ok || at != r {
			t.Fatalf("key %x blocked again after Clear: Blocked = %d, %v", k, at, ok)
		}
		break
	}
}

func TestBlockedAllocs(t *testing.T) {
	c := newCache(t, blockcache.Config{MaxEntries: 1000}, prometheus.NewRegistry())
	now := time.Now().UnixNano()
	c.Block(42, now+int64(time.Hour), now)
	c.Wait()
	if _, hit := c.Blocked(42, now); !hit {
		t.Fatal("setup: key 42 not blocked")
	}
	// This package allocates nothing on this path. ristretto's Get hands its
	// 64-key access buffer to the admission policy once it is full and, when
	// the policy takes it, starts a fresh one: a 512-byte allocation at most
	// once per 64 lookups, which AllocsPerRun (an integer average) reports
	// as 0 and -benchmem as a few B/op.
	if allocs := testing.AllocsPerRun(10_000, func() { c.Blocked(42, now) }); allocs != 0 {
		t.Errorf("allocs per Blocked hit = %v, want 0", allocs)
	}
	if allocs := testing.AllocsPerRun(10_000, func() { c.Blocked(43, now) }); allocs != 0 {
		t.Errorf("allocs per Blocked miss = %v, want 0", allocs)
	}
}

func BenchmarkBlockedHit(b *testing.B) { benchmarkHits(b, 1024) }

// BenchmarkBlockedHitCrowded looks up keys blocked four to a front slot
// on average, so that most are not their slot's own key and go to ristretto.
func BenchmarkBlockedHitCrowded(b *testing.B) { benchmarkHits(b, 1<<16) }

// benchmarkHits blocks keys 0 to keys-1 (a power of two) and looks them up
// in turn.
func benchmarkHits(b *testing.B, keys uint64) {
	c := newCache(b, blockcache.Config{MaxEntries: 100_000}, prometheus.NewRegistry())
	now := time.Now().UnixNano()
	for k := range keys {
		for !c.Block(k, now+int64(time.Hour), now) { // a full set buffer drops a Set
			c.Wait()
		}
	}
	c.Wait()
	b.ReportAllocs()
	var k uint64
	for b.Loop() {
		k = (k + 1) & (keys - 1)
		if _, hit := c.Blocked(k, now); !hit {
			b.Fatalf("key %d: miss", k)
		}
	}
}

func BenchmarkBlockedMiss(b *testing.B) {
	c := newCache(b, blockcache.Config{MaxEntries: 100_000}, prometheus.NewRegistry())
	now := time.Now().UnixNano()
	for k := range uint64(1024) {
		c.Block(k, now+int64(time.Hour), now)
	}
	c.Wait()
	b.ReportAllocs()
	k := uint64(1 << 20)
	for b.Loop() {
		k++
		c.Blocked(k, now)
	}
}

func BenchmarkBlockedHitParallel(b *testing.B) {
	c := newCache(b, blockcache.Config{MaxEntries: 100_000}, prometheus.NewRegistry())
	now := time.Now().UnixNano()
	const keys = 1024
	for k := range uint64(keys) {
		c.Block(k, now+int64(time.Hour), now)
	}
	c.Wait()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := rand.Uint64()
		for pb.Next() {
			k++
			c.Blocked(k&(keys-1), now)
		}
	})
}

func BenchmarkBlock(b *testing.B) {
	c := newCache(b, blockcache.Config{MaxEntries: 100_000}, nil)
	now := time.Now().UnixNano()
	b.ReportAllocs()
	var k uint64
	for b.Loop() {
		k++
		c.Block(k, now+int64(time.Hour), now)
	}
}

func ExampleCache_Blocked() {
	c, err := blockcache.New(blockcache.Config{MaxEntries: 10_000}, nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	now := time.Now().UnixNano()
	key := uint64(0x9e3779b97f4a7c15)      // the hash of a rule and a client key
	release := now + int64(30*time.Second) // computed by the limiter
	fmt.Println("set:", c.Block(key, release, now))
	c.Wait() // Sets are asynchronous; the request path does not wait

	if at, ok := c.Blocked(key, now+int64(time.Second)); ok {
		fmt.Println("blocked for another", time.Duration(at-(now+int64(time.Second))))
	}
	_, ok := c.Blocked(key, release)
	fmt.Println("blocked at the release:", ok)
	// Output:
	// set: true
	// blocked for another 29s
	// blocked at the release: false
}

func ExampleCache_Clear() {
	c, _ := blockcache.New(blockcache.Config{}, nil)
	defer c.Close()
	now := time.Now().UnixNano()
	c.Block(1, now+int64(time.Minute), now)
	c.Wait()

	c.Clear() // the rules changed: old release times may not hold
	_, ok := c.Blocked(1, now)
	fmt.Println(ok)
	// Output: false
}

func ExampleConfig_Validate() {
	err := blockcache.Config{MaxEntries: -5}.Validate()
	fmt.Println(err)
	// Output: blockcache: Config.MaxEntries -5: must be ≥ 0 (0 means 100000)
}

// TestCloseUnderUse closes caches while goroutines block, look up, unblock
// and wait on them, as an edge's shutdown may when a request outlives the
// server's drain: no call panics (ristretto closes its channels on Close),
// and every call after Close answers as a closed cache does.
func TestCloseUnderUse(t *testing.T) {
	for round := range 20 {
		c, err := blockcache.New(blockcache.Config{MaxEntries: 256}, nil)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UnixNano()
		for k := range uint64(64) { // blocked slots, so lookups reach ristretto
			c.Block(k, now+int64(time.Minute), now)
		}
		c.Wait()
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				<-start
				for range 3_000 {
					key := rng.Uint64N(4096)
					now := time.Now().UnixNano()
					switch rng.IntN(8) {
					case 0:
						c.Block(key, now+int64(time.Minute), now)
					case 1:
						c.Unblock(key)
					case 2:
						c.Wait()
						c.Len()
					default:
						c.Blocked(key, now)
					}
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		c.Close()
		wg.Wait()
		if c.Block(1, now+int64(time.Minute), now) {
			t.Fatal("Block after Close = true, want false")
		}
		if _, hit := c.Blocked(1, now); hit {
			t.Fatal("Blocked after Close = hit, want a miss")
		}
	}
}
