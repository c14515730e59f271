package envoy_test

import (
	"cmp"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// config is envoy.yaml decoded: the bootstrap and the parts the tests
// read.
type config struct {
	boot   *bootstrapv3.Bootstrap
	hcm    *hcmv3.HttpConnectionManager
	filter *ratelimitv3.RateLimit
}

// load decodes envoy.yaml strictly (unknown fields are errors) and
// validates it, and each typed config it holds, with Envoy's rules
// (protoc-gen-validate, as go-control-plane generates them).
func load(t *testing.T) config {
	t.Helper()
	y, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var c config
	c.boot = new(bootstrapv3.Bootstrap)
	if err := protojson.Unmarshal(j, c.boot); err != nil {
		t.Fatalf("envoy.yaml does not decode as an Envoy bootstrap: %v", err)
	}
	if err := c.boot.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	type validator interface{ ValidateAll() error }
	for _, l := range c.boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				m, err := f.GetTypedConfig().UnmarshalNew()
				if err != nil {
					t.Fatalf("filter %s: %v", f.GetName(), err)
				}
				if err := m.(validator).ValidateAll(); err != nil {
					t.Fatalf("filter %s: %v", f.GetName(), err)
				}
				if h, ok := m.(*hcmv3.HttpConnectionManager); ok {
					c.hcm = h
				}
			}
		}
	}
	if c.hcm == nil {
		t.Fatal("envoy.yaml: no http_connection_manager")
	}
	for _, hf := range c.hcm.GetHttpFilters() {
		m, err := hf.GetTypedConfig().UnmarshalNew()
		if err != nil {
			t.Fatalf("http filter %s: %v", hf.GetName(), err)
		}
		if err := m.(validator).ValidateAll(); err != nil {
			t.Fatalf("http filter %s: %v", hf.GetName(), err)
		}
		if r, ok := m.(*ratelimitv3.RateLimit); ok {
			c.filter = r
		}
	}
	if c.filter == nil {
		t.Fatal("envoy.yaml: no envoy.filters.http.ratelimit filter")
	}
	return c
}

// TestConfig checks that envoy.yaml is a valid Envoy configuration and
// agrees with ratelimit/config.yaml and with the service: the domain, the
// cluster's protocol and port, the health check's service name.
func TestConfig(t *testing.T) {
	c := load(t)
	rs, err := envoyconf.LoadPath("ratelimit")
	if err != nil {
		t.Fatalf("ratelimit/: %v", err)
	}
	idx := envoyconf.DescriptorsOf(rs)
	if d := c.filter.GetDomain(); !idx.HasDomain(d) {
		t.Errorf("the filter's domain %q is not ratelimit/config.yaml's", d)
	}
	if c.filter.GetRateLimitService().GetTransportApiVersion().String() != "V3" {
		t.Errorf("transport_api_version %v, want V3", c.filter.GetRateLimitService().GetTransportApiVersion())
	}
	name := c.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var found bool
	for _, cl := range c.boot.GetStaticResources().GetClusters() {
		if cl.GetName() != name {
			continue
		}
		found = true
		if _, ok := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
			t.Errorf("cluster %s: no HTTP/2 protocol options, gRPC needs them", name)
		}
		hcs := cl.GetHealthChecks()
		if len(hcs) != 1 || hcs[0].GetGrpcHealthCheck().GetServiceName() != rlspb.RateLimitService_ServiceDesc.ServiceName {
			t.Errorf("cluster %s: health checks %v, want one gRPC check of %s", name, hcs, rlspb.RateLimitService_ServiceDesc.ServiceName)
		}
		ep := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if ep.GetPortValue() != 8081 {
			t.Errorf("cluster %s: port %d, want 8081 (README.md's -rls-listen)", name, ep.GetPortValue())
		}
	}
	if !found {
		t.Errorf("the filter's cluster %q is not defined", name)
	}
}

// request is what Envoy's rate limit actions read of a request.
type request struct {
	path    string
	ip      string
	headers map[string]string
}

// descriptors builds the descriptors Envoy sends for req from the route
// that matches it (first prefix match), with the three actions envoy.yaml
// uses: remote_address, generic_key, request_headers (a missing header
// drops the descriptor, skip_if_absent being false).
func descriptors(t *testing.T, c config, req request) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var route *routev3.Route
	for _, r := range c.hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		if strings.HasPrefix(req.path, r.GetMatch().GetPrefix()) {
			route = r
			break
		}
	}
	if route == nil {
		t.Fatalf("no route for %s", req.path)
	}
	var out []*rlcommon.RateLimitDescriptor
