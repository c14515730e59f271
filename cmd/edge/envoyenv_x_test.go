package main

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/rls/xds/xdstest"
)

// envoyproxy/ratelimit's Redis Sentinel environment (REDIS_TYPE=sentinel,
// REDIS_URL=master,sentinel,...) starts poplimit on the master the
// sentinels name, which counts there.
func TestEnvoyEnvSentinel(t *testing.T) {
	set := testenv.Sentinels(t, time.Second)
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	url := set.Master + "," + strings.Join(set.SentinelAddrs(), ",")
	env := append(istioEnv(url, root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1", "REDIS_TYPE=sentinel")
	e := startEnvoyEnv(t, env)
	if !countsInRedis(t, e, e.client) {
		t.Fatalf("REDIS_TYPE=sentinel: not counting on the master\n%s", e.out.String())
	}
	if got := testenv.RedisCLI(t, set.Primary.Addr, "dbsize"); strings.TrimSpace(got) == "0" {
		t.Errorf("the master holds no key: the counts went elsewhere")
	}
}

// The same over TLS (REDIS_TLS=true with REDIS_TLS_CACERT and a client
// certificate): the sentinels, the master and its replica speak TLS alone
// and require client certificates of the CA, which REDIS_TLS_CACERT names;
// the one TLS configuration reaches the sentinels and the master they
// name by IP address.
func TestEnvoyEnvSentinelTLS(t *testing.T) {
	x := testenv.NewTLSFiles(t)
	x.ClientAuth = true
	clientCert, clientKey := x.CA.Issue(t, "ratelimit", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, []string{"ratelimit.internal"})
	set := testenv.SentinelsTLS(t, time.Second, x)
	root := runtimeDir(t, map[string]string{"config.yaml": istioConfig})
	url := set.Master + "," + strings.Join(set.SentinelAddrs(), ",")
	env := append(istioEnv(url, root), loopbackPorts(t)...)
	env = append(env, "DEBUG_HOST=127.0.0.1", "REDIS_TYPE=sentinel", "REDIS_TLS=true", "REDIS_TLS_CACERT="+x.CA.File,
		"REDIS_TLS_CLIENT_CERT="+clientCert, "REDIS_TLS_CLIENT_KEY="+clientKey)
	e := startEnvoyEnv(t, env)
	if !countsInRedis(t, e, e.client) {
		t.Fatalf("REDIS_TYPE=sentinel, REDIS_TLS=true: not counting on the master\n%s", e.out.String())
	}
	if got := set.CLI(t, set.Primary.Addr, "dbsize"); got == "0" || strings.Contains(got, "rror") {
		t.Errorf("the master's DBSIZE: %q: the counts went elsewhere", got)
	}
}

// envoyproxy/ratelimit's xDS environment (CONFIG_TYPE=GRPC_XDS_SOTW, the
// server's URL, the node id and metadata, as its docker-compose example
// sets them) subscribes poplimit to go-control-plane's management server:
// the configuration pushed there is answered, the node named as the
// environment says.
func TestEnvoyEnvXDS(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Push(t, "test-node-id", "1", xdstest.Config("rl", "rl", xdstest.Limit("PATH", "/", 1, rlsconf.RateLimitUnit_MINUTE)))
	rd := testenv.Redis(t)
	env := append([]string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rd.Addr,
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=test-node-id", "CONFIG_GRPC_XDS_SERVER_URL=" + srv.Addr,
		"CONFIG_GRPC_XDS_NODE_METADATA=zone=a,rack:1", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1"}, loopbackPorts(t)...)
	e := startEnvoyEnv(t, env)
	awayFromEdge(time.Minute)
	const ok, over = rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT
	resp := e.ask(t, request("rl", 1, []string{"PATH", "/"}))
	wantResp(t, "first", resp, ok, status(ok, 1, rlspb.RateLimitResponse_RateLimit_MINUTE, 0, resp.Statuses[0]))
	resp = e.ask(t, request("rl", 1, []string{"PATH", "/"}))
	wantResp(t, "second", resp, over, status(over, 1, rlspb.RateLimitResponse_RateLimit_MINUTE, 0, resp.Statuses[0]))
	var node bool
	for _, n := range srv.Nodes() {
		node = node || n.GetId() == "test-node-id" && n.GetMetadata().GetFields()["zone"].GetStringValue() == "a" && len(n.GetMetadata().GetFields()) == 1
	}
	if !node {
		t.Errorf("nodes %v: want test-node-id with zone=a alone", srv.Nodes())
	}
}
