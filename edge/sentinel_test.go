package edge_test

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/redisstore"
)

// An edge on Redis through Sentinel survives a failover: while the master
// is dead no request waits past the store timeout, each rule's failure
// policy decides and is counted, and once the sentinels have promoted the
// replica the counts go on there (the count of a limit reached before,
// replicated, still holds; a new one holds at its limit).
func TestRedisSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five Redis processes and waits for a failover")
	}
	sentinelFailover(t, testenv.Sentinels(t, 500*time.Millisecond), nil)
}

// The same over TLS alone: the master and the replica on TLS ports only,
// replicating over TLS, the sentinels on TLS ports, every certificate of
// a CA made here, which the edge alone trusts; its one TLS configuration
// (Config.TLS) applies to the sentinels too, as SentinelTLS is left nil.
// The sentinels name the master by IP address, which its certificate
// carries.
func TestRedisSentinelTLSFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five Redis processes and waits for a failover")
	}
	set := testenv.SentinelsTLS(t, 500*time.Millisecond, nil)
	if out := testenv.RedisCLI(t, set.Sentinels[0].Addr, "ping"); out == "PONG" {
		t.Fatalf("a sentinel answered in plaintext: the set does not speak TLS alone")
	}
	sentinelFailover(t, set, set.TLS.Config())
}

func sentinelFailover(t *testing.T, set *testenv.SentinelSet, tlsConfig *tls.Config) {
	const storeTimeout = 200 * time.Millisecond
	opts := edge.Options{}
	opts.Redis = redisstore.Config{Addrs: set.SentinelAddrs(), Mode: redisstore.TopologySentinel, SentinelMaster: set.Master, TLS: tlsConfig}
	opts.Limiter.StoreTimeout = storeTimeout
	opts.Limiter.FlushInterval = 2 * time.Millisecond
	// Sync rules, each decision a store round trip; windows of an hour, so
	// that no window ends during the test.
	e := edgetest.Start(t, `
rules:
  - {name: before, path_prefix: /before, limit: 3, window: 1h, mode: sync}
  - {name: open, path_prefix: /open, limit: 100000, window: 1h, mode: sync}
  - {name: closed, path_prefix: /closed, limit: 100000, window: 1h, mode: sync, fail: closed}
  - {name: after, path_prefix: /after, limit: 3, window: 1h, mode: sync}
`, opts)
	addr, reg := e.Addr(), e.Registry

	statuses := func(path string, n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if get(t, addr, path).StatusCode == 200 {
				b.WriteByte('A')
			} else {
				b.WriteByte('L')
			}
		}
		return b.String()
	}
	if got := statuses("/before", 5); got != "AAALL" {
		t.Fatalf("/before (limit 3) on the first master: %s, want AAALL", got)
	}
	if n := testenv.MetricSum(t, reg, "poplimit_redis_ops_total"); n == 0 {
		t.Fatal("no Redis operation counted: the edge is not on the sentinels' master")
	}
	// The counts are on the replica before the master dies (WAIT 1: one
	// replica acknowledged every write so far).
	if got := set.CLI(t, set.Primary.Addr, "wait", "1", "2000"); got != "1" {
		t.Fatalf("WAIT 1 on the master: %q, want 1 replica", got)
	}

	set.Primary.Kill() // SIGKILL
	killed := time.Now()
	var slowest time.Duration
	var slowestPath string
	openKO, closedKO, closedOK := 0, 0, 0
	for closedOK == 0 {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no answer of the store through the sentinels 30 s after the master died (master now %s)", set.MasterAddr(t))
		}
		for _, p := range []string{"/open", "/closed"} {
			start := time.Now()
			s := get(t, addr, p).StatusCode
			if d := time.Since(start); d > slowest {
				slowest, slowestPath = d, p
			}
			switch {
			case p == "/open" && s != 200:
				openKO++
			case p == "/closed" && s == 200:
				closedOK++
			case p == "/closed":
				closedKO++
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	recovered := time.Since(killed)
	t.Logf("store answering again %v after SIGKILL of the master; slowest request meanwhile %v (%s), store timeout %v; /closed refused %d times",
		recovered.Round(time.Millisecond), slowest.Round(time.Microsecond), slowestPath, storeTimeout, closedKO)
	// The sentinel that led the failover told the edge; the others learn
	// it from its hello messages.
	testenv.WaitFor(t, 10*time.Second, "the sentinels naming the promoted replica "+set.Replica.Addr+" as master",
		func() bool { return set.MasterAddr(t) == set.Replica.Addr })
	// A request's own cost beside the store's is small; the bound leaves
	// room for a loaded machine, far below a hung connection (seconds).
	if slowest > storeTimeout+300*time.Millisecond {
		t.Errorf("slowest request during the failover took %v (%s), want at most the store timeout %v (+300ms)", slowest, slowestPath, storeTimeout)
	}
	if openKO != 0 {
		t.Errorf("fail-open rule refused %d requests during the failover", openKO)
	}
	if closedKO == 0 {
		t.Error("fail-closed rule refused nothing while the master was dead")
	}
	for _, policy := range []string{"open", "closed"} {
		if n := testenv.MetricSum(t, reg, "poplimit_window_fallbacks_total", "policy", policy); n == 0 {
			t.Errorf("poplimit_window_fallbacks_total{policy=%q} = 0 after the failover", policy)
		}
	}
	if n := testenv.MetricSum(t, reg, "poplimit_edge_requests_total", "rule", "closed", "source", "fallback"); n != float64(closedKO) {
		t.Errorf("poplimit_edge_requests_total{rule=closed,source=fallback} = %v, want the %d refusals", n, closedKO)
	}

	// The counts resume on the new master.
	if got := statuses("/before", 2); got != "LL" {
		t.Errorf("/before after the failover: %s, want LL (its count of 3, replicated, holds)", got)
	}
	if got := statuses("/after", 5); got != "AAALL" {
		t.Errorf("/after (limit 3) on the promoted master: %s, want AAALL", got)
	}
	if got := set.CLI(t, set.Replica.Addr, "dbsize"); got == "0" {
		t.Error("the promoted master holds no key")
	}
}
