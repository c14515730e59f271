package rls_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/rules/envoyconf"
	"github.com/poplimit/poplimit/shardproxy"
)

// TestRLSReload checks that a reload that changes a limit applies to the
// next request, on the counters of the rule it keeps (same name, window
// and algorithm: the same counter identity).
func TestRLSReload(t *testing.T) {
	dir := t.TempDir()
	load := func(rpu int) *rules.Rules {
		t.Helper()
		text := fmt.Sprintf("domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		rs, err := envoyconf.LoadPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	e := edgetest.Start(t, placeholderRules, edge.Options{Clock: newClock(rlsBase)})
	if err := e.Core.SetRules(load(5)); err != nil {
		t.Fatal(err)
	}
	h := serveRLS(t, e, rls.Config{})
	checkResp(t, "3 of 5", h.ask(t, "r", 3, desc("k", "a")), ok, st{code: ok, rpu: 5, unit: minute, remaining: 2, reset: 50})
	if err := e.Core.SetRules(load(10)); err != nil {
		t.Fatal(err)
	}
	checkResp(t, "after the reload to 10", h.ask(t, "r", 0, desc("k", "a")), ok, st{code: ok, rpu: 10, unit: minute, remaining: 6, reset: 50})
	if err := e.Core.SetRules(load(4)); err != nil {
		t.Fatal(err)
	}
	checkResp(t, "after the reload to 4", h.ask(t, "r", 0, desc("k", "a")), over, st{code: over, rpu: 4, unit: minute, reset: 50})
}

// TestRLSHealth checks the health service: SERVING while the edge is
// ready with envoyproxy/ratelimit rules, NOT_SERVING otherwise.
func TestRLSHealth(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	hs := startRLS(t, fixtures(t, "readme/ex1.yaml"), rls.Config{Ready: ready.Load, HealthInterval: 10 * time.Millisecond}, edge.Options{})
	hc := healthpb.NewHealthClient(hs.conn)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: rlspb.RateLimitService_ServiceDesc.ServiceName})
			cancel()
			if err == nil && r.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health = %v, %v; want %v within 5 s", r, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	check(healthpb.HealthCheckResponse_SERVING)
	ready.Store(false)
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	ready.Store(true)
	check(healthpb.HealthCheckResponse_SERVING)
	plain, err := rules.ParseRules([]byte(placeholderRules))
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.e.Core.SetRules(plain); err != nil {
		t.Fatal(err)
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
}

// TestRLSReflection checks that reflection is off unless configured.
func TestRLSReflection(t *testing.T) {
	list := func(h *rlsHarness) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return nil, err // io.EOF: the stream ended, Recv tells why
		}
		r, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range r.GetListServicesResponse().GetService() {
			out = append(out, s.Name)
		}
		return out, nil
	}
	files := fixtures(t, "readme/ex1.yaml")
	if _, err := list(startRLS(t, files, rls.Config{}, edge.Options{})); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection by default: %v, want Unimplemented", err)
	}
	got, err := list(startRLS(t, files, rls.Config{Reflection: true}, edge.Options{}))
	if err != nil || !strings.Contains(strings.Join(got, ","), rlspb.RateLimitService_ServiceDesc.ServiceName) {
		t.Errorf("reflection on: services %v, %v; want the rate limit service listed", got, err)
	}
}

