// Package xdstest runs go-control-plane's own xDS management server (its
// pkg/server/v3 over a pkg/cache/v3 snapshot cache) in-process on a
// loopback port, for tests of xDS subscribers: it serves the aggregated
// discovery service as envoyproxy/ratelimit's own tests do, and records
// every request it receives (nodes, ACKs, NACKs with their detail).
package xdstest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Server is one management server. Its methods are safe for concurrent
// use.
type Server struct {
	Addr  string // host:port it listens on
	Cache cachev3.SnapshotCache

	grpc *grpc.Server
	done chan struct{}

	mu   sync.Mutex
	reqs []*discovery.DiscoveryRequest
}

// Start starts a server on addr ("127.0.0.1:0" picks a port; a stopped
// server's Addr starts one there again) with a new snapshot cache and the
// gRPC options opts (such as TLS credentials); it is stopped at the test's
// cleanup.
func Start(t testing.TB, addr string, opts ...grpc.ServerOption) *Server {
	t.Helper()
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ { // a port just closed may take a moment to take again
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), Cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), done: make(chan struct{})}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		s.mu.Lock()
		s.reqs = append(s.reqs, proto.Clone(r).(*discovery.DiscoveryRequest))
		s.mu.Unlock()
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, s.Cache, cb)
	s.grpc = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, srv)
	go func() { defer close(s.done); s.grpc.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); cancel() })
	return s
}

// Stop stops the server at once, closing its streams, and waits for it.
func (s *Server) Stop() {
	s.grpc.Stop()
	<-s.done
}

// Push makes version of configs the snapshot of node.
func (s *Server) Push(t testing.TB, node, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Requests returns the requests received so far.
func (s *Server) Requests() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.reqs...)
}

// NACKs returns the requests that carried an error detail.
func (s *Server) NACKs() []*discovery.DiscoveryRequest {
	var out []*discovery.DiscoveryRequest
	for _, r := range s.Requests() {
		if r.GetErrorDetail() != nil {
			out = append(out, r)
		}
	}
	return out
}

// Nodes returns the nodes the requests named (the first request of each
// stream names it).
func (s *Server) Nodes() []*corev3.Node {
	var out []*corev3.Node
	for _, r := range s.Requests() {
		if r.GetNode() != nil {
			out = append(out, r.GetNode())
		}
	}
	return out
}

// Limit is a descriptor of key and value with a limit of n per unit.
func Limit(key, value string, n uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitDescriptor {
	return &rlsconf.RateLimitDescriptor{Key: key, Value: value,
		RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: n, Unit: unit}}
}

// Config is a RateLimitConfig named name of domain with descriptors.
func Config(name, domain string, descriptors ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: descriptors}
}
