package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// TestSentinelAuth runs the Store against a master found through a
// sentinel that requires a password: the master's counts with the right
// one; without it, or with a wrong one, the Store stays unconnected and
// its ops fail with ErrUnavailable that names the cause. The master's own
// password is Password, the sentinel's SentinelPassword.
func TestSentinelAuth(t *testing.T) {
	master := startRedis(t, "--requirepass", "masterpw")
	_, mport, _ := net.SplitHostPort(master.Addr)
	bin := testenv.LookBinary(t, "redis-server", "redis-server")
	var sentinel *testenv.Proc
	for try := 0; try < 3 && sentinel == nil; try++ {
		port := testenv.FreePort(t)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nrequirepass sentinelpw\n"+
			"sentinel monitor m 127.0.0.1 %s 1\nsentinel auth-pass m masterpw\n", port, dir, mport)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		p := &testenv.Proc{Name: bin, Args: []string{conf, "--sentinel"}, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		if err := p.Start(); err == nil {
			t.Cleanup(p.Kill)
			sentinel = p
		} else if try == 2 {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, tt := range []struct {
		name       string
		sentinelPW string
		ok         bool
	}{
		{"right password", "sentinelpw", true},
		{"wrong password", "nope", false},
		{"no password", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStore(t, Config{Addrs: []string{sentinel.Addr}, Mode: TopologySentinel, SentinelMaster: "m",
				SentinelPassword: tt.sentinelPW, Password: "masterpw", ReconnectInterval: time.Hour})
			ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}}
			s.Do(ctx, ops)
			if tt.ok && ops[0].Err != nil {
				t.Fatalf("Do: got %v, want it to work", ops[0].Err)
			}
			if msg := ops[0].Err; !tt.ok && (!errors.Is(msg, ErrUnavailable) || !strings.Contains(msg.Error(), "connect: ") ||
				!strings.Contains(msg.Error(), "AUTH") && !strings.Contains(msg.Error(), "WRONGPASS") && !strings.Contains(msg.Error(), "NOAUTH")) {
				t.Fatalf("Do: got %v, want ErrUnavailable naming the authentication failure", ops[0].Err)
			}
		})
	}
	if got := cli(t, master.Addr, "-a", "masterpw", "--no-auth-warning", "get", fmtKey(1, 1)); got != "1" {
		t.Errorf("the master's counter: %q, want 1 (the one op that got through)", got)
	}
}

// TestSentinelTLS runs the Store against sentinels, a master and a replica
// that speak TLS alone, their certificates for 127.0.0.1 from a CA made
// here: with TLS trusting that CA (and SentinelTLS nil, the same) the
// Store finds the master through the sentinels and counts there; a CA
// that did not sign the sentinels' certificates, for the sentinels alone
// (SentinelTLS) or for all, or no TLS at all, leaves it unconnected,
// its ops failing with ErrUnavailable.
func TestSentinelTLS(t *testing.T) {
	set := testenv.SentinelsTLS(t, 5*time.Second, nil)
	other := &tls.Config{RootCAs: testenv.NewCA(t, "another CA").Pool(), MinVersion: tls.VersionTLS12}
	ctx := context.Background()
	for i, tt := range []struct {
		name          string
		tls, sentinel *tls.Config
		ok            bool
		want          string // in the error
	}{
		{"the CA for all", set.TLS.Config(), nil, true, ""},
		{"the CA for each", set.TLS.Config(), set.TLS.Config(), true, ""},
		{"another CA", other, nil, false, "certificate"},
		{"another CA for the sentinels", set.TLS.Config(), other, false, "certificate"},
		{"plaintext", nil, nil, false, "connect: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStore(t, Config{Addrs: set.SentinelAddrs(), Mode: TopologySentinel, SentinelMaster: set.Master,
				TLS: tt.tls, SentinelTLS: tt.sentinel, DialTimeout: 2 * time.Second, ReconnectInterval: time.Hour})
			ops := []store.Op{{Key: uint64(100 + i), Start: 1, Delta: 1, TTL: time.Minute}}
			s.Do(ctx, ops)
			if tt.ok {
				if ops[0].Err != nil {
					t.Fatalf("Do: got %v, want it to work", ops[0].Err)
				}
				if got := set.CLI(t, set.Primary.Addr, "get", fmtKey(uint64(100+i), 1)); got != "1" {
					t.Errorf("the master's counter: %q, want 1", got)
				}
				return
			}
			t.Logf("Do: %v", ops[0].Err)
			if err := ops[0].Err; !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Do: got %v, want ErrUnavailable naming %q", err, tt.want)
			}
		})
	}
}
