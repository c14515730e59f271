package certfile_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/internal/certfile"
	"github.com/poplimit/poplimit/internal/testenv"
)

func served(t *testing.T, p *certfile.Pair) string {
	t.Helper()
	c, err := p.GetCertificate(nil)
	if err != nil || c == nil || c.Leaf == nil {
		t.Fatalf("GetCertificate: %v, %v", c, err)
	}
	return c.Leaf.Subject.CommonName
}

// A changed pair is reloaded once; one that does not load keeps the
// running pair, is counted once, and is not tried again until a file
// changes; Reload tries it whatever the stamp.
func TestReloadIfChanged(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := testenv.WriteCert(t, dir, "a")
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads_total"}, []string{"result"})
	p, err := certfile.Load(certFile, keyFile, certfile.Options{Prefix: "test", Reloads: reloads})
	if err != nil {
		t.Fatal(err)
	}
	if tried, _ := p.ReloadIfChanged(); tried || served(t, p) != "a" {
		t.Fatalf("unchanged files: tried %v, serving %s", tried, served(t, p))
	}
	testenv.WriteCert(t, dir, "b")
	if tried, err := p.ReloadIfChanged(); !tried || err != nil || served(t, p) != "b" {
		t.Fatalf("changed files: tried %v, %v, serving %s; want b", tried, err, served(t, p))
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tried, err := p.ReloadIfChanged(); !tried || err == nil || !strings.Contains(err.Error(), keyFile) {
		t.Fatalf("a bad key: tried %v, error %v; want an error naming %s", tried, err, keyFile)
	}
	if tried, _ := p.ReloadIfChanged(); tried {
		t.Error("a rejected pair tried again though no file changed")
	}
	if err := p.Reload(); err == nil {
		t.Error("Reload of a bad key: want an error")
	}
	if served(t, p) != "b" {
		t.Errorf("after rejected pairs serving %s, want b", served(t, p))
	}
	if a, r := testutil.ToFloat64(reloads.WithLabelValues("applied")), testutil.ToFloat64(reloads.WithLabelValues("rejected")); a != 1 || r != 2 {
		t.Errorf("counted %v applied, %v rejected; want 1, 2", a, r)
	}
	if _, err := certfile.Load(certFile, filepath.Join(dir, "missing.pem"), certfile.Options{}); err == nil {
		t.Error("Load of a missing key: want an error")
	}
}

// ServerConfig keeps what its base says besides the certificates, raises
// the version floor to TLS 1.2 and, unless the base names suites, allows
// only ECDHE with AEAD ciphers.
func TestServerConfig(t *testing.T) {
	certFile, keyFile, _ := testenv.WriteCert(t, t.TempDir(), "a")
	p, err := certfile.Load(certFile, keyFile, certfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := p.ServerConfig(nil)
	if c.MinVersion != tls.VersionTLS12 || c.GetCertificate == nil || len(c.CipherSuites) != 6 {
		t.Errorf("ServerConfig(nil): min %x, %d suites", c.MinVersion, len(c.CipherSuites))
	}
	base := &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13, Certificates: make([]tls.Certificate, 1)}
	c = p.ServerConfig(base)
	if c.ClientAuth != tls.RequireAndVerifyClientCert || c.MinVersion != tls.VersionTLS13 || len(c.Certificates) != 0 || c == base {
		t.Errorf("ServerConfig(base): client auth %v, min %x, %d certificates", c.ClientAuth, c.MinVersion, len(c.Certificates))
	}
	if len(base.Certificates) != 1 {
		t.Error("ServerConfig changed its base")
	}
}
