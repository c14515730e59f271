package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/store"
)

// TestAuth runs the Store against a server that requires a password and
// has an ACL user: the right credentials work, wrong ones leave the Store
// unconnected with ops failing with ErrUnavailable that names the cause.
func TestAuth(t *testing.T) {
	p := startRedis(t, "--requirepass", "s3cret")
	cli(t, p.Addr, "-a", "s3cret", "--no-auth-warning", "acl", "setuser", "edge", "on", ">edgepw", "~pl:*", "+@all")
	ctx := context.Background()
	tests := []struct {
		name     string
		user, pw string
		ok       bool
	}{
		{"default user", "", "s3cret", true},
		{"ACL user", "edge", "edgepw", true},
		{"wrong password", "", "nope", false},
		{"no password", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStore(t, Config{Addrs: []string{p.Addr}, Username: tt.user, Password: tt.pw, ReconnectInterval: time.Hour})
			ops := []store.Op{{Key: 1, Start: 1, Delta: 1, TTL: time.Minute}}
			s.Do(ctx, ops)
			if tt.ok && ops[0].Err != nil {
				t.Fatalf("Do: got %v, want it to work", ops[0].Err)
			}
			if msg := ops[0].Err; !tt.ok && (!errors.Is(msg, ErrUnavailable) || !strings.Contains(msg.Error(), "connect: ") ||
				!strings.Contains(msg.Error(), "AUTH") && !strings.Contains(msg.Error(), "WRONGPASS")) {
				t.Fatalf("Do: got %v, want ErrUnavailable naming the authentication failure", ops[0].Err)
			}
		})
	}
}

// TestTLS runs the Store against a server that speaks only TLS, with a
// certificate for 127.0.0.1 from a CA the test makes.
func TestTLS(t *testing.T) {
	x := testenv.NewTLSFiles(t)
	p := testenv.RedisTLS(t, x)
	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, TLS: x.Config()})
	ops := []store.Op{{Key: 1, Start: 1, Delta: 2, TTL: time.Minute}, {Key: 1, Start: 1}}
	s.Do(context.Background(), ops)
	if ops[0].Err != nil || ops[1].Value != 2 {
		t.Fatalf("Do over TLS: got %+v, want 2 and 2", ops)
	}
	plain, _ := newStore(t, Config{Addrs: []string{p.Addr}, DialTimeout: 300 * time.Millisecond, ReconnectInterval: time.Hour})
	plain.Do(context.Background(), ops[:1])
	if !errors.Is(ops[0].Err, ErrUnavailable) {
		t.Errorf("Do without TLS against a TLS port: got %v, want ErrUnavailable", ops[0].Err)
	}
}
