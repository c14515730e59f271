package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/poplimit/poplimit/internal/testenv"
)

// countsInRedis says whether the edge counts in Redis: a limit of one a
// minute refuses the second call (with Redis unreachable, the failure
// policy admits both).
func countsInRedis(t *testing.T, e *envoyEdge, c rlspb.RateLimitServiceClient) bool {
	t.Helper()
	awayFromEdge(time.Minute)
	var last rlspb.RateLimitResponse_Code
	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.ShouldRateLimit(ctx, request("echo-ratelimit", 1, []string{"PATH", "/"}))
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v\n%s", err, e.out.String())
		}
		last = resp.OverallCode
	}
	return last == rlspb.RateLimitResponse_OVER_LIMIT
}

// REDIS_TLS with its CA and client certificate talks to a Redis that
// requires both; REDIS_TLS_SKIP_HOSTNAME_VERIFICATION to one whose
// certificate names another host. GRPC_SERVER_USE_TLS with a client CA and
// SAN serves the rate limit service to clients that present a certificate
// naming the SAN, and to no other.
func TestEnvoyEnvTLS(t *testing.T) {
	ca := testenv.NewCA(t, "cmd/edge test CA")
	clientAuth := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	clientCert, clientKey := ca.Issue(t, "ratelimit", clientAuth, []string{"ratelimit.internal"})

	t.Run("redis", func(t *testing.T) {
		cert, key := ca.Issue(t, "redis", nil, nil, "127.0.0.1")
		rd := testenv.RedisTLS(t, &testenv.TLSFiles{CA: ca, Cert: cert, Key: key, ClientAuth: true})
		env := append(istioEnv(rd.Addr, root), loopbackPorts(t)...)
		env = append(env, "DEBUG_HOST=127.0.0.1", "REDIS_TLS=true", "REDIS_TLS_CACERT="+ca.File,
			"REDIS_TLS_CLIENT_CERT="+clientCert, "REDIS_TLS_CLIENT_KEY="+clientKey)
		e := startEnvoyEnv(t, env)
		if !countsInRedis(t, e, e.client) {
			t.Fatalf("REDIS_TLS with a client certificate: not counting in Redis\n%s", e.out.String())
		}
	})
	t.Run("redis, another host name", func(t *testing.T) {
		cert, key := ca.Issue(t, "redis-elsewhere", nil, []string{"redis.elsewhere"})
		rd := testenv.RedisTLS(t, &testenv.TLSFiles{CA: ca, Cert: cert, Key: key, ClientAuth: true})
		env := append(istioEnv(rd.Addr, root), loopbackPorts(t)...)
		env = append(env, "DEBUG_HOST=127.0.0.1", "REDIS_TLS=true", "REDIS_TLS_CACERT="+ca.File,
			"REDIS_TLS_CLIENT_CERT="+clientCert, "REDIS_TLS_CLIENT_KEY="+clientKey)
		strict := startEnvoyEnv(t, env)
		if countsInRedis(t, strict, strict.client) {
			t.Fatal("a certificate for redis.elsewhere accepted for 127.0.0.1 without REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
		}
		strict.stop()
		// New ports: the later value of a name wins, as in a process's
		// environment built by appending.
		env = append(append(env[:len(env):len(env)], "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"), loopbackPorts(t)...)
		e := startEnvoyEnv(t, env)
		if !countsInRedis(t, e, e.client) {
			t.Fatalf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: not counting in Redis\n%s", e.out.String())
		}
	})
	t.Run("grpc", func(t *testing.T) {
		rd := testenv.Redis(t)
		cert, key := ca.Issue(t, "rls", nil, nil, "127.0.0.1")
		envoyCert, envoyKey := ca.Issue(t, "envoy", clientAuth, []string{"envoy.internal"})
		otherCert, otherKey := ca.Issue(t, "other", clientAuth, []string{"other.internal"})
		env := append(istioEnv(rd.Addr, root), loopbackPorts(t)...)
		env = append(env, "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+cert,
			"GRPC_SERVER_TLS_KEY="+key, "GRPC_CLIENT_TLS_CACERT="+ca.File, "GRPC_CLIENT_TLS_SAN=envoy.internal")
		e := startEnvoyEnv(t, env)
		pool := ca.Pool()
		dial := func(opt grpc.DialOption) rlspb.RateLimitServiceClient {
			conn, err := grpc.NewClient(e.grpcAddr, opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			return rlspb.NewRateLimitServiceClient(conn)
		}
		withCert := func(c, k string) grpc.DialOption {
			pair, err := tls.LoadX509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}))
		}
		if !countsInRedis(t, e, dial(withCert(envoyCert, envoyKey))) {
			t.Fatal("mutual TLS with the client SAN: no answers counted")
		}
		for what, opt := range map[string]grpc.DialOption{
			"a certificate naming another SAN": withCert(otherCert, otherKey),
			"no certificate":                   grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})),
			"plaintext":                        grpc.WithTransportCredentials(insecure.NewCredentials()),
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := dial(opt).ShouldRateLimit(ctx, request("echo-ratelimit", 1, []string{"PATH", "/"}))
			cancel()
			if err == nil {
				t.Errorf("%s: answered, want refused", what)
			}
		}
	})
}
