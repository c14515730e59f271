package edge_test

import (
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// TestHungShardCostsNoMoreThanItsTimeout puts one of two memcached shards
// behind a relay that goes silent: no request waits longer than the store
// timeout (50 ms in these tests) plus a margin, fail-open rules keep
// admitting, and every fallback is counted.
func TestHungShardCostsNoMoreThanItsTimeout(t *testing.T) {
	_, shards := testenv.Shards(t, 2)
	relay := testenv.NewRelay(t, shards[1])
	e := startEdge(t, edgeOpts{memcache: []string{shards[0], relay.Addr}, rules: `
rules:
  - {name: async, path_prefix: /async, key: ["header:K"], limit: 1000, window: 1m}
  - {name: sync, path_prefix: /sync, key: ["header:K"], limit: 1000, window: 1m, mode: sync}
`})
	send := func(path string, n int) (lat []time.Duration, codes map[int]int) {
		codes = map[int]int{}
		for i := 0; i < n; i++ {
			req, _ := http.NewRequest("GET", "http://"+e.addr+path, nil)
			req.Header.Set("K", "client-"+strconv.Itoa(i%10))
			start := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			lat = append(lat, time.Since(start))
			codes[resp.StatusCode]++
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return lat, codes
	}
	send("/sync", 20) // warm the connections
	relay.Hang()
	for _, path := range []string{"/async", "/sync"} {
		lat, codes := send(path, 200)
		p99, worst := lat[len(lat)*99/100], lat[len(lat)-1]
		t.Logf("%s with a hung shard: p50 %v p99 %v max %v codes %v", path, lat[len(lat)/2], p99, worst, codes)
		if codes[200] != 200 {
			t.Errorf("%s: %v, want every request admitted (fail open)", path, codes)
		}
		if p99 > 250*time.Millisecond || worst > time.Second {
			t.Errorf("%s: p99 %v, max %v with a hung shard, want at most the 50 ms store timeout plus a margin", path, p99, worst)
		}
	}
	// The failures are counted and the silent shard is ejected. (Whether a
	// decision meets a key whose last flush failed, and counts a fallback,
	// depends on timing; TestStoreDownFailOpenAndClosed counts them.)
	for _, name := range []string{"poplimit_window_store_errors_total", "poplimit_shardproxy_ejections_total"} {
		if n := testenv.MetricSum(t, e.reg, name); n == 0 {
			t.Errorf("%s = 0 after a shard hung", name)
		}
	}
	relay.Forward()
}
