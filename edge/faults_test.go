package edge_test

import (
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
)

// TestHungShardFailsOpen puts one of two memcached shards behind a relay
// that goes silent: every request is answered (the relay never answers, so
// only the store timeout, 50 ms in these tests, ends a request's wait for
// it), fail-open rules keep admitting, the failures are counted and the
// shard is ejected. The latencies are logged; how fast a fallback answers
// is no test's claim on a loaded machine.
func TestHungShardFailsOpen(t *testing.T) {
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
		worst := lat[len(lat)-1]
		t.Logf("%s with a hung shard: p50 %v p99 %v max %v codes %v", path, lat[len(lat)/2], lat[len(lat)*99/100], worst, codes)
		if codes[200] != 200 {
			t.Errorf("%s: %v, want every request admitted (fail open)", path, codes)
		}
		// A hang guard, below the client's 5 s timeout: a request whose
		// wait the store timeout did not end would wait for ever.
		if worst > 3*time.Second {
			t.Errorf("%s: a request took %v with a hung shard, want its wait ended by the 50 ms store timeout", path, worst)
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
