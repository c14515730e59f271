package edge_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/httpedge"
	"github.com/poplimit/poplimit/internal/testenv"
)

// writeCert writes a self-signed certificate for 127.0.0.1 named cn, and
// its key, to dir; it returns the files and the certificate.
func writeCert(t *testing.T, dir, cn string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile+".new", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile+".new", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	os.Rename(certFile+".new", certFile) // each file replaced whole, as a deploy does
	os.Rename(keyFile+".new", keyFile)
	return certFile, keyFile, cert
}

func tlsClient(cert *x509.Certificate, maxVersion uint16) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: maxVersion}, DisableKeepAlives: true}}
}

// TestTLSListener serves the traffic listener over TLS, refuses TLS 1.1,
// swaps in a new certificate when the files change, and keeps the old one
// when the new files do not load.
func TestTLSListener(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, first := writeCert(t, dir, "first")
	e := startEdge(t, edgeOpts{rules: threePerMinute, cfg: httpedge.Config{TLSCert: certFile, TLSKey: keyFile}, reloadPoll: 20 * time.Millisecond})
	url := "https://" + e.addr + "/check/x"
	resp, err := tlsClient(first, 0).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "first" {
		t.Fatalf("over TLS: %d %v", resp.StatusCode, resp.TLS)
	}
	if _, err := tlsClient(first, tls.VersionTLS11).Get(url); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
	// A new pair is picked up by the watcher; the old connection's
	// clients keep working (no restart).
	_, _, second := writeCert(t, dir, "second")
	testenv.WaitFor(t, 5*time.Second, "the new certificate served", func() bool {
		resp, err := tlsClient(second, 0).Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName == "second"
	})
	// A broken pair is refused and counted; the running one stays.
	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	testenv.WaitFor(t, 5*time.Second, "the bad reload counted", func() bool {
		return testenv.MetricSum(t, e.reg, "poplimit_edge_tls_reloads_total", "result", "rejected") >= 1
	})
	resp, err = tlsClient(second, 0).Get("https://" + e.addr + "/check/y")
	if err != nil {
		t.Fatalf("after a bad reload: %v", err)
	}
	resp.Body.Close()
	if resp.TLS.PeerCertificates[0].Subject.CommonName != "second" {
		t.Errorf("after a bad reload the certificate is %q, want the running one", resp.TLS.PeerCertificates[0].Subject.CommonName)
	}
	if err := e.srv.ReloadTLS(); err == nil {
		t.Error("ReloadTLS of a bad key: want an error")
	}
}

func TestTLSConfigRejected(t *testing.T) {
	dir := t.TempDir()
	certFile, _, _ := writeCert(t, dir, "x")
	for _, cfg := range []httpedge.Config{{TLSCert: certFile}, {TLSCert: certFile, TLSKey: filepath.Join(dir, "missing.pem")}} {
		o := edge.Options{Server: cfg}
		if _, err := edge.Build(o); err == nil {
			t.Errorf("Build with %+v: want an error", cfg)
		}
	}
}
