package edge_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls/xds"
	"github.com/poplimit/poplimit/rls/xds/xdstest"
)

const hour = rlsconf.RateLimitUnit_HOUR

// rlsClient calls an edge's rate limit service.
type rlsClient struct {
	t *testing.T
	c rlspb.RateLimitServiceClient
}

func newRLSClient(t *testing.T, addr string) *rlsClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rlsClient{t, rlspb.NewRateLimitServiceClient(conn)}
}

// codes asks n times about the descriptor key=value of domain, and returns
// the answers, O for OK and L for OVER_LIMIT.
func (r *rlsClient) codes(domain, key, value string, n int) string {
	r.t.Helper()
	var b strings.Builder
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := r.c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: domain,
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
		cancel()
		switch {
		case err != nil:
			r.t.Fatalf("ShouldRateLimit %s %s=%s: %v", domain, key, value, err)
		case resp.GetOverallCode() == rlspb.RateLimitResponse_OK:
			b.WriteByte('O')
		default:
			b.WriteByte('L')
		}
	}
	return b.String()
}

// inForce waits (10 s at most) until the edge's xDS version is want and
// returns how long that took since start.
func inForce(t *testing.T, e *edge.Edge, want string, start time.Time) time.Duration {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "xDS version "+want+" in force", func() bool { return e.XDSVersion() == want })
	return time.Since(start)
}

