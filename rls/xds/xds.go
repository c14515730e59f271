package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/poplimit/poplimit/rules/envoyconf"
)

// ApplyFunc validates a configuration and, when it validates, puts it in
// force whole (atomically); the error says why it did not. files are
// envoyproxy/ratelimit files, name → YAML (Files); version is the
// response's version_info.
type ApplyFunc func(version string, files map[string][]byte) error

// maxErrorDetail bounds the error message a NACK carries.
const maxErrorDetail = 16 << 10

// Subscriber keeps one state-of-the-world subscription to a management
// server's rate limit configurations and applies each that it receives.
// Run runs it; the other methods are safe for concurrent use.
type Subscriber struct {
	cfg   Config
	creds credentials.TransportCredentials
	apply ApplyFunc
	log   *slog.Logger
	m     *metrics
	node  *corev3.Node

	applied     chan struct{} // closed once a configuration was applied
	appliedOnce sync.Once

	mu      sync.Mutex
	version string // version_info in force ("" before the first)
	stamp   string // envoyconf.StampOf of the files in force
	inForce bool   // a configuration was applied
}

// New returns a Subscriber for cfg that hands each configuration to
// apply, its metrics registered with reg unless reg is nil. It checks cfg
// (reading the TLS files) and connects nothing: Run does.
func New(cfg Config, apply ApplyFunc, logger *slog.Logger, reg prometheus.Registerer) (*Subscriber, error) {
	if apply == nil {
		return nil, errors.New("xds: New: nil ApplyFunc")
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.Default()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, apply: apply, log: logger, m: m, applied: make(chan struct{})}
	s.creds = insecure.NewCredentials()
	if tc != nil {
		s.creds = credentials.NewTLS(tc)
	}
	md := make(map[string]*structpb.Value, len(cfg.NodeMetadata))
	for k, v := range cfg.NodeMetadata {
		md[k] = structpb.NewStringValue(v)
	}
	s.node = &corev3.Node{Id: cfg.NodeID, Metadata: &structpb.Struct{Fields: md}, UserAgentName: "poplimit"}
	return s, nil
}

// Applied is closed once a configuration has been applied.
func (s *Subscriber) Applied() <-chan struct{} { return s.applied }

// Version is the version_info of the configuration in force, "" before
// the first.
func (s *Subscriber) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Run subscribes until ctx ends: it opens a stream to the server, asks for
// every RateLimitConfig (a wildcard subscription) with the node's id and
// metadata, applies each response that validates and ACKs it, NACKs one
// that does not with the error, and keeps what is in force. When the
// stream fails it waits (BackoffInitial, doubling up to BackoffMax, each
// wait jittered down by up to half; back to BackoffInitial after a stream
// that received a response) and opens another, asking again from the
// version in force. Nothing in force changes while the server is away.
func (s *Subscriber) Run(ctx context.Context) error {
	conn, err := grpc.NewClient(s.cfg.Server,
		grpc.WithTransportCredentials(s.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.cfg.MaxMessageBytes)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: s.cfg.BackoffInitial, Multiplier: 2, Jitter: 0.2, MaxDelay: s.cfg.BackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return fmt.Errorf("xds: %s: %w", s.cfg.Server, err)
	}
	defer conn.Close()
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	s.log.Info("xds: subscribing to rate limit configurations", "server", s.cfg.Server, "node_id", s.cfg.NodeID,
		"node_metadata", FormatMetadata(s.cfg.NodeMetadata), "tls", s.cfg.useTLS())
	wait := s.cfg.BackoffInitial
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		got, err := s.stream(ctx, client)
		s.m.connected.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		s.m.streamErrors.Inc()
		if got {
			wait = s.cfg.BackoffInitial
		}
		d := wait/2 + rand.N(wait/2+1)
		wait = min(2*wait, s.cfg.BackoffMax)
		s.log.Warn("xds: stream to the management server ended; the configuration in force stays", "server", s.cfg.Server,
			"err", err, "retry_in", d, "version", s.Version())
		t.Reset(d)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// stream runs one stream until it fails or ctx ends; got says whether it
// received a response.
func (s *Subscriber) stream(ctx context.Context, client discovery.AggregatedDiscoveryServiceClient) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	// The first request carries the node and the version in force, so a
	// server that still has it need not send it again.
	if err := st.Send(&discovery.DiscoveryRequest{Node: s.node, TypeUrl: TypeURL, VersionInfo: s.Version()}); err != nil {
		return false, err
	}
	s.m.connected.Set(1)
	var lastNACK string // version and stamp of the last response NACKed
	var lastErr error   // why
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		req := &discovery.DiscoveryRequest{Node: s.node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		files, stamp, err := decode(resp)
		if err != nil {
			stamp = "error: " + err.Error()
		}
		key := resp.GetVersionInfo() + "\x00" + stamp
		repeat := key == lastNACK
		switch {
		case repeat:
			// The server sent back what it was just told is bad (a
			// go-control-plane snapshot cache does): the same answer, after
			// a pause, so that the two do not loop at network speed.
			err = lastErr
			select {
			case <-ctx.Done():
				return got, ctx.Err()
			case <-time.After(RepeatNACKDelay):
			}
		case err == nil:
			err = s.take(resp.GetVersionInfo(), files, stamp)
		}
		if err == nil {
			req.VersionInfo = resp.GetVersionInfo()
			lastNACK, lastErr = "", nil
		} else {
			req.VersionInfo = s.Version()
			msg := err.Error()
			if len(msg) > maxErrorDetail {
				msg = strings.ToValidUTF8(msg[:maxErrorDetail], "") + "…"
			}
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: msg}
			if !repeat {
				lastNACK, lastErr = key, err
				s.m.rejected.Inc()
				s.log.Error("xds: configuration rejected (NACK); the configuration in force stays",
					"version", resp.GetVersionInfo(), "in_force", s.Version(), "err", err)
			}
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// decode returns the files of resp and their stamp (envoyconf.StampOf),
// or why it has none.
func decode(resp *discovery.DiscoveryResponse) (map[string][]byte, string, error) {
	if resp.GetTypeUrl() != TypeURL {
		return nil, "", fmt.Errorf("xds: response of type %q: want %q", resp.GetTypeUrl(), TypeURL)
	}
	files, err := Files(resp.GetResources())
	if err != nil {
		return nil, "", err
	}
	return files, envoyconf.StampOf(files), nil
}

// take applies files (of version, stamped stamp) unless they are the
// files in force; the error is why they were not applied.
func (s *Subscriber) take(version string, files map[string][]byte, stamp string) error {
	s.mu.Lock()
	same := s.inForce && stamp == s.stamp
	s.mu.Unlock()
	if !same {
		if err := s.apply(version, files); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.version, s.stamp, s.inForce = version, stamp, true
	s.mu.Unlock()
	s.m.setVersion(version)
	if !same {
		s.m.accepted.Inc()
		s.m.appliedAt.Set(float64(time.Now().UnixNano()) / 1e9)
		s.log.Info("xds: configuration applied (ACK)", "version", version, "files", len(files))
	}
	s.appliedOnce.Do(func() { close(s.applied) })
	return nil
}