next:
	for _, rl := range route.GetRoute().GetRateLimits() {
		d := &rlcommon.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			var k, v string
			switch {
			case a.GetRemoteAddress() != nil:
				k, v = "remote_address", req.ip
			case a.GetGenericKey() != nil:
				k, v = cmp.Or(a.GetGenericKey().GetDescriptorKey(), "generic_key"), a.GetGenericKey().GetDescriptorValue()
			case a.GetRequestHeaders() != nil:
				h, ok := req.headers[strings.ToLower(a.GetRequestHeaders().GetHeaderName())]
				if !ok {
					continue next
				}
				k, v = a.GetRequestHeaders().GetDescriptorKey(), h
			default:
				t.Fatalf("action %v: not one this test builds", a)
			}
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		out = append(out, d)
	}
	return out
}

// TestDescriptors sends the descriptors Envoy builds from envoy.yaml to an
// edge serving ratelimit/ with the rate limit service, and checks the
// limits README.md describes.
func TestDescriptors(t *testing.T) {
	c := load(t)
	rs, err := envoyconf.LoadPath("ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_010, 0) // 10 s into a minute, on the hour
	e := edgetest.Start(t, "rules: [{name: placeholder, limit: 1, window: 1s}]", edge.Options{Clock: fixedClock(now)})
	if err := e.Core.SetRules(rs); err != nil {
		t.Fatal(err)
	}
	rls, err := rls.New(e.Core, rls.Config{}, edgetest.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rls.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rls.Stop(ctx)
		<-done
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlspb.NewRateLimitServiceClient(conn)
	ask := func(req request) *rlspb.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: c.filter.GetDomain(), Descriptors: descriptors(t, c, req)})
		if err != nil {
			t.Fatalf("%s: %v", req.path, err)
		}
		return resp
	}
	remaining := func(resp *rlspb.RateLimitResponse) []uint32 {
		var out []uint32
		for _, s := range resp.Statuses {
			out = append(out, s.LimitRemaining)
		}
		return out
	}

	// Logins: the 6th in a minute from one IP is refused; another IP is not.
	for i := 1; i <= 5; i++ {
		resp := ask(request{path: "/login", ip: "198.51.100.7"})
		if resp.OverallCode != rlspb.RateLimitResponse_OK || !proto.Equal(resp.Statuses[0].CurrentLimit, &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlspb.RateLimitResponse_RateLimit_MINUTE}) {
			t.Fatalf("login %d: %v %v, want OK under 5 a minute", i, resp.OverallCode, resp.Statuses)
		}
	}
	resp := ask(request{path: "/login", ip: "198.51.100.7"})
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("login 6: %v, want OVER_LIMIT", resp.OverallCode)
	}
	if got := remaining(resp); len(got) != 2 || got[0] != 0 || got[1] != 600-6 {
		t.Errorf("login 6: remaining %v, want [0 594] (the per-IP limit counts logins too)", got)
	}
	if h := resp.ResponseHeadersToAdd; len(h) != 3 || h[2].Key != "Retry-After" || h[2].Value != "50" {
		t.Errorf("login 6: headers %v, want RateLimit-Policy, RateLimit and Retry-After: 50", h)
	}
	if resp := ask(request{path: "/login", ip: "198.51.100.8"}); resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("a login from another IP: %v, want OK", resp.OverallCode)
	}

	// The API: per key, 1000 an hour; the batch key is unlimited; without
	// a key only the per-IP limit applies.
	resp = ask(request{path: "/api/v1/x", ip: "203.0.113.5", headers: map[string]string{"x-api-key": "k-1"}})
	if got := remaining(resp); resp.OverallCode != rlspb.RateLimitResponse_OK || len(got) != 2 || got[0] != 999 || got[1] != 599 {
		t.Errorf("an API call with a key: %v remaining %v, want OK [999 599]", resp.OverallCode, got)
	}
	resp = ask(request{path: "/api/v1/x", ip: "203.0.113.5", headers: map[string]string{"x-api-key": "internal-batch"}})
	if got := remaining(resp); len(got) != 2 || got[0] != 1<<32-1 || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("the batch key: remaining %v, current_limit %v; want unlimited", got, resp.Statuses[0].CurrentLimit)
	}
	resp = ask(request{path: "/api/v1/x", ip: "203.0.113.5"})
	if got := remaining(resp); len(got) != 1 || got[0] != 597 {
		t.Errorf("an API call without a key: remaining %v, want the per-IP limit alone [597]", got)
	}
	// Anything else: per IP.
	if got := remaining(ask(request{path: "/", ip: "203.0.113.5"})); len(got) != 1 || got[0] != 596 {
		t.Errorf("/: remaining %v, want [596]", got)
	}
}

// fixedClock is a clock stopped at one instant: the edge's, and so its
// rate limit service's.
type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }
