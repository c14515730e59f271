package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/rls/xds"
)

// The body and connection limits have their flags, whose defaults are
// the Config's.
func TestLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		body, perClient int
	}{
		{nil, httpedge.DefaultMaxDecisionBody, 1024},
		{[]string{"-max-decision-body-bytes", "4096", "-max-conns-per-client", "-1"}, 4096, -1},
		{[]string{"-max-conns-per-client", "64"}, httpedge.DefaultMaxDecisionBody, 64},
	} {
		o, _, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if o.Server.MaxDecisionBody != tc.body || o.Server.MaxConnsPerClient != tc.perClient {
			t.Errorf("%q: MaxDecisionBody %d MaxConnsPerClient %d, want %d and %d", tc.args, o.Server.MaxDecisionBody, o.Server.MaxConnsPerClient, tc.body, tc.perClient)
		}
	}
}

// -redis-mode sentinel takes -redis as the sentinels and names the
// master set with -redis-sentinel-master.
func TestRedisSentinelFlags(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := parseFlags([]string{"-redis", "127.0.0.1:26379,127.0.0.1:26380", "-redis-mode", "sentinel",
		"-redis-sentinel-master", "mymaster", "-redis-sentinel-user", "watcher", "-redis-sentinel-password-file", pw}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := o.Redis
	if r.Mode != redisstore.TopologySentinel || r.SentinelMaster != "mymaster" || len(r.Addrs) != 2 ||
		r.SentinelUsername != "watcher" || r.SentinelPassword != "s3cret" {
		t.Errorf("Redis config %+v", r)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}
	o, _, err = parseFlags([]string{"-redis", "127.0.0.1:26379", "-redis-mode", "sentinel"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Redis.Validate(); err == nil || !strings.Contains(err.Error(), "SentinelMaster: empty") {
		t.Errorf("sentinel mode without a master: %v, want SentinelMaster named", err)
	}
}

// The -rls-xds flags fill edge.Options.XDS; the node id defaults to
// envoyproxy/ratelimit's "default".
func TestRLSXDSFlags(t *testing.T) {
	o, _, err := parseFlags([]string{"-rls-xds", "127.0.0.1:18000", "-rls-xds-node-metadata", "zone=a,role=rls",
		"-rls-xds-force-start", "-rls-xds-tls-server-name", "xds.internal"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	x := o.XDS
	if x.Server != "127.0.0.1:18000" || x.NodeID != xds.DefaultNodeID || x.NodeMetadata["zone"] != "a" || x.NodeMetadata["role"] != "rls" ||
		!x.ForceStart || x.ServerName != "xds.internal" {
		t.Errorf("XDS %+v", x)
	}
	if _, _, err := parseFlags([]string{"-rls-xds-node-metadata", "zone"}, io.Discard); err == nil || !strings.Contains(err.Error(), `"zone": want key=value`) {
		t.Errorf("metadata without '=': %v", err)
	}
}
