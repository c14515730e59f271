package redisstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
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
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := testCerts(t)
	files := map[string][]byte{"ca.pem": caPEM, "cert.pem": certPEM, "key.pem": keyPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := testenv.LookBinary(t, "redis-server", "redis-server")
	port := testenv.FreePort(t)
	args := append(redisArgs(0, dir), "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no")
	p := &testenv.Proc{Name: bin, Args: args, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	if err := p.Start(); err != nil {
		t.Skipf("redis-server with TLS: %v", err)
	}
	t.Cleanup(p.Kill)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)

	s, _ := newStore(t, Config{Addrs: []string{p.Addr}, TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
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

// testCerts returns a CA certificate and a server certificate and key for
// 127.0.0.1 signed by it, PEM-encoded.
func testCerts(t *testing.T) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "poplimit test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}
