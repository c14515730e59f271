package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec RLS wraps
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/reflection"

	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/internal/certfile"
	"github.com/poplimit/poplimit/rules/envoyconf"
)

// Service is Envoy's rate limit service (envoy.service.ratelimit.v3.
// RateLimitService/ShouldRateLimit) over the decision core, answering as
// envoyproxy/ratelimit answers (rules/envoyconf/SERVICE.md) from the
// descriptor index of the rules in force (envoyconf.DescriptorsOf), so
// that it replaces ratelimit with ratelimit's own files. It serves the
// standard health service beside it, and the reflection service when
// configured. Its methods are safe for concurrent use.
//
// Each descriptor is decided by the core under its rule
// (decision.Core.DecideKey, with the descriptor's own limit when it
// overrides the rule's), the counter key being ratelimit's
// (domain_k1_v1_k2_v2_), except one whose hits exceed what its limit
// admits in one call (admitsAtMost): it is answered OVER_LIMIT and counts
// nothing, so that no single call can refuse the other callers of a
// shared descriptor. A request reads one rules generation and decides
// every descriptor under it, so a reload never splits a request. A
// response and everything it points to come from a pool and return to it
// once the gRPC server has marshaled them: ShouldRateLimit allocates
// nothing of its own.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer

	cfg    Config
	core   *decision.Core
	log    *slog.Logger
	m      *rlsMetrics
	srv    *grpc.Server
	health *health.Server
	pool   sync.Pool      // *rlsScratch
	certs  *certfile.Pair // Config.TLSCert's; nil without

	mu      sync.Mutex // guards started and stopped
	started bool
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup // the health watcher
}

// New returns the rate limit service over core. It does not listen:
// call Serve. log nil is slog.Default(); reg nil registers no metrics.
func New(core *decision.Core, cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if core == nil {
		return nil, errors.New("rls: New: no Core")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Service{cfg: cfg, core: core, log: log, stop: make(chan struct{}), health: health.NewServer()}
	s.pool.New = func() any { return new(rlsScratch) }
	var err error
	if s.m, err = newRLSMetrics(reg); err != nil {
		return nil, err
	}
	opts := []grpc.ServerOption{grpc.ForceServerCodecV2(rlsCodec{base: encoding.GetCodecV2("proto"), rls: s})}
	switch {
	case cfg.TLSCert != "":
		if s.certs, err = certfile.Load(cfg.TLSCert, cfg.TLSKey, certfile.Options{Logger: log, Prefix: "rls", Reloads: s.m.tlsReloads}); err != nil {
			return nil, fmt.Errorf("rls: Config.TLSCert, TLSKey (-rls-tls-cert, -rls-tls-key): %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.certs.ServerConfig(cfg.TLS))))
	case cfg.TLS != nil:
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.MaxConnectionAge > 0 || cfg.MaxConnectionAgeGrace > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: cfg.MaxConnectionAge, MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace}))
	}
	s.srv = grpc.NewServer(opts...)
	rlspb.RegisterRateLimitServiceServer(s.srv, s)
	healthpb.RegisterHealthServer(s.srv, s.health)
	if cfg.Reflection {
		reflection.Register(s.srv)
	}
	s.setHealth(s.ready())
	return s, nil
}

// TLSPair is the certificate and key of Config.TLSCert, which the edge
// watches for changes; nil without.
func (s *Service) TLSPair() *certfile.Pair { return s.certs }

// Serve serves the service on ln until Stop; it returns nil after Stop.
// It may be called for several listeners.
func (s *Service) Serve(ln net.Listener) error {
	s.mu.Lock()
	if !s.started && !s.stopped {
		s.started = true
		s.wg.Add(1)
		go s.watchHealth()
	}
	s.mu.Unlock()
	if err := s.srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("rls: serve %s: %w", ln.Addr(), err)
	}
	return nil
}

// Stop says NOT_SERVING on the health service, stops accepting, and waits
// for the calls in flight to finish within ctx; past ctx it closes every
// connection and returns ctx's error. It is safe to call more than once.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.health.Shutdown()
	done := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.srv.Stop()
		<-done
		err = fmt.Errorf("rls: stop: %w", ctx.Err())
	}
	s.wg.Wait()
	return err
}

// ready is the health service's answer: the edge is ready and the rules in
// force have a descriptor index.
func (s *Service) ready() bool {
	return s.cfg.Ready() && envoyconf.DescriptorsOf(s.core.Rules()) != nil
}

func (s *Service) setHealth(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, st)
}

// watchHealth asks Ready every HealthInterval until Stop.
func (s *Service) watchHealth() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	last := s.ready()
	s.setHealth(last)
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if ok := s.ready(); ok != last {
				last = ok
				s.setHealth(ok)
			}
		}
	}
}

// release returns a response ShouldRateLimit made, and its working space,
// to the pool; resp must not be used after.
func (s *Service) release(resp *rlspb.RateLimitResponse) {
	sc := (*rlsScratch)(unsafe.Pointer(resp)) // resp is sc.resp, its first field
	sc.resp.Statuses, sc.resp.ResponseHeadersToAdd = nil, nil
	s.pool.Put(sc)
}

// rlsCodec is gRPC's proto codec that, once it has marshaled a response of
// ShouldRateLimit, hands it back to the pool: the server reads a reply
// only to marshal it, unless RPC tracing (grpc.EnableTracing) logs it, in
// which case nothing is recycled. The RLS's server has no stats handler,
// the only other reader.
type rlsCodec struct {
	base encoding.CodecV2
	rls  *Service
}

func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := c.base.Marshal(v)
	if r, ok := v.(*rlspb.RateLimitResponse); ok && !grpc.EnableTracing {
		c.rls.release(r)
	}
	return out, err
}

func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }
func (c rlsCodec) Name() string                                { return c.base.Name() }