// TestRLSTwoEdgesShareMemcached runs one Envoy fleet (two clients, one per
// edge) against two poplimit edges that share real memcached shards: the
// limit holds across both, exactly, as ratelimit's redis would hold it.
func TestRLSTwoEdgesShareMemcached(t *testing.T) {
	_, addrs := testenv.Shards(t, 2)
	var o edge.Options
	for _, a := range addrs {
		o.Memcache.Servers = append(o.Memcache.Servers, shardproxy.Server{Addr: a})
	}
	o.Limiter.StoreTimeout = time.Second
	files := fixtures(t, "readme/ex2.yaml")
	o.Clock = newClock(rlsBase) // both edges on one clock
	a := startRLS(t, files, rls.Config{}, o)
	b := startRLS(t, files, rls.Config{}, o)
	for i := 0; i < 30; i++ {
		h := a
		if i%2 == 1 {
			h = b
		}
		resp := h.ask(t, "messaging", 0, desc("to_number", "5550100"))
		checkResp(t, fmt.Sprintf("request %d", i+1), resp, ok, st{code: ok, rpu: 100, unit: day, remaining: uint32(99 - i), reset: 57590})
	}
	// 100 a day: the 30 requests above are all within; now fill it up.
	resp := a.ask(t, "messaging", 69, desc("to_number", "5550100"))
	checkResp(t, "edge a: the 99th and 100th hits", resp, ok, st{code: ok, rpu: 100, unit: day, remaining: 1, reset: 57590})
	resp = b.ask(t, "messaging", 0, desc("to_number", "5550100"))
	checkResp(t, "edge b: the 100th", resp, ok, st{code: ok, rpu: 100, unit: day, remaining: 0, reset: 57590})
	for _, h := range []*rlsHarness{a, b} {
		checkResp(t, "either edge, the 101st", h.ask(t, "messaging", 0, desc("to_number", "5550100")), over, st{code: over, rpu: 100, unit: day, reset: 57590})
	}
	// The marketing limit, 5 a day, alternating edges: exactly 5.
	allowed := 0
	for i := 0; i < 12; i++ {
		h := a
		if i%2 == 1 {
			h = b
		}
		if h.ask(t, "messaging", 0, desc("message_type", "marketing", "to_number", "5550199")).OverallCode == ok {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("two edges allowed %d marketing messages under 5 a day, want 5", allowed)
	}
}

// TestRLSConcurrent has several Envoy workers call at once, each with its
// own descriptor: every answer must be its own (responses are pooled and
// recycled by the server's codec), and each limit must hold exactly.
func TestRLSConcurrent(t *testing.T) {
	h := startRLS(t, inline(`domain: c
descriptors:
  - key: worker
    rate_limit: {unit: hour, requests_per_unit: 150}
`), rls.Config{}, edge.Options{})
	const workers, calls = 8, 200
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			id := fmt.Sprint("w", w)
			for i := 1; i <= calls; i++ {
				resp, err := h.try("c", 0, desc("worker", id))
				if err != nil {
					errs <- err
					return
				}
				s := resp.Statuses[0]
				wantRem, wantCode := uint32(max(150-i, 0)), ok
				if i > 150 {
					wantCode = over
				}
				if len(resp.Statuses) != 1 || s.Code != wantCode || s.LimitRemaining != wantRem || resp.OverallCode != wantCode {
					errs <- fmt.Errorf("%s call %d: %v remaining %d (overall %v), want %v remaining %d", id, i, s.Code, s.LimitRemaining, resp.OverallCode, wantCode, wantRem)
					return
				}
				if got, want := resp.ResponseHeadersToAdd[1].Value, fmt.Sprintf(`"c.worker";r=%d;t=3590`, wantRem); got != want {
					errs <- fmt.Errorf("%s call %d: RateLimit %q, want %q", id, i, got, want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestRLSStopIsGraceful checks that Stop lets a call in flight finish and
// refuses new ones.
func TestRLSStopIsGraceful(t *testing.T) {
	e := edgetest.Start(t, placeholderRules, edge.Options{})
	if err := e.Core.SetRules(envoyRules(t, fixtures(t, "readme/ex1.yaml"))); err != nil {
		t.Fatal(err)
	}
	h := serveRLS(t, e, rls.Config{})
	h.ask(t, "mongo_cps", 0, desc("database", "users"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.rls.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := h.try("mongo_cps", 0, desc("database", "users")); err == nil {
		t.Error("a call after Stop succeeded, want an error")
	}
	if err := h.rls.Stop(ctx); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// TestRLSThroughBuild: the service as cmd/edge builds it, from
// envoyproxy/ratelimit files in a -rules directory, with -rls-listen; a
// file changed in the directory is reloaded and its new limit applies.
func TestRLSThroughBuild(t *testing.T) {
	dir := t.TempDir()
	write := func(limit int) {
		cfg := fmt.Sprintf("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", limit)
		os.WriteFile(filepath.Join(dir, "shop.yaml.new"), []byte(cfg), 0o644)
		os.Rename(filepath.Join(dir, "shop.yaml.new"), filepath.Join(dir, "shop.yaml"))
	}
	write(2)
	o := edge.Options{RLSListen: "127.0.0.1:0"}
	o.RulesFile, o.ReloadPoll = dir, 20*time.Millisecond
	e := edgetest.Start(t, "", o)
	conn, err := grpc.NewClient(e.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	ask := func(user string) rlspb.RateLimitResponse_Code {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", user)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		if got := ask("alice"); got != want {
			t.Fatalf("alice, request %d: %v, want %v", i+1, got, want)
		}
	}
	write(5)
	testenv.WaitFor(t, 5*time.Second, "the new limit applied", func() bool { return e.Rules().Rules[0].Limit == 5 && ask("bob") == rlspb.RateLimitResponse_OK })
	if got := ask("alice"); got != rlspb.RateLimitResponse_OK {
		t.Errorf("alice under the raised limit: %v, want OK", got)
	}
}