// The rate limit configuration comes from go-control-plane's own xDS
// server: the edge subscribes with its node id and metadata, applies a
// pushed configuration (and its updates) for its rate limit service,
// NACKs one that does not validate with the loader's error and keeps
// deciding by the one in force, applies the next good one, keeps its
// configuration while the server is gone, and reconnects and applies what
// the server pushes when it returns.
func TestXDSConfiguration(t *testing.T) {
	const node = "edge-a"
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Push(t, node, "1", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 3, hour)))
	o := edge.Options{RLSListen: "127.0.0.1:0"}
	o.XDS = xds.Config{Server: srv.Addr, NodeID: node, NodeMetadata: map[string]string{"zone": "a", "role": "rls"},
		BackoffInitial: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	e := edgetest.Start(t, "", o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.WaitConfig(ctx); err != nil {
		t.Fatal(err)
	}
	if v := e.XDSVersion(); v != "1" {
		t.Fatalf("version in force after WaitConfig: %q, want 1", v)
	}
	nodes := srv.Nodes()
	if len(nodes) == 0 || nodes[0].GetId() != node || nodes[0].GetMetadata().GetFields()["zone"].GetStringValue() != "a" ||
		nodes[0].GetMetadata().GetFields()["role"].GetStringValue() != "rls" {
		t.Errorf("nodes the server saw: %v, want id %s with metadata zone=a, role=rls", nodes, node)
	}
	c := newRLSClient(t, e.RLSAddr())
	if got := c.codes("d", "k", "v", 4); got != "OOOL" {
		t.Fatalf("k=v (3 per hour, version 1): %s, want OOOL", got)
	}
	metric := func(name string, labels ...string) float64 { return testenv.MetricSum(t, e.Registry, name, labels...) }
	if metric("poplimit_xds_connected") != 1 || metric("poplimit_xds_configs_total", "result", "accepted") != 1 {
		t.Errorf("after version 1: connected %v, accepted %v; want 1 and 1",
			metric("poplimit_xds_connected"), metric("poplimit_xds_configs_total", "result", "accepted"))
	}

	// An update: a new descriptor, and the old one's limit raised.
	start := time.Now()
	srv.Push(t, node, "2", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 5, hour), xdstest.Limit("k", "w", 1, hour)))
	took := inForce(t, e, "2", start)
	t.Logf("version 2 in force %v after the push", took)
	if got := c.codes("d", "k", "w", 2); got != "OL" {
		t.Errorf("k=w (1 per hour, version 2): %s, want OL", got)
	}
	if got := c.codes("d", "k", "v", 3); got != "OLL" {
		t.Errorf("k=v (5 per hour, version 2, 4 counted): %s, want OLL", got)
	}

	// A configuration that does not validate: NACKed with the loader's
	// error, version 2 stays in force and decides as before.
	srv.Push(t, node, "3", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 5, hour),
		&rlsconf.RateLimitDescriptor{Key: "k", Value: "z", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 2}}))
	testenv.WaitFor(t, 10*time.Second, "a NACK of version 3", func() bool { return len(srv.NACKs()) > 0 })
	nack := srv.NACKs()[0]
	if nack.GetVersionInfo() != "2" || nack.GetResponseNonce() == "" || !strings.Contains(nack.GetErrorDetail().GetMessage(), "unit") ||
		!strings.Contains(nack.GetErrorDetail().GetMessage(), "rl") {
		t.Errorf("NACK: version %q nonce %q detail %q; want version 2, a nonce, and the loader's error naming the resource rl and the unit",
			nack.GetVersionInfo(), nack.GetResponseNonce(), nack.GetErrorDetail().GetMessage())
	}
	t.Logf("NACK detail: %s", nack.GetErrorDetail().GetMessage())
	if v := e.XDSVersion(); v != "2" {
		t.Errorf("version in force after the NACK: %q, want 2", v)
	}
	if got := c.codes("d", "k", "w", 1); got != "L" {
		t.Errorf("k=w after the NACK: %s, want L (version 2's count holds)", got)
	}
	if got := c.codes("d", "k", "z", 3); got != "OOO" {
		t.Errorf("k=z (only in the rejected version 3): %s, want OOO (no limit)", got)
	}
	if metric("poplimit_xds_configs_total", "result", "rejected") != 1 || metric("poplimit_edge_rule_reloads_total", "result", "rejected") != 1 {
		t.Errorf("rejected: xds %v, edge reloads %v; want 1 and 1 (a repeated NACK of the same response counts once)",
			metric("poplimit_xds_configs_total", "result", "rejected"), metric("poplimit_edge_rule_reloads_total", "result", "rejected"))
	}

	// Restored: the next good version applies.
	start = time.Now()
	srv.Push(t, node, "4", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 5, hour), xdstest.Limit("k", "w", 1, hour),
		xdstest.Limit("k", "x", 2, hour)))
	took = inForce(t, e, "4", start)
	t.Logf("version 4 (restored) in force %v after the push", took)
	if got := c.codes("d", "k", "x", 2); got != "OO" {
		t.Errorf("k=x (2 per hour, version 4): %s, want OO", got)
	}

	// The server goes away: nothing changes.
	srv.Stop()
	testenv.WaitFor(t, 10*time.Second, "poplimit_xds_connected 0", func() bool { return metric("poplimit_xds_connected") == 0 })
	if got := c.codes("d", "k", "x", 1); got != "L" {
		t.Errorf("k=x with the server gone: %s, want L (version 4 holds, and its count)", got)
	}
	if v := e.XDSVersion(); v != "4" {
		t.Errorf("version in force with the server gone: %q, want 4", v)
	}

	// It returns (a new process: a new cache), with a new version.
	srv2 := xdstest.Start(t, srv.Addr)
	start = time.Now()
	srv2.Push(t, node, "5", xdstest.Config("rl", "d", xdstest.Limit("k", "y", 1, hour)))
	took = inForce(t, e, "5", start)
	t.Logf("version 5 from the restarted server in force %v after its push", took)
	if got := c.codes("d", "k", "y", 2); got != "OL" {
		t.Errorf("k=y (1 per hour, version 5): %s, want OL", got)
	}
	if got := c.codes("d", "k", "x", 2); got != "OO" {
		t.Errorf("k=x (gone in version 5): %s, want OO", got)
	}
	if metric("poplimit_xds_stream_errors_total") == 0 || metric("poplimit_xds_connected") != 1 {
		t.Errorf("stream errors %v, connected %v; want > 0 and 1", metric("poplimit_xds_stream_errors_total"), metric("poplimit_xds_connected"))
	}
	if n := metric("poplimit_xds_config_info", "version", "5"); n != 1 {
		t.Errorf("poplimit_xds_config_info{version=5} = %v, want 1", n)
	}
}

// Without ForceStart, WaitConfig waits for the first configuration; with
// it, the edge serves at once (the rate limit service answers without a
// configuration) and applies the first when it comes.
func TestXDSForceStart(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0")
	start := func(force bool) *edge.Edge {
		o := edge.Options{RLSListen: "127.0.0.1:0"}
		o.XDS = xds.Config{Server: srv.Addr, NodeID: "n", ForceStart: force, BackoffInitial: 50 * time.Millisecond}
		return edgetest.Start(t, "", o)
	}
	waiting := start(false)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := waiting.WaitConfig(ctx); err == nil {
		t.Fatal("WaitConfig returned nil without a configuration on the server")
	}
	forced := start(true)
	if err := forced.WaitConfig(context.Background()); err != nil {
		t.Fatalf("WaitConfig with ForceStart: %v", err)
	}
	srv.Push(t, "n", "1", xdstest.Config("rl", "d", xdstest.Limit("k", "v", 1, hour)))
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := waiting.WaitConfig(ctx2); err != nil {
		t.Fatal(err)
	}
	inForce(t, forced, "1", time.Now())
	if got := newRLSClient(t, forced.RLSAddr()).codes("d", "k", "v", 2); got != "OL" {
		t.Errorf("k=v (1 per hour) through the force-started edge: %s, want OL", got)
	}
}
